package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/devcluster"
	"github.com/partita-dev/partita/internal/envtestutil"
)

// The tenant's end-to-end tests (issue: no tenant can take GPUs, quota or a
// node that is not theirs): each plays an ordinary user of one namespace,
// through impersonation with no group but system:authenticated, who tries
// to reach another team's queue, a priority it was not given, or more GPUs
// than its queue holds; each asserts the refusal the user reads, then
// reads the cluster again as the admin to show nothing was stored, bound or
// charged.

// tenant is an ordinary user with edit rights in one namespace and the
// right to manage PodGroups there, as a platform team grants its teams.
type tenant struct {
	name string
	ns   string
	cs   kubernetes.Interface
	crs  client.Client
}

func newTenant(ctx context.Context, t *testing.T, ns string) *tenant {
	t.Helper()
	user := "e2e-tenant-" + ns
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "partita-gangs", Namespace: ns},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"podgroups"},
			Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}}},
	}
	if _, err := clientset.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create role: %v", err)
	}
	for name, ref := range map[string]rbacv1.RoleRef{
		"tenant-edit":  {APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "edit"},
		"tenant-gangs": {APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
	} {
		rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name}, RoleRef: ref,
			Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}}}
		if _, err := clientset.RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
			t.Fatalf("bind %s: %v", name, err)
		}
	}
	cfg, err := cluster.RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	cfg.Impersonate.UserName = user
	cfg.Impersonate.Groups = []string{"system:authenticated"}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	crs, err := client.New(cfg, client.Options{Scheme: envtestutil.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	tn := &tenant{name: user, ns: ns, cs: cs, crs: crs}
	// RBAC is cached by the API server's authorizer for a moment.
	poll(t, 30*time.Second, user+" may create PodGroups", func() (bool, string) {
		err := crs.Create(ctx, tn.podGroup("probe", "", 1), client.DryRunAll)
		return err == nil, fmt.Sprint(err)
	})
	return tn
}

func (tn *tenant) podGroup(name, queue string, minMember int32) *v1alpha1.PodGroup {
	return &v1alpha1.PodGroup{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: tn.ns},
		Spec: v1alpha1.PodGroupSpec{MinMember: minMember, Queue: queue}}
}

// member is a whole-GPU pod of pod group group, of queue q ("" for none),
// restricted to nodes with labels.
func member(ns, name, group, q string, labels map[string]string) *corev1.Pod {
	p := extGPUPod(ns, name, 1000, 1, labels)
	p.Labels[v1alpha1.LabelPodGroup] = group
	if q != "" {
		p.Labels[v1alpha1.LabelQueue] = q
	}
	return p
}

// wantRefused fails unless err is a refusal whose message holds every want.
func wantRefused(t *testing.T, what string, err error, want ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s was accepted, want it refused", what)
	}
	if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) {
		t.Fatalf("%s: %v, want a refusal (403 or 422)", what, err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Fatalf("%s refused with %q, want it to say %q", what, err, w)
		}
	}
}

// allocatedMilli is queue q's status.allocated GPU, in milli-GPUs.
func allocatedMilli(ctx context.Context, t *testing.T, q string) int64 {
	t.Helper()
	var got v1alpha1.Queue
	if err := crClient(t).Get(ctx, client.ObjectKey{Name: q}, &got); err != nil {
		t.Fatalf("get queue %s: %v", q, err)
	}
	v := got.Status.Allocated[v1alpha1.ResourceGPU]
	return v.MilliValue()
}

