package gpu_test

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
	pt "github.com/partita-dev/partita/internal/partitatest"
)

var reservedAt = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)

// reservedPod is an unbound, ungated whole-GPU pod as the admission loop
// leaves it: pinned to node with a reservation of devices until expires.
func reservedPod(name, node string, expires time.Time, devices ...int32) *corev1.Pod {
	pod := pt.MakePod(name, "ns").GPUCount(len(devices)).Obj()
	a := &gpu.PodAllocation{Namespace: "ns", Name: name, UID: pod.UID, Node: node,
		Containers: []gpu.ContainerAllocation{{Container: pt.DefaultContainer, Milli: gpu.MilliPerGPU}}}
	for _, d := range devices {
		a.Containers[0].DeviceUUIDs = append(a.Containers[0].DeviceUUIDs, pt.DeviceUUID(node, d))
	}
	s, err := gpu.FormatReservation(gpu.ReservationOf(a, "ns/train", expires))
	if err != nil {
		panic(err)
	}
	pod.Annotations[v1alpha1.AnnotationReservation] = s
	pod.Annotations[v1alpha1.AnnotationNode] = node
	return pod
}

func TestReservationRoundTrip(t *testing.T) {
	a := &gpu.PodAllocation{Namespace: "ns", Name: "p", UID: "u", Node: "n1", Containers: []gpu.ContainerAllocation{
		{Container: "main", DeviceUUIDs: []string{"GPU-a", "GPU-b"}, Milli: 250, MemoryMiB: 20480, SMPercent: 25},
		{Container: "side", DeviceUUIDs: []string{"GPU-c"}, Milli: 1000},
	}}
	r := gpu.ReservationOf(a, "ns/train", reservedAt)
	s, err := gpu.FormatReservation(r)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"workload":"ns/train","node":"n1","expires":"2026-12-01T10:00:00Z","containers":[` +
		`{"name":"main","devices":["GPU-a","GPU-b"],"milli":250,"memoryMiB":20480,"smPercent":25},` +
		`{"name":"side","devices":["GPU-c"],"milli":1000}]}`
	if s != want {
		t.Errorf("FormatReservation =\n%s\nwant\n%s", s, want)
	}
	got, err := gpu.ParseReservation(s)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(&r, got); diff != "" {
		t.Errorf("parsed back (-want,+got):\n%s", diff)
	}
	// Fields a newer writer adds are ignored, not refused.
	if _, err := gpu.ParseReservation(strings.Replace(s, `"node"`, `"future":{"x":1},"node"`, 1)); err != nil {
		t.Errorf("unknown field: %v", err)
	}
	if diff := cmp.Diff(a, got.Allocation("ns", "p", "u"), cmpIgnoreIndexes); diff != "" {
		t.Errorf("Allocation (-want,+got):\n%s", diff)
	}
}

func TestParseReservationRefuses(t *testing.T) {
	cases := map[string]string{
		"not JSON":             `node=n1`,
		"no node":              `{"expires":"2026-12-01T10:00:00Z","containers":[{"name":"main","devices":["GPU-a"],"milli":1000}]}`,
		"no expiry":            `{"node":"n1","containers":[{"name":"main","devices":["GPU-a"],"milli":1000}]}`,
		"no container":         `{"node":"n1","expires":"2026-12-01T10:00:00Z","containers":[]}`,
		"no device":            `{"node":"n1","expires":"2026-12-01T10:00:00Z","containers":[{"name":"main","devices":[],"milli":1000}]}`,
		"a device twice":       `{"node":"n1","expires":"2026-12-01T10:00:00Z","containers":[{"name":"main","devices":["GPU-a","GPU-a"],"milli":1000}]}`,
		"a container twice":    `{"node":"n1","expires":"2026-12-01T10:00:00Z","containers":[{"name":"m","devices":["GPU-a"],"milli":1000},{"name":"m","devices":["GPU-b"],"milli":1000}]}`,
		"more than a GPU":      `{"node":"n1","expires":"2026-12-01T10:00:00Z","containers":[{"name":"main","devices":["GPU-a"],"milli":1001}]}`,
		"nothing held":         `{"node":"n1","expires":"2026-12-01T10:00:00Z","containers":[{"name":"main","devices":["GPU-a"],"milli":0}]}`,
		"negative memory":      `{"node":"n1","expires":"2026-12-01T10:00:00Z","containers":[{"name":"main","devices":["GPU-a"],"milli":10,"memoryMiB":-1}]}`,
		"compute over 100%":    `{"node":"n1","expires":"2026-12-01T10:00:00Z","containers":[{"name":"main","devices":["GPU-a"],"milli":10,"smPercent":101}]}`,
		"bad expiry":           `{"node":"n1","expires":"tomorrow","containers":[{"name":"main","devices":["GPU-a"],"milli":1000}]}`,
		"far too long to read": `{"node":"` + strings.Repeat("n", 17<<10) + `"}`,
	}
	for name, s := range cases {
		t.Run(name, func(t *testing.T) {
			if r, err := gpu.ParseReservation(s); err == nil {
				t.Errorf("ParseReservation accepted %+v", r)
			}
		})
	}
}

// TestLedgerHoldsReservations: an unbound pod's reservation holds its
// devices in any ledger that sees the pod, against Fit, Choose and Assume
// for other pods, until the pod binds (its allocation takes over) or the
// reservation expires by the ledger's clock; Forget does not drop it.
func TestLedgerHoldsReservations(t *testing.T) {
	clk := testingclock.NewFakeClock(reservedAt)
	l := gpu.NewLedger(gpu.WithClock(clk))
	l.UpsertNode(h100s("n1", 2))
	member := reservedPod("m", "n1", reservedAt.Add(5*time.Minute), 0, 1)
	l.UpsertPod(member)

	other := parse(t, pt.MakePod("other", "ns").GPUCount(1).Obj())
	if err := l.Fit("n1", other); !gpu.IsInsufficient(err) {
		t.Errorf("Fit of another pod = %v, want insufficient: the reservation holds both GPUs", err)
	}
	held, ok := l.Allocation(member.UID)
	if !ok || held.Node != "n1" || len(held.Containers) != 1 || len(held.Containers[0].DeviceUUIDs) != 2 {
		t.Fatalf("Allocation(member) = %+v, %v; want both GPUs of n1", held, ok)
	}
	st := l.State()
	if len(st.Pods) != 1 || st.Pods[0].Assumed || st.Pods[0].ReservedUntil == nil || !st.Pods[0].ReservedUntil.Equal(reservedAt.Add(5*time.Minute)) {
		t.Errorf("State().Pods = %+v, want one reservation until 10:05", st.Pods)
	}
	l.Forget(member.UID)
	if _, ok := l.Allocation(member.UID); !ok {
		t.Error("Forget dropped a reservation the pod carries")
	}
	if n := l.ExpireReservations(); n != 0 {
		t.Errorf("ExpireReservations before the expiry dropped %d", n)
	}

	// Bound with its devices: the allocation annotations take over.
	a := held.Clone()
	b := bound(member, parse(t, member), a)
	l.UpsertPod(b)
	if st := l.State(); len(st.Pods) != 1 || st.Pods[0].ReservedUntil != nil {
		t.Errorf("after bind State().Pods = %+v, want the bound pod alone", st.Pods)
	}
	clk.Step(10 * time.Minute)
	if n := l.ExpireReservations(); n != 0 {
		t.Errorf("ExpireReservations dropped %d bound pods", n)
	}
	if errs := l.CheckInvariants(); len(errs) > 0 {
		t.Errorf("invariants: %v", errs)
	}
}

func TestLedgerExpiresReservations(t *testing.T) {
	clk := testingclock.NewFakeClock(reservedAt)
	l := gpu.NewLedger(gpu.WithClock(clk))
	l.UpsertNode(h100s("n1", 1))
	member := reservedPod("m", "n1", reservedAt.Add(time.Minute), 0)
	l.UpsertPod(member)
	other := parse(t, pt.MakePod("other", "ns").GPUCount(1).Obj())

	clk.Step(time.Minute)
	if n := l.ExpireReservations(); n != 1 {
		t.Errorf("ExpireReservations at the expiry dropped %d, want 1", n)
	}
	if err := l.Fit("n1", other); err != nil {
		t.Errorf("Fit after the expiry: %v", err)
	}
	// The pod shows the expired reservation again (any update): ignored.
	member.Annotations["changed"] = "yes"
	l.UpsertPod(member)
	if _, ok := l.Allocation(member.UID); ok {
		t.Error("an expired reservation came back on an update")
	}
	// A ledger built later ignores it too.
	if _, ok := gpu.BuildLedger([]v1alpha1.GPUNode{*h100s("n1", 1)}, []corev1.Pod{*member}, gpu.WithClock(clk)).Allocation(member.UID); ok {
		t.Error("BuildLedger honoured an expired reservation")
	}
}

// TestLedgerIgnoresReservationsItCannotTrust: a reservation that does not
// match the pod's request, or that a bound pod still carries, holds
// nothing of its own.
func TestLedgerIgnoresReservationsItCannotTrust(t *testing.T) {
	future := reservedAt.Add(time.Hour)
	wrongCount := reservedPod("two", "n1", future, 0, 1)
	wrongCount.Annotations[v1alpha1.AnnotationGPUCount] = "1"
	wrongName := reservedPod("name", "n1", future, 0)
	wrongName.Annotations[v1alpha1.AnnotationReservation] = strings.Replace(wrongName.Annotations[v1alpha1.AnnotationReservation], `"main"`, `"other"`, 1)
	garbage := reservedPod("garbage", "n1", future, 0)
	garbage.Annotations[v1alpha1.AnnotationReservation] = "{"
	boundElsewhere := reservedPod("elsewhere", "n1", future, 0)
	boundElsewhere.Spec.NodeName = "n2"
	done := reservedPod("done", "n1", future, 0)
	done.Status.Phase = corev1.PodSucceeded
	for _, p := range []*corev1.Pod{wrongCount, wrongName, garbage, boundElsewhere, done} {
		t.Run(p.Name, func(t *testing.T) {
			l := gpu.NewLedger(gpu.WithClock(testingclock.NewFakeClock(reservedAt)))
			l.UpsertNode(h100s("n1", 2))
			l.UpsertPod(p)
			if st := l.State(); len(st.Pods) != 0 {
				t.Errorf("ledger holds %+v", st.Pods)
			}
		})
	}
}

// FuzzParseReservation: reading never panics, and what reads formats and
// reads back the same.
func FuzzParseReservation(f *testing.F) {
	f.Add(`{"workload":"ns/train","node":"n1","expires":"2026-12-01T10:00:00Z","containers":[{"name":"main","devices":["GPU-a"],"milli":1000}]}`)
	f.Add(`{"node":"n1","expires":"2026-12-01T10:00:00.123+02:00","containers":[{"name":"a","devices":["x","y"],"milli":250,"memoryMiB":100,"smPercent":25}]}`)
	f.Add(`{"node":"","containers":null}`)
	f.Add(`[]`)
	f.Fuzz(func(t *testing.T, s string) {
		r, err := gpu.ParseReservation(s)
		if err != nil {
			return
		}
		out, err := gpu.FormatReservation(*r)
		if err != nil {
			t.Fatalf("a parsed reservation does not format: %v", err)
		}
		again, err := gpu.ParseReservation(out)
		if err != nil {
			t.Fatalf("a formatted reservation does not parse: %v\n%s", err, out)
		}
		if !again.Expires.Equal(r.Expires) {
			t.Fatalf("expiry %s became %s", r.Expires, again.Expires)
		}
		again.Expires = r.Expires
		if diff := cmp.Diff(r, again); diff != "" {
			t.Fatalf("round trip (-first,+second):\n%s", diff)
		}
	})
}

// cmpIgnoreIndexes compares allocations by device UUID: a reservation
// names devices by UUID alone.
var cmpIgnoreIndexes = cmpopts.IgnoreFields(gpu.ContainerAllocation{}, "DeviceIndexes")

// TestLedgerKeepsSingleHoldsUntilTried: a single pod's hold (no pin)
// outlives its expiry while kube-scheduler has not tried the pod, so that
// its device is not given to another pod in a long scheduling backlog;
// once kube-scheduler refuses it, the expired hold goes.
func TestLedgerKeepsSingleHoldsUntilTried(t *testing.T) {
	clk := testingclock.NewFakeClock(reservedAt)
	l := gpu.NewLedger(gpu.WithClock(clk))
	l.UpsertNode(h100s("n1", 1))
	single := reservedPod("s", "n1", reservedAt.Add(time.Minute), 0)
	delete(single.Annotations, v1alpha1.AnnotationNode)
	l.UpsertPod(single)
	other := parse(t, pt.MakePod("other", "ns").GPUCount(1).Obj())

	clk.Step(2 * time.Minute)
	if n := l.ExpireReservations(); n != 0 {
		t.Errorf("ExpireReservations dropped %d holds of pods kube-scheduler has not tried, want 0", n)
	}
	if err := l.Fit("n1", other); err == nil {
		t.Error("another pod fits the device of an expired hold whose pod kube-scheduler has not tried")
	}
	if _, ok := gpu.BuildLedger([]v1alpha1.GPUNode{*h100s("n1", 1)}, []corev1.Pod{*single}, gpu.WithClock(clk)).Allocation(single.UID); !ok {
		t.Error("BuildLedger dropped the expired hold of an untried pod")
	}

	// Still gated (SchedulingGated is not a refusal): held.
	single.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonSchedulingGated}}
	l.UpsertPod(single)
	if _, ok := l.Allocation(single.UID); !ok {
		t.Error("a SchedulingGated condition dropped the hold")
	}
	// Refused by kube-scheduler: the expired hold goes.
	single.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable}}
	l.UpsertPod(single)
	if _, ok := l.Allocation(single.UID); ok {
		t.Error("the expired hold of a pod kube-scheduler refused still holds")
	}
	if err := l.Fit("n1", other); err != nil {
		t.Errorf("Fit after the refused pod's hold went: %v", err)
	}
}
