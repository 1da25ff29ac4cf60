package claims

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/partita-dev/partita/admission/cycle"
	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/dra"
	"github.com/partita-dev/partita/gpu"
	"github.com/partita-dev/partita/internal/envtestutil"
	pt "github.com/partita-dev/partita/internal/partitatest"
)

// nvidiaWorld is pt.NVIDIAClaimWorld read by a Cache (the structured
// allocator runs for real over it).
func nvidiaWorld(t *testing.T, claims int, extra ...client.Object) (*Cache, []*corev1.Node) {
	t.Helper()
	nodes, objs := pt.NVIDIAClaimWorld(claims, extra...)
	c := fake.NewClientBuilder().WithScheme(envtestutil.Scheme()).WithObjects(objs...).Build()
	return NewCache(c, dra.DefaultGPUClasses, dra.DefaultGPUDrivers), nodes
}

func claimMember(name, claim string) *corev1.Pod { return pt.ClaimGangMember(name, claim) }

// extendedPod asks for n GPUs as the extended resource of NVIDIA's class.
func extendedPod(name string, n int) *corev1.Pod {
	return pt.MakePod(name, "ns").UID(types.UID("uid-"+name)).Queue("a").
		Request("main", corev1.ResourceName(resourceapi.ResourceDeviceClassPrefix+"gpu.nvidia.com"), fmt.Sprint(n)).Obj()
}

func TestClaimSessionPlace(t *testing.T) {
	taken := pt.MakeResourceClaim("taken", "ns").Devices("gpu", "gpu.nvidia.com", 1).Allocated("gpu", "gpu.nvidia.com", "n-0", "", "gpu-0").Obj()
	template := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: "one", Namespace: "ns"},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: pt.MakeResourceClaim("x", "ns").Devices("gpu", "gpu.nvidia.com", 1).Obj().Spec}}
	cases := map[string]struct {
		extra []client.Object
		// rounds are the gangs placed one after the other in one session.
		rounds [][]*corev1.Pod
		want   []string // per round: the nodes, or "unplaceable N"
	}{
		"two members on the two GPUs": {
			rounds: [][]*corev1.Pod{{claimMember("p0", "c0"), claimMember("p1", "c1")}},
			want:   []string{"n-0,n-1"},
		},
		"three members do not fit two GPUs": {
			rounds: [][]*corev1.Pod{{claimMember("p0", "c0"), claimMember("p1", "c1"), claimMember("p2", "c2")}},
			want:   []string{"unplaceable 2"},
		},
		"a GPU an allocated claim holds is taken": {
			extra:  []client.Object{taken},
			rounds: [][]*corev1.Pod{{claimMember("p0", "c0"), claimMember("p1", "c1")}, {claimMember("p2", "c2")}},
			want:   []string{"unplaceable 1", "n-1"},
		},
		"what a gang took stays taken for the session": {
			rounds: [][]*corev1.Pod{{claimMember("p0", "c0")}, {claimMember("p1", "c1")}, {claimMember("p2", "c2")}},
			want:   []string{"n-0", "n-1", "unplaceable 0"},
		},
		"a failed gang gives back what it took": {
			rounds: [][]*corev1.Pod{{claimMember("p0", "c0"), claimMember("p1", "c1"), claimMember("p2", "c2")}, {claimMember("p3", "c3"), claimMember("p4", "c4")}},
			want:   []string{"unplaceable 2", "n-0,n-1"},
		},
		"extended resources a class backs take its devices": {
			rounds: [][]*corev1.Pod{{extendedPod("e0", 1), extendedPod("e1", 1)}, {claimMember("p0", "c0")}, {extendedPod("e2", 2)}},
			want:   []string{"n-0,n-1", "unplaceable 0", "unplaceable 0"},
		},
		"two devices of one extended request are on one node": {
			rounds: [][]*corev1.Pod{{extendedPod("e0", 2)}},
			want:   []string{"unplaceable 0"},
		},
		"a template's claim not made yet": {
			extra:  []client.Object{template},
			rounds: [][]*corev1.Pod{{pt.MakePod("t0", "ns").UID("uid-t0").ClaimTemplate("gpu", "one", "").Obj(), pt.MakePod("t1", "ns").UID("uid-t1").ClaimTemplate("gpu", "one", "").Obj()}},
			want:   []string{"n-0,n-1"},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			cc, nodes := nvidiaWorld(t, 5, tc.extra...)
			s, err := cc.Session(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, pods := range tc.rounds {
				cands := make([][]*corev1.Node, len(pods))
				for i := range cands {
					cands[i] = nodes
				}
				placed, err := s.Place(context.Background(), pods, cands)
				var ue *cycle.ClaimsUnplaceableError
				switch {
				case errors.As(err, &ue):
					got = append(got, fmt.Sprintf("unplaceable %d", ue.Member))
				case err != nil:
					t.Fatalf("Place: %v", err)
				default:
					got = append(got, strings.Join(placed, ","))
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("placements (-want,+got):\n%s", diff)
			}
		})
	}
}