// TestTenantPodGroupCannotNameAnotherTeamsQueue: a namespace limited to a
// 1-GPU queue names another team's 8-GPU queue in its PodGroup, then in its
// gang's pods: both are refused, nothing is stored and nothing charged.
func TestTenantPodGroupCannotNameAnotherTeamsQueue(t *testing.T) {
	ctx := testContext(t, 3*time.Minute)
	ns, other := extNamespace(ctx, t, clientset), extNamespace(ctx, t, clientset)
	ensureGPUPriorityClass(ctx, t, clientset)
	mine, theirs := "mine-"+ns, "theirs-"+ns
	createQueue(ctx, t, gpuQueue(mine, ns, "0", "1", 1))
	createQueue(ctx, t, gpuQueue(theirs, other, "0", "8", 1))
	tn := newTenant(ctx, t, ns)

	err := tn.crs.Create(ctx, tn.podGroup("big", theirs, 3))
	wantRefused(t, "a PodGroup naming another team's queue", err,
		fmt.Sprintf("namespace %s may not submit to queue %q", ns, theirs))
	if err := crClient(t).Get(ctx, client.ObjectKey{Namespace: ns, Name: "big"}, &v1alpha1.PodGroup{}); !apierrors.IsNotFound(err) {
		t.Errorf("the refused PodGroup: %v, want NotFound", err)
	}

	// Without a queue on the PodGroup, the members bring theirs, and each
	// is asked about as a pod.
	if err := tn.crs.Create(ctx, tn.podGroup("big", "", 3)); err != nil {
		t.Fatalf("a PodGroup naming no queue: %v", err)
	}
	for i := range 3 {
		_, err := tn.cs.CoreV1().Pods(ns).Create(ctx, member(ns, fmt.Sprintf("big-%d", i), "big", theirs, gpuNodes), metav1.CreateOptions{})
		wantRefused(t, "a member naming another team's queue", err, fmt.Sprintf("namespace %s may not submit to queue %q", ns, theirs))
	}
	if pods := listNS(ctx, t, ns); len(pods) != 0 {
		t.Errorf("%d pods stored in %s, want none", len(pods), ns)
	}
	// Charged nothing, however long one waits for the admission loop.
	time.Sleep(3 * time.Second)
	if got := allocatedMilli(ctx, t, theirs); got != 0 {
		t.Errorf("queue %s allocated %d milli-GPUs, want 0", theirs, got)
	}
}

// TestTenantPodGroupNeedsAnExistingPriorityClass: a PodGroup naming a
// PriorityClass that does not exist is refused and not stored.
func TestTenantPodGroupNeedsAnExistingPriorityClass(t *testing.T) {
	ctx := testContext(t, 2*time.Minute)
	ns := extNamespace(ctx, t, clientset)
	ensureGPUPriorityClass(ctx, t, clientset)
	tn := newTenant(ctx, t, ns)
	missing := "no-such-class-" + ns
	pg := tn.podGroup("train", "", 2)
	pg.Spec.PriorityClassName = missing
	wantRefused(t, "a PodGroup naming a missing PriorityClass", tn.crs.Create(ctx, pg),
		fmt.Sprintf("PriorityClass %q does not exist", missing), "spec.priorityClassName")
	if err := crClient(t).Get(ctx, client.ObjectKeyFromObject(pg), &v1alpha1.PodGroup{}); !apierrors.IsNotFound(err) {
		t.Errorf("the refused PodGroup: %v, want NotFound", err)
	}
	pg = tn.podGroup("train", "", 2)
	pg.Spec.PriorityClassName = extGPUClass
	if err := tn.crs.Create(ctx, pg); err != nil {
		t.Errorf("a PodGroup naming an existing PriorityClass: %v", err)
	}
}

