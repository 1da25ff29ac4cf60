package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/chromedp/chromedp"
	"github.com/partita-dev/partita/api/v1alpha1"
)

// Time-based fair share (issue 29) on the dev cluster, with a short
// half-life so that history builds in seconds.
const (
	usageHalfLife = 15 * time.Second
	usageWindow   = 2 * time.Minute
)

// usageFlags turn time-based fair share on in the dev cluster's extender,
// as a user would: partita dev up --extender-flag=....
var usageFlags = []string{
	"--extender-flag=--fair-share-usage-weight=1",
	"--extender-flag=--fair-share-usage-half-life=" + usageHalfLife.String(),
	"--extender-flag=--fair-share-usage-window=" + usageWindow.String(),
}

// queueUsage reads a queue's status.usage; nil when it has none.
func queueUsage(ctx context.Context, t *testing.T, name string) *v1alpha1.QueueUsage {
	t.Helper()
	var q v1alpha1.Queue
	if err := crClient(t).Get(ctx, client.ObjectKey{Name: name}, &q); err != nil {
		t.Fatalf("get queue %s: %v", name, err)
	}
	return q.Status.Usage
}

func usageGPUHours(u *v1alpha1.QueueUsage) float64 {
	if u == nil {
		return 0
	}
	return u.Hours.Name(v1alpha1.ResourceGPU, "").AsApproximateFloat64()
}