// cycleOutcome is a cycle's one admission ("admitted pinned: p0@n-0
// p1@n-1") or wait ("Reason: message").
func cycleOutcome(res *cycle.Result) string {
	got := ""
	for _, a := range res.Admissions {
		got = "admitted"
		if a.Pin {
			got += " pinned:"
		}
		var ms []string
		for _, m := range a.Members {
			ms = append(ms, m.Member.Pod.Name+"@"+m.Allocation.Node)
		}
		slices.Sort(ms)
		got += " " + strings.Join(ms, " ")
	}
	for _, w := range res.Waiting {
		got = w.Reason + ": " + w.Message
	}
	return got
}

// TestClaimGangAllOrNothing runs admission cycles with the real allocator:
// a gang of claim pods is admitted, pinned, only when every member's claim
// can be allocated.
func TestClaimGangAllOrNothing(t *testing.T) {
	for name, tc := range map[string]struct {
		members int
		// admitted adds a single claim pod the loop admitted, whose claim
		// kube-scheduler has not allocated yet.
		admitted bool
		want     string
	}{
		"two members on two GPUs start, pinned": {members: 2, want: "admitted pinned: p0@n-0 p1@n-1"},
		"an admitted pod's claim not allocated yet holds its GPU": {members: 2, admitted: true,
			want: "WaitingForCapacity: gang needs 2 × 1 GPU through ResourceClaims; it does not fit now: the claims of member 2 of 2 cannot be allocated with the members before it: kube-scheduler's structured allocator finds no node with the devices free"},
		"three members on two GPUs wait whole": {members: 3, want: "WaitingForCapacity: gang needs 3 × 1 GPU through ResourceClaims; it does not fit now: the claims of member 3 of 3 cannot be allocated with the members before it: kube-scheduler's structured allocator finds no node with the devices free"},
	} {
		t.Run(name, func(t *testing.T) {
			cc, nodes := nvidiaWorld(t, tc.members+1)
			cache := cycle.NewCache(cycle.WithClaims(cc.Demand))
			for _, n := range nodes {
				cache.UpsertNode(n)
			}
			cache.UpsertQueue(pt.MakeQueue("a").Obj())
			cache.UpsertPodGroup(pt.MakePodGroup("train", "ns").MinMember(int32(tc.members)).Obj())
			for i := range tc.members {
				cache.UpsertPod(claimMember(fmt.Sprintf("p%d", i), fmt.Sprintf("c%d", i)))
			}
			if tc.admitted {
				cache.UpsertPod(pt.MakePod("alone", "ns").UID("uid-alone").Queue("a").Claim("gpu", fmt.Sprintf("c%d", tc.members)).
					Annotation(v1alpha1.AnnotationAdmitted, time.Now().UTC().Format(time.RFC3339)).Obj())
			}
			var gns []v1alpha1.GPUNode
			for _, n := range nodes {
				gns = append(gns, *pt.MakeGPUNode(n.Name).Devices(1, "H100", 81559).DRADriver("gpu.nvidia.com", 0).Obj())
			}
			res := cycle.Run(context.Background(), cache.State(), gpu.BuildLedger(gns, nil).Snapshot(), nil, cycle.Options{Now: time.Now(), Claims: cc})
			if got := cycleOutcome(res); got != tc.want {
				t.Errorf("cycle: %q\nwant %q", got, tc.want)
			}
		})
	}
}