// TestTenantCannotMoveAnAdmittedGang: once its member is admitted, a
// gang's queue cannot change, even to another queue the tenant may use;
// the member's queue was written from its PodGroup when it was created.
func TestTenantCannotMoveAnAdmittedGang(t *testing.T) {
	ctx := testContext(t, 4*time.Minute)
	ns := extNamespace(ctx, t, clientset)
	ensureGPUPriorityClass(ctx, t, clientset)
	sel := map[string]string{"e2e.partita.dev/move": ns}
	addGPUNode(ctx, t, ns+"-mv-0", 1, sel)
	t.Cleanup(func() { deletePods(ctx, t, ns) })
	first, second := "first-"+ns, "second-"+ns
	createQueue(ctx, t, gpuQueue(first, ns, "0", "1", 1))
	createQueue(ctx, t, gpuQueue(second, ns, "0", "8", 1))
	tn := newTenant(ctx, t, ns)

	pg := tn.podGroup("train", first, 1)
	if err := tn.crs.Create(ctx, pg); err != nil {
		t.Fatalf("create PodGroup: %v", err)
	}
	var p *corev1.Pod
	poll(t, 30*time.Second, "the member created with its PodGroup's queue", func() (bool, string) {
		var err error
		p, err = tn.cs.CoreV1().Pods(ns).Create(ctx, member(ns, "train-0", "train", "", sel), metav1.CreateOptions{})
		return err == nil, fmt.Sprint(err)
	})
	if got := p.Labels[v1alpha1.LabelQueue]; got != first {
		t.Fatalf("the member's queue label is %q, want its PodGroup's %q", got, first)
	}
	poll(t, 60*time.Second, "the gang admitted and bound", func() (bool, string) {
		if err := crClient(t).Get(ctx, client.ObjectKeyFromObject(pg), pg); err != nil {
			return false, err.Error()
		}
		return pg.Status.Phase == v1alpha1.PodGroupRunning, fmt.Sprintf("%+v", pg.Status)
	})

	// The loop writes the PodGroup's status: an update that meets its
	// write is made again, until the webhook answers.
	err := retry.OnError(retry.DefaultRetry, apierrors.IsConflict, func() error {
		if err := tn.crs.Get(ctx, client.ObjectKeyFromObject(pg), pg); err != nil {
			return err
		}
		pg.Spec.Queue = second
		return tn.crs.Update(ctx, pg)
	})
	wantRefused(t, "moving an admitted gang to another queue", err,
		"is fixed once a member is admitted", fmt.Sprintf("was %q, now %q", first, second))
	var got v1alpha1.PodGroup
	if err := crClient(t).Get(ctx, client.ObjectKeyFromObject(pg), &got); err != nil {
		t.Fatal(err)
	}
	if got.Spec.Queue != first {
		t.Errorf("the PodGroup's queue is %q after the refused update, want %q", got.Spec.Queue, first)
	}
	poll(t, 30*time.Second, "the gang charged to its own queue only", func() (bool, string) {
		a, b := allocatedMilli(ctx, t, first), allocatedMilli(ctx, t, second)
		return a == 1000 && b == 0, fmt.Sprintf("%s %d, %s %d", first, a, second, b)
	})
}

// TestTenantMemberNamingAnotherQueueIsRefused: a gang member whose own
// queue disagrees with its PodGroup's is refused with both names, even when
// the tenant may use both queues.
func TestTenantMemberNamingAnotherQueueIsRefused(t *testing.T) {
	ctx := testContext(t, 2*time.Minute)
	ns := extNamespace(ctx, t, clientset)
	ensureGPUPriorityClass(ctx, t, clientset)
	small, large := "small-"+ns, "large-"+ns
	createQueue(ctx, t, gpuQueue(small, ns, "0", "1", 1))
	createQueue(ctx, t, gpuQueue(large, ns, "0", "8", 1))
	tn := newTenant(ctx, t, ns)
	if err := tn.crs.Create(ctx, tn.podGroup("train", small, 2)); err != nil {
		t.Fatalf("create PodGroup: %v", err)
	}
	p := member(ns, "train-0", "train", large, gpuNodes)
	want := fmt.Sprintf("the pod names queue %q but its PodGroup train names queue %q", large, small)
	// The webhook's PodGroup informer may lag the create by a moment; a
	// dry run shows when it has it.
	poll(t, 30*time.Second, "the webhook to know the PodGroup", func() (bool, string) {
		_, err := tn.cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil && strings.Contains(err.Error(), want), fmt.Sprint(err)
	})
	_, err := tn.cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
	wantRefused(t, "a member naming another queue than its PodGroup", err, want)
	if pods := listNS(ctx, t, ns); len(pods) != 0 {
		t.Errorf("%d pods stored, want none", len(pods))
	}
}