// TestFairShareRemembersUsage: two sibling queues with equal quota (0)
// and weight under a parent whose parent is limited to 8 GPUs, on a node
// of 8. Queue a runs
// all 8 alone, then b asks for 8 too. With usage off they split evenly:
// reclaim stops at 4 and 4. With usage on, a's history (about 0.88 of what
// the parent could have given) leaves it a share weight of 0.12 against
// b's 1: b's fair share is 7, reclaim goes on to 7 and says that history
// decided. The leader is killed and restarted while a runs alone: its
// successor carries on from the usage in Queue status. Then a queue under
// a sibling of their parent asks too: the parent's usage (its children's)
// weighs against that sibling's, and reclaim gives the newcomer most of
// the GPUs.
func TestFairShareRemembersUsage(t *testing.T) {
	ctx := testContext(t, 9*time.Minute)
	ns := extNamespace(ctx, t, clientset)
	ensureGPUPriorityClass(ctx, t, clientset)
	sel := map[string]string{"e2e.partita.dev/usage": ns}
	// dev up removes simulated nodes it did not make unless type=e2e.
	addGPUNode(ctx, t, ns+"-us-0", 8, map[string]string{"e2e.partita.dev/usage": ns, "type": "e2e"})
	t.Cleanup(func() { deletePods(ctx, t, ns) })
	// dept (limit 8) → parent → a, b; dept → other → c.
	dept, parent, a, b := "usage-dept-"+ns, "usage-"+ns, "usage-a-"+ns, "usage-b-"+ns
	other, c := "usage-other-"+ns, "usage-c-"+ns
	createQueue(ctx, t, gpuQueue(dept, ns, "0", "8", 1))
	for _, q := range [][2]string{{parent, dept}, {other, dept}, {a, parent}, {b, parent}, {c, other}} {
		queue := gpuQueue(q[0], ns, "0", "-1", 1)
		queue.Spec.Parent = q[1]
		createQueue(ctx, t, queue)
	}

	// bound counts the pods of each queue bound now.
	bound := func() map[string]int {
		n := map[string]int{}
		for _, p := range listNS(ctx, t, ns) {
			if p.Spec.NodeName != "" && p.DeletionTimestamp == nil {
				n[p.Labels[v1alpha1.LabelQueue]]++
			}
		}
		return n
	}
	counts := func() (int, int) {
		n := bound()
		return n[a], n[b]
	}
	// asks creates 8 pods of queue q named ROUND-SHORT-i.
	asks := func(round, short, q string) {
		t.Helper()
		var pods []*corev1.Pod
		for i := range 8 {
			pods = append(pods, queuedPod(ns, fmt.Sprintf("%s-%s-%d", round, short, i), q, sel))
		}
		createPods(ctx, t, clientset, pods, 4)
	}
	// aAlone runs 8 pods of a and waits until they are bound.
	aAlone := func(round string) {
		t.Helper()
		asks(round, "a", a)
		poll(t, 90*time.Second, "a's 8 pods bound", func() (bool, string) {
			na, nb := counts()
			return na == 8, fmt.Sprintf("a %d, b %d bound", na, nb)
		})
	}
	bAsks := func(round string) { asks(round, "b", b) }

	// Usage off (the dev cluster's default): an even split.
	aAlone("off")
	time.Sleep(devPreemptMinRuntime)
	bAsks("off")
	poll(t, 90*time.Second, "reclaim to 4 and 4", func() (bool, string) {
		na, nb := counts()
		return na == 4 && nb == 4, fmt.Sprintf("a %d, b %d bound", na, nb)
	})
	time.Sleep(10 * time.Second)
	if na, nb := counts(); na != 4 || nb != 4 {
		t.Errorf("usage off: a %d and b %d bound 10s later, want 4 and 4", na, nb)
	}
	deletePods(ctx, t, ns)
	poll(t, 60*time.Second, "the round's pods gone", func() (bool, string) {
		n := len(listNS(ctx, t, ns))
		return n == 0, fmt.Sprintf("%d pods left", n)
	})

	// Usage on.
	out := devUp(ctx, t, usageFlags...)
	if !strings.Contains(out, "Restarting partita extender: its command line changed") {
		t.Errorf("dev up with --extender-flag did not restart the extender:\n%s", out)
	}
	t.Cleanup(func() { devUp(context.WithoutCancel(ctx), t) })
	t.Logf("dev up with usage on:\n%s", out)
	aAlone("on")
	ranAlone := time.Now()
	var before float64
	poll(t, 60*time.Second, "a's usage in its status", func() (bool, string) {
		u := queueUsage(ctx, t, a)
		before = usageGPUHours(u)
		return before > 0, fmt.Sprintf("status.usage %+v", u)
	})
	killed := time.Now()
	restartExtender(ctx, t, func() {}, usageFlags...)
	poll(t, 90*time.Second, "the new leader writing a's usage", func() (bool, string) {
		u := queueUsage(ctx, t, a)
		return u != nil && u.UpdateTime != nil && u.UpdateTime.After(killed) && usageGPUHours(u) >= before,
			fmt.Sprintf("status.usage %+v (before the restart: %v GPU-hours)", u, before)
	})
	// Three half-lives alone in all.
	time.Sleep(time.Until(ranAlone.Add(3 * usageHalfLife)))
	bAsks("on")
	poll(t, 90*time.Second, "reclaim past the even split, to b 7", func() (bool, string) {
		na, nb := counts()
		return nb >= 7 && na <= 1, fmt.Sprintf("a %d, b %d bound", na, nb)
	})
	// The evicted pods are gone; their events stay.
	evs, err := clientset.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "reason=" + v1alpha1.ReasonPreempted})
	if err != nil {
		t.Fatal(err)
	}
	want := "history decided: queue " + a + " used"
	var seen []string
	for _, e := range evs.Items {
		if strings.HasPrefix(e.InvolvedObject.Name, "on-a-") {
			seen = append(seen, e.Message)
		}
	}
	if !slices.ContainsFunc(seen, func(m string) bool { return strings.Contains(m, want) }) {
		t.Errorf("no reclaim event of the usage round says %q; they say %q", want, seen)
	}
	// What a user reads: kubectl partita queues shows the usage.
	out, err = partita(ctx, "ctl", "queues", "--kubeconfig", cluster.KubeconfigPath())
	if err != nil {
		t.Fatalf("partita ctl queues: %v\n%s", err, out)
	}
	t.Logf("partita ctl queues:\n%s", out)
	if !strings.Contains(out, "USAGE (GPU-H)") || !strings.Contains(out, "usage: sliding 2m window, half-life 15s") {
		t.Errorf("partita ctl queues shows no usage with usage on:\n%s", out)
	}
	// And the console's Queues page, in a real browser, shows the column
	// and the window.
	url := runConsole(t, "--kubeconfig", cluster.KubeconfigPath())
	br := startBrowser(t)
	// The URL's fragment hands the page its token; then to the queues.
	page(t, br, time.Minute, "open the console", chromedp.Navigate(url), chromedp.WaitVisible(chromedp.CSS(".node")))
	page(t, br, time.Minute, "open the queues", chromedp.Navigate(strings.SplitN(url, "#", 2)[0]+"queues"), chromedp.WaitVisible(chromedp.ID("queues")))
	waitFor(t, br, 30*time.Second, "queue a's usage cell on the console's Queues page",
		fmt.Sprintf(`document.querySelector('tr[data-queue=%s] td[data-field="usage"]') !== null`, jsString(a)))
	if got := eval[string](t, br, `(document.getElementById("usage-window") || {}).textContent || ""`); !strings.Contains(got, "sliding 2m window, half-life 15s") {
		t.Errorf("the console's Queues page says %q under the table, want the usage window", got)
	}
	// The parent's usage is its children's.
	pu, au := usageGPUHours(queueUsage(ctx, t, parent)), usageGPUHours(queueUsage(ctx, t, a))
	if pu < au || au <= 0 {
		t.Errorf("parent %s used %v GPU-hours, its child a %v: the parent's must include it", parent, pu, au)
	}

	// A parent's usage weighs its subtree against its siblings: parent's
	// subtree held all of dept's 8 GPUs throughout, other's nothing. When
	// c (under other) asks for 8, other's share of dept is nearly all of
	// it, and reclaim takes parent's children's pods for c.
	asks("on", "c", c)
	poll(t, 90*time.Second, "c (whose parent used nothing) reclaiming past an even split of dept", func() (bool, string) {
		n := bound()
		return n[c] >= 6, fmt.Sprintf("a %d, b %d, c %d bound", n[a], n[b], n[c])
	})
}