// TestClaimPreemption runs admission cycles with the real allocator: a claim
// pod of higher priority evicts a lower one whose allocated claim holds the
// GPU it needs, and only as many as it needs.
func TestClaimPreemption(t *testing.T) {
	started := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	running := func(i int, prio int32) (*corev1.Pod, client.Object) {
		name := fmt.Sprintf("low-%d", i)
		node := fmt.Sprintf("n-%d", i)
		claim := pt.MakeResourceClaim(name, "ns").Devices("gpu", "gpu.nvidia.com", 1).Allocated("gpu", "gpu.nvidia.com", node, "uid-"+name, "gpu-0").Obj()
		claim.Status.Allocation.NodeSelector = &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
		}}}
		pod := pt.MakePod(name, "ns").UID(types.UID("uid-"+name)).Queue("a").Priority(prio).Claim("gpu", name).Node(node).
			Created(started).Annotation(v1alpha1.AnnotationAdmitted, started.Format(time.RFC3339)).Obj()
		return pod, claim
	}
	for name, tc := range map[string]struct {
		prios []int32 // of the two running pods
		want  string
	}{
		"the lowest of two is evicted": {prios: []int32{5, 1}, want: "evict ns/low-1: preempted in queue a by ns/high, of higher priority (10 > 1)"},
		"none of higher priority is evicted": {prios: []int32{10, 20},
			want: "WaitingForCapacity: pod needs 1 GPU through ResourceClaims; no node has room now: its claims cannot be allocated now: kube-scheduler's structured allocator finds no node with the devices free"},
	} {
		t.Run(name, func(t *testing.T) {
			var extra []client.Object
			var pods []*corev1.Pod
			for i, p := range tc.prios {
				pod, claim := running(i, p)
				pods = append(pods, pod)
				extra = append(extra, claim)
			}
			cc, nodes := nvidiaWorld(t, 1, extra...)
			cache := cycle.NewCache(cycle.WithClaims(cc.Demand))
			for _, n := range nodes {
				cache.UpsertNode(n)
			}
			cache.UpsertQueue(pt.MakeQueue("a").Obj())
			for _, p := range pods {
				cache.UpsertPod(p)
			}
			cache.UpsertPod(pt.MakePod("high", "ns").UID("uid-high").Queue("a").Priority(10).Claim("gpu", "c0").
				SchedulingGates(v1alpha1.SchedulingGateAdmission).Created(started.Add(time.Hour)).Obj())
			var gns []v1alpha1.GPUNode
			for _, n := range nodes {
				gns = append(gns, *pt.MakeGPUNode(n.Name).Devices(1, "H100", 81559).DRADriver("gpu.nvidia.com", 0).Obj())
			}
			res := cycle.Run(context.Background(), cache.State(), gpu.BuildLedger(gns, nil).Snapshot(), nil,
				cycle.Options{Now: started.Add(2 * time.Hour), Claims: cc})
			var got []string
			for _, e := range res.Evictions {
				for _, m := range e.Members {
					got = append(got, "evict "+m.Pod.Namespace+"/"+m.Pod.Name+": "+e.Message)
				}
			}
			for _, a := range res.Admissions {
				got = append(got, "admitted "+a.Workload.Name())
			}
			if len(got) == 0 {
				for _, w := range res.Waiting {
					got = append(got, w.Reason+": "+w.Message)
				}
			}
			if diff := cmp.Diff([]string{tc.want}, got); diff != "" {
				t.Errorf("cycle (-want,+got):\n%s", diff)
			}
		})
	}
}