// TestQueuelessGPUPodIsReclaimedFromTheDefaultQueue: a GPU pod that names
// no queue does not jump the queues: it lands in the cluster's default
// queue (quota 0), and is reclaimed when a queue that deserves the room
// needs it. The owner queue deserves the whole cluster (quota -1) and asks
// for more than there is (a 64-GPU pod that fits nowhere), so the default
// queue's fair share is 0 and what it holds is borrowed.
func TestQueuelessGPUPodIsReclaimedFromTheDefaultQueue(t *testing.T) {
	ctx := testContext(t, 5*time.Minute)
	ns := extNamespace(ctx, t, clientset)
	ensureGPUPriorityClass(ctx, t, clientset)
	sel := map[string]string{"e2e.partita.dev/default-queue": ns}
	addGPUNode(ctx, t, ns+"-dq-0", 1, sel)
	t.Cleanup(func() { deletePods(ctx, t, ns) })
	var gns v1alpha1.GPUNodeList
	if err := crClient(t).List(ctx, &gns); err != nil {
		t.Fatal(err)
	}
	capacity := 0
	for _, n := range gns.Items {
		capacity += len(n.Status.Devices)
	}
	if capacity >= 64 {
		t.Skipf("the cluster has %d GPUs; the test's owner queue asks for 64 to outgrow it", capacity)
	}
	tn := newTenant(ctx, t, ns)

	stray, err := tn.cs.CoreV1().Pods(ns).Create(ctx, extGPUPod(ns, "stray", 1000, 1, sel), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create a queue-less GPU pod: %v", err)
	}
	if got := stray.Labels[v1alpha1.LabelQueue]; got != v1alpha1.DefaultQueueName {
		t.Fatalf("the queue-less pod's queue is %q, want the cluster's default %q", got, v1alpha1.DefaultQueueName)
	}
	waitPods(ctx, t, ns, 60*time.Second, "the stray pod bound", func(ps []corev1.Pod) (bool, string) {
		b, _ := countBound(ps)
		return b == 1, fmt.Sprintf("%d bound", b)
	})
	time.Sleep(devPreemptMinRuntime + time.Second)

	owner := "owner-" + ns
	createQueue(ctx, t, gpuQueue(owner, ns, "-1", "-1", 1))
	big := queuedPod(ns, "big", owner, map[string]string{"e2e.partita.dev/nowhere": "true"})
	big.Annotations[v1alpha1.AnnotationGPUCount] = "64"
	big.Spec.Containers[0].Resources.Requests[v1alpha1.ResourceGPUMilli] = *resourceMilli(64000)
	big.Spec.Containers[0].Resources.Limits[v1alpha1.ResourceGPUMilli] = *resourceMilli(64000)
	if _, err := tn.cs.CoreV1().Pods(ns).Create(ctx, big, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create the owner's demand: %v", err)
	}
	if _, err := tn.cs.CoreV1().Pods(ns).Create(ctx, queuedPod(ns, "owned", owner, sel), metav1.CreateOptions{}); err != nil {
		t.Fatalf("create the owner's pod: %v", err)
	}
	waitEvent(ctx, t, ns, "stray", v1alpha1.ReasonPreempted, "reclaimed for "+ns+"/owned")
	poll(t, 60*time.Second, "the owner's pod bound where the stray pod was", func() (bool, string) {
		state := map[string]string{}
		for _, p := range listNS(ctx, t, ns) {
			state[p.Name] = p.Spec.NodeName
		}
		_, strayLeft := state["stray"]
		return state["owned"] == ns+"-dq-0" && !strayLeft, fmt.Sprint(state)
	})
}

