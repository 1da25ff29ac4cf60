package cycle

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/partita-dev/partita/api/v1alpha1"
	. "github.com/partita-dev/partita/internal/partitatest"
)

// claimPod is a pod of queue q (none when empty) that asks for its GPUs
// through the ResourceClaim claim only, gated, or bound to node when node
// is set.
func claimPod(name, q, claim, node string) *corev1.Pod {
	w := MakePod(name, "ns").UID(types.UID("uid-"+name)).Claim("gpu", claim).Created(t0)
	if q != "" {
		w = w.Queue(q)
	}
	if node == "" {
		return w.SchedulingGates(v1alpha1.SchedulingGateAdmission).Obj()
	}
	return w.Node(node).Annotation(v1alpha1.AnnotationAdmitted, t0.Format(time.RFC3339)).Obj()
}

func TestCycleClaims(t *testing.T) {
	nodes, gns := gpuNodes("n", 2, 2)
	// The second node's GPUs are NVIDIA's DRA driver's.
	gns[1] = MakeGPUNode("n-1").Devices(2, "NVIDIA H100 80GB HBM3", 81559).DRADriver("gpu.nvidia.com", 0, 1).Obj()
	one := func(name string) *resourceapi.ResourceClaim {
		return MakeResourceClaim(name, "ns").Devices("gpu", "gpu.nvidia.com", 1).Obj()
	}
	held := MakeResourceClaim("held", "ns").Devices("gpu", "gpu.nvidia.com", 1).Allocated("gpu", "gpu.nvidia.com", "n-1", "uid-running", "gpu-0").Obj()
	nic := MakeResourceClaim("nic", "ns").Devices("eth", "nic.example.com", 1).Obj()
	two := MakeResourceClaim("two", "ns").Devices("gpu", "gpu.nvidia.com", 2).Obj()
	src := &ClaimSource{Claims: []*resourceapi.ResourceClaim{one("c1"), one("c2"), one("g0"), one("g1"), held, nic, two}}
	limitOne := MakeQueue("a").GPU("1", "1", 1).Obj()
	limitTwo := MakeQueue("a").GPU("2", "2", 1).Obj()

	cases := map[string]struct {
		world   world
		want    outcome
		wantPin map[string]bool
	}{
		"a claim pod is admitted, not placed on the ledger": {
			world: world{nodes: nodes, gpuNodes: gns, queues: []*v1alpha1.Queue{limitOne}, claims: src, pods: []*corev1.Pod{claimPod("p", "a", "c1", "")}},
			want:  outcome{Admitted: map[string][]string{"ns/p": {"p@"}}},
		},
		"a queue's limit counts a running pod's allocated claim": {
			world: world{nodes: nodes, gpuNodes: gns, queues: []*v1alpha1.Queue{limitOne}, claims: src, pods: []*corev1.Pod{
				claimPod("running", "a", "held", "n-1"), claimPod("p", "a", "c1", ""),
			}},
			want: outcome{Waiting: map[string]string{"ns/p": "WaitingForQuota: queue a is at its limit: 1 of 1 GPUs"}},
		},
		"the second of two claim pods waits for the limit": {
			world: world{nodes: nodes, gpuNodes: gns, queues: []*v1alpha1.Queue{limitOne}, claims: src, pods: []*corev1.Pod{
				claimPod("p1", "a", "c1", ""), claimPod("p2", "a", "c2", ""),
			}},
			want: outcome{Admitted: map[string][]string{"ns/p1": {"p1@"}}, Waiting: map[string]string{"ns/p2": "WaitingForQuota: queue a is at its limit: 1 of 1 GPUs"}},
		},
		"a claim of two GPUs is over a limit of one": {
			world: world{nodes: nodes, gpuNodes: gns, queues: []*v1alpha1.Queue{limitOne}, claims: src, pods: []*corev1.Pod{claimPod("p", "a", "two", "")}},
			want:  outcome{Waiting: map[string]string{"ns/p": "WaitingForQuota: queue a is at its limit: 0 of 1 GPUs"}},
		},
		"claim-held GPUs count against Partita's own pods": {
			world: world{nodes: nodes, gpuNodes: gns, queues: []*v1alpha1.Queue{limitTwo}, claims: src, pods: []*corev1.Pod{
				claimPod("running", "a", "held", "n-1"), gated("whole", "a", 2).Obj(),
			}},
			want: outcome{Waiting: map[string]string{"ns/whole": "WaitingForQuota: queue a is at its limit: 1 of 2 GPUs"}},
		},
		"a pod naming a claim that does not exist waits": {
			world: world{nodes: nodes, gpuNodes: gns, queues: []*v1alpha1.Queue{limitOne}, claims: src, pods: []*corev1.Pod{claimPod("p", "a", "later", "")}},
			want:  outcome{Waiting: map[string]string{"ns/p": "WaitingForWorkload: the pod names ResourceClaim later, which does not exist yet: the loop cannot tell what it asks for until it does"}},
		},
		"a pod with only a NIC claim is not the loop's": {
			world: world{nodes: nodes, gpuNodes: gns, queues: []*v1alpha1.Queue{limitOne}, claims: src, pods: []*corev1.Pod{
				MakePod("p", "ns").UID("uid-p").Claim("nic", "nic").Created(t0).Obj(),
			}},
			want: outcome{},
		},
		"a gated pod whose claim turned out to be a NIC is let go, charged nothing": {
			world: world{nodes: nodes, gpuNodes: gns, queues: []*v1alpha1.Queue{limitOne}, claims: src, pods: []*corev1.Pod{
				claimPod("running", "a", "held", "n-1"), claimPod("p", "a", "nic", ""),
			}},
			want: outcome{Admitted: map[string][]string{"ns/p": {"p@"}}},
		},
		"a queue-less claim pod goes to the default queue": {
			world: world{nodes: nodes, gpuNodes: gns, queues: []*v1alpha1.Queue{MakeQueue("default").GPU("0", "0", 1).Obj()}, defaultQueue: "default", claims: src,
				pods: []*corev1.Pod{claimPod("p", "", "c1", "")}},
			want: outcome{Waiting: map[string]string{"ns/p": "WaitingForQuota: queue default is at its limit: 0 of 0 GPUs"}},
		},
		"a gang of claim pods is admitted together, unpinned": {
			world: world{nodes: nodes, gpuNodes: gns, queues: []*v1alpha1.Queue{limitTwo}, claims: src,
				podGroups: []*v1alpha1.PodGroup{MakePodGroup("train", "ns").MinMember(2).Obj()},
				pods: []*corev1.Pod{
					MakePod("g-0", "ns").UID("uid-g0").Queue("a").PodGroup("train").Claim("gpu", "g0").SchedulingGates(v1alpha1.SchedulingGateAdmission).Created(t0).Obj(),
					MakePod("g-1", "ns").UID("uid-g1").Queue("a").PodGroup("train").Claim("gpu", "g1").SchedulingGates(v1alpha1.SchedulingGateAdmission).Created(t0).Obj(),
				}},
			want:    outcome{Admitted: map[string][]string{"ns/train": {"g-0@", "g-1@"}}},
			wantPin: map[string]bool{"ns/train": false},
		},
		"a gang whose members share one claim is charged it once": {
			world: world{nodes: nodes, gpuNodes: gns, queues: []*v1alpha1.Queue{limitOne}, claims: src,
				podGroups: []*v1alpha1.PodGroup{MakePodGroup("train", "ns").MinMember(2).Obj()},
				pods: []*corev1.Pod{
					MakePod("g-0", "ns").UID("uid-g0").Queue("a").PodGroup("train").Claim("gpu", "g0").SchedulingGates(v1alpha1.SchedulingGateAdmission).Created(t0).Obj(),
					MakePod("g-1", "ns").UID("uid-g1").Queue("a").PodGroup("train").Claim("gpu", "g0").SchedulingGates(v1alpha1.SchedulingGateAdmission).Created(t0).Obj(),
				}},
			want: outcome{Admitted: map[string][]string{"ns/train": {"g-0@", "g-1@"}}},
		},
		"a pod sharing a claim another pod holds is charged nothing for it": {
			world: world{nodes: nodes, gpuNodes: gns, queues: []*v1alpha1.Queue{limitOne}, claims: src, pods: []*corev1.Pod{
				claimPod("running", "a", "held", "n-1"), claimPod("p", "a", "held", ""),
			}},
			want: outcome{Admitted: map[string][]string{"ns/p": {"p@"}}},
		},
		"a gang of claim pods over its queue's limit waits whole": {
			world: world{nodes: nodes, gpuNodes: gns, queues: []*v1alpha1.Queue{limitOne}, claims: src,
				podGroups: []*v1alpha1.PodGroup{MakePodGroup("train", "ns").MinMember(2).Obj()},
				pods: []*corev1.Pod{
					MakePod("g-0", "ns").UID("uid-g0").Queue("a").PodGroup("train").Claim("gpu", "g0").SchedulingGates(v1alpha1.SchedulingGateAdmission).Created(t0).Obj(),
					MakePod("g-1", "ns").UID("uid-g1").Queue("a").PodGroup("train").Claim("gpu", "g1").SchedulingGates(v1alpha1.SchedulingGateAdmission).Created(t0).Obj(),
				}},
			want: outcome{Waiting: map[string]string{"ns/train": "WaitingForQuota: queue a is at its limit: 0 of 1 GPUs"}},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, res := runWorld(t, tc.world, Options{})
			if tc.want.Admitted == nil {
				tc.want.Admitted = map[string][]string{}
			}
			if tc.want.Waiting == nil {
				tc.want.Waiting = map[string]string{}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("outcome (-want,+got):\n%s", diff)
			}
			for _, a := range res.Admissions {
				if want, ok := tc.wantPin[a.Workload.Key.String()]; ok && a.Pin != want {
					t.Errorf("%s: Pin = %v, want %v", a.Workload.Key, a.Pin, want)
				}
			}
		})
	}
}