// TestDRAModeGangChecksClaims: a gang of Partita's own dra-backend pods (a
// Partita request and a pod claim from a template) placed on the ledger is
// admitted only if its claims can also be allocated on the nodes the
// ledger chose: the ledger learns claim allocations late, from the agents.
func TestDRAModeGangChecksClaims(t *testing.T) {
	started := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	for name, tc := range map[string]struct {
		taken bool // a claim the ledger does not know of yet holds n-0's GPU
		want  string
	}{
		"both GPUs free: admitted, pinned": {want: "admitted pinned: p0@n-0 p1@n-1"},
		"a GPU the ledger thinks free is allocated": {taken: true,
			want: "WaitingForCapacity: gang needs 2 × 1 GPU; it does not fit now: the claims of member 1 of 2 cannot be allocated with the members before it: kube-scheduler's structured allocator finds no node with the devices free"},
	} {
		t.Run(name, func(t *testing.T) {
			objs := []client.Object{
				&resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: dra.DeviceClassName},
					Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "gpu.partita.dev"`}}}}},
				&resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: "one", Namespace: "ns"},
					Spec: resourceapi.ResourceClaimTemplateSpec{Spec: pt.MakeResourceClaim("x", "ns").Devices("gpu", dra.DeviceClassName, 1).Obj().Spec}},
			}
			var nodes []*corev1.Node
			var gns []v1alpha1.GPUNode
			for i := range 2 {
				n := fmt.Sprintf("n-%d", i)
				nodes = append(nodes, pt.MakeNode(n).Obj())
				objs = append(objs, pt.MakeResourceSlice(n+"-partita", "gpu.partita.dev", n).GPU("gpu-0", "GPU-"+n, "H100", "80Gi").Obj())
				gns = append(gns, *pt.MakeGPUNode(n).Devices(1, "H100", 81559).Obj())
			}
			if tc.taken {
				objs = append(objs, pt.MakeResourceClaim("other", "ns").Devices("gpu", dra.DeviceClassName, 1).Allocated("gpu", "gpu.partita.dev", "n-0", "uid-other", "gpu-0").Obj())
			}
			cc := NewCache(fake.NewClientBuilder().WithScheme(envtestutil.Scheme()).WithObjects(objs...).Build(), dra.DefaultGPUClasses, dra.DefaultGPUDrivers)
			cache := cycle.NewCache(cycle.WithClaims(cc.Demand))
			for _, n := range nodes {
				cache.UpsertNode(n)
			}
			cache.UpsertQueue(pt.MakeQueue("a").Obj())
			cache.UpsertPodGroup(pt.MakePodGroup("train", "ns").MinMember(2).Obj())
			for i := range 2 {
				cache.UpsertPod(pt.MakePod(fmt.Sprintf("p%d", i), "ns").UID(types.UID(fmt.Sprintf("uid-p%d", i))).Queue("a").PodGroup("train").GPUCount(1).
					ClaimTemplate("gpu-0", "one", "").SchedulingGates(v1alpha1.SchedulingGateAdmission).Created(started).Obj())
			}
			res := cycle.Run(context.Background(), cache.State(), gpu.BuildLedger(gns, nil).Snapshot(), nil, cycle.Options{Now: started, Claims: cc})
			if got := cycleOutcome(res); got != tc.want {
				t.Errorf("cycle: %q\nwant %q", got, tc.want)
			}
		})
	}
}

// TestClaimSessionHolders: a claim several pods share is allocated once and
// holds them to its node; releasing the pods that hold a claim frees its
// devices for the simulation (eviction), restoring takes them back, and a
// trial placement forgotten gives its devices back.
func TestClaimSessionHolders(t *testing.T) {
	victim := pt.MakeResourceClaim("victim", "ns").Devices("gpu", "gpu.nvidia.com", 1).Allocated("gpu", "gpu.nvidia.com", "n-0", "uid-victim", "gpu-0").Obj()
	victim.Status.Allocation.NodeSelector = &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
		MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"n-0"}}},
	}}}
	victimPod := pt.MakePod("victim", "ns").UID("uid-victim").Claim("gpu", "victim").Node("n-0").Obj()
	type step struct {
		op   string // place, release, restore, forget
		pods []*corev1.Pod
		want string // for place: the nodes, or "unplaceable N"
	}
	cases := map[string][]step{
		"a shared claim is allocated once, its second holder goes to its node": {
			{op: "place", pods: []*corev1.Pod{claimMember("p0", "c0"), claimMember("p1", "c0"), claimMember("p2", "c1")}, want: "n-0,n-0,n-1"},
		},
		"a pod holding an allocated claim goes to its node": {
			{op: "place", pods: []*corev1.Pod{victimPod}, want: "n-0"},
		},
		"releasing the holder of an allocated claim frees its GPU": {
			{op: "place", pods: []*corev1.Pod{claimMember("p0", "c0"), claimMember("p1", "c1")}, want: "unplaceable 1"},
			{op: "release", pods: []*corev1.Pod{victimPod}},
			{op: "place", pods: []*corev1.Pod{claimMember("p0", "c0"), claimMember("p1", "c1")}, want: "n-0,n-1"},
			{op: "forget", pods: []*corev1.Pod{claimMember("p0", "c0"), claimMember("p1", "c1")}},
			{op: "restore", pods: []*corev1.Pod{victimPod}},
			{op: "place", pods: []*corev1.Pod{claimMember("p0", "c0"), claimMember("p1", "c1")}, want: "unplaceable 1"},
		},
		"a pod that joined an allocated claim and was forgotten holds it no more": {
			{op: "place", pods: []*corev1.Pod{claimMember("sharer", "victim")}, want: "n-0"},
			{op: "forget", pods: []*corev1.Pod{claimMember("sharer", "victim")}},
			{op: "release", pods: []*corev1.Pod{victimPod}},
			{op: "place", pods: []*corev1.Pod{claimMember("p0", "c0"), claimMember("p1", "c1")}, want: "n-0,n-1"},
		},
		"a shared claim is freed only when every holder is released": {
			{op: "place", pods: []*corev1.Pod{claimMember("s0", "c3"), claimMember("s1", "c3")}, want: "n-0,n-0"},
			{op: "place", pods: []*corev1.Pod{claimMember("p0", "c0"), claimMember("p1", "c1")}, want: "unplaceable 1"},
			{op: "release", pods: []*corev1.Pod{claimMember("s0", "c3")}},
			{op: "place", pods: []*corev1.Pod{claimMember("p0", "c0"), claimMember("p1", "c1")}, want: "unplaceable 1"},
			{op: "release", pods: []*corev1.Pod{claimMember("s1", "c3")}},
			{op: "place", pods: []*corev1.Pod{claimMember("p0", "c0"), claimMember("p1", "c1")}, want: "n-0,n-1"},
		},
	}
	for name, steps := range cases {
		t.Run(name, func(t *testing.T) {
			extra := []client.Object{}
			if strings.Contains(name, "allocated claim") {
				extra = append(extra, victim)
			}
			cc, nodes := nvidiaWorld(t, 5, extra...)
			s, err := cc.Session(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			for i, st := range steps {
				switch st.op {
				case "place":
					cands := make([][]*corev1.Node, len(st.pods))
					for j := range cands {
						cands[j] = nodes
					}
					placed, err := s.Place(context.Background(), st.pods, cands)
					got := strings.Join(placed, ",")
					var ue *cycle.ClaimsUnplaceableError
					if errors.As(err, &ue) {
						got = fmt.Sprintf("unplaceable %d", ue.Member)
					} else if err != nil {
						t.Fatalf("step %d: Place: %v", i, err)
					}
					if got != st.want {
						t.Errorf("step %d: placed %q, want %q", i, got, st.want)
					}
				case "release":
					for _, p := range st.pods {
						s.Release(p)
					}
				case "restore":
					for _, p := range st.pods {
						s.Restore(p)
					}
				case "forget":
					for _, p := range st.pods {
						s.Forget(p)
					}
				}
			}
		})
	}
}

// TestMostGPUsOnANode: what an allocationMode All claim is charged until
// allocated counts the GPU drivers' devices of the fullest node, across its
// slices, and no other driver's.
func TestMostGPUsOnANode(t *testing.T) {
	cc, _ := nvidiaWorld(t, 0,
		pt.MakeResourceSlice("n-0-nvidia-more", "gpu.nvidia.com", "n-0").GPU("gpu-1", "GPU-n-0-1", "H100", "80Gi").GPU("gpu-2", "GPU-n-0-2", "H100", "80Gi").Obj(),
		pt.MakeResourceSlice("n-1-nics", "nic.example.com", "n-1").GPU("eth-0", "NIC-0", "x", "1Mi").GPU("eth-1", "NIC-1", "x", "1Mi").GPU("eth-2", "NIC-2", "x", "1Mi").GPU("eth-3", "NIC-3", "x", "1Mi").Obj())
	if got := cc.MostGPUsOnANode(); got != 3 {
		t.Errorf("MostGPUsOnANode = %d, want 3 (n-0's two slices of NVIDIA GPUs; n-1's NICs do not count)", got)
	}
}