// TestMemorySliceIsChargedWhatItHolds: with an H200 in the cluster, a 20Gi
// slice counts 0.142 GPU in partita.dev/gpu-milli, but on a 23Gi L4 it
// holds 0.89 of the device. A queue limited to 1 GPU runs one such slice,
// not two, and its status says 0.89.
func TestMemorySliceIsChargedWhatItHolds(t *testing.T) {
	ctx := testContext(t, 4*time.Minute)
	ns := extNamespace(ctx, t, clientset)
	ensureGPUPriorityClass(ctx, t, clientset)
	l4 := map[string]string{"e2e.partita.dev/l4": ns}
	addGPUNodeOf(ctx, t, ns+"-l4", 2, "L4", l4)
	addGPUNodeOf(ctx, t, ns+"-h200", 1, "H200-141GB", map[string]string{"e2e.partita.dev/h200": ns})
	t.Cleanup(func() { deletePods(ctx, t, ns) })
	q := "slices-" + ns
	createQueue(ctx, t, gpuQueue(q, ns, "0", "1", 1))
	tn := newTenant(ctx, t, ns)
	slice := func(name string) *corev1.Pod {
		p := gpuPod(ns, name, map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi"}, map[string]string{v1alpha1.LabelQueue: q, extLabel: "true"})
		p.Spec.NodeSelector = l4
		p.Spec.PriorityClassName, p.Spec.PreemptionPolicy = extGPUClass, ptr.To(corev1.PreemptNever)
		return p
	}
	poll(t, 30*time.Second, "the webhook counting memory against the H200", func() (bool, string) {
		p, err := tn.cs.CoreV1().Pods(ns).Create(ctx, slice("probe"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			return false, err.Error()
		}
		got := p.Spec.Containers[0].Resources.Requests[v1alpha1.ResourceGPUMilli]
		return got.Value() == 142, "partita.dev/gpu-milli " + got.String()
	})

	if _, err := tn.cs.CoreV1().Pods(ns).Create(ctx, slice("slice-1"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPods(ctx, t, ns, 60*time.Second, "the first slice bound on the L4", func(ps []corev1.Pod) (bool, string) {
		return len(ps) == 1 && ps[0].Spec.NodeName == ns+"-l4", fmt.Sprintf("%d pods, node %q", len(ps), nodeOf(ps))
	})
	if _, err := tn.cs.CoreV1().Pods(ns).Create(ctx, slice("slice-2"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitEvent(ctx, t, ns, "slice-2", v1alpha1.ReasonWaitingForQuota, fmt.Sprintf("queue %s is at its limit: 0.89 of 1 GPUs", q))
	poll(t, 30*time.Second, "the queue's status showing what the slice holds", func() (bool, string) {
		var got v1alpha1.Queue
		if err := crClient(t).Get(ctx, client.ObjectKey{Name: q}, &got); err != nil {
			return false, err.Error()
		}
		alloc := got.Status.Allocated[v1alpha1.ResourceGPU]
		return alloc.MilliValue() == 890 && got.Status.PendingWorkloads == 1, fmt.Sprintf("%+v", got.Status)
	})
	for range 5 {
		p, err := clientset.CoreV1().Pods(ns).Get(ctx, "slice-2", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !gated(p) || p.Spec.NodeName != "" {
			t.Fatalf("the second slice was let go (gated %v, node %q): its queue would hold 1.78 GPUs\n%s",
				gated(p), p.Spec.NodeName, devcluster.DescribePods(ctx, clientset, ns, extLabel))
		}
		time.Sleep(time.Second)
	}
}

func nodeOf(ps []corev1.Pod) string {
	if len(ps) == 0 {
		return ""
	}
	return ps[0].Spec.NodeName
}

func resourceMilli(m int64) *resource.Quantity { return resource.NewQuantity(m, resource.DecimalSI) }
