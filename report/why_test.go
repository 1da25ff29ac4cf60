package report

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/partita-dev/partita/api/v1alpha1"
	pt "github.com/partita-dev/partita/internal/partitatest"
)

var now = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// twoNodes are two nodes of 2 H100s (80Gi); n1's device 0 holds 0.75.
func twoNodes() *Cluster {
	return &Cluster{
		GPUNodes: []v1alpha1.GPUNode{
			*pt.MakeGPUNode("n1").Devices(2, "H100", 81920).Obj(),
			*pt.MakeGPUNode("n2").Devices(2, "H100", 81920).Obj(),
		},
		Pods: []corev1.Pod{*pt.MakePod("busy", "other").GPUFraction("0.75").BoundTo("n1", 0).Obj()},
	}
}

func TestWhy(t *testing.T) {
	type tc struct {
		cluster     func() *Cluster
		pod         string
		wantSummary string
		want        []Finding
		wantWaiting bool
	}
	cases := map[string]tc{
		"bound pod": {
			cluster: func() *Cluster {
				c := twoNodes()
				c.Pods = append(c.Pods, *pt.MakePod("nb", "team-a").GPUFraction("0.25").BoundTo("n1", 0).Phase(corev1.PodRunning).Obj())
				return c
			},
			pod:         "nb",
			wantSummary: "pod team-a/nb is not waiting: it is bound to n1, GPU 0 (0.25) (phase Running)",
			want: []Finding{
				{Check: CheckRequest, Status: StatusOK, Message: "asks for 0.25 of a GPU (container main)", Numbers: map[string]float64{"gpus": 0.25}},
				{Check: CheckBound, Status: StatusOK, Message: "bound to n1, GPU 0 (0.25) (phase Running)"},
			},
		},
		"gated gang member: gang incomplete, queue at its limit, admitter events": {
			cluster: func() *Cluster {
				c := twoNodes()
				c.Queues = []v1alpha1.Queue{
					*pt.MakeQueue("team-a").GPU("2", "4", 1).GPUStatus("4", "3", "6", 1).Obj(),
				}
				c.PodGroups = []v1alpha1.PodGroup{*pt.MakePodGroup("train", "team-a").MinMember(4).Queue("team-a").
					Phase(v1alpha1.PodGroupPending, "waiting for 1 more pod").Obj()}
				for _, n := range []string{"w0", "w1", "w2"} {
					c.Pods = append(c.Pods, *pt.MakePod(n, "team-a").Resource("", "nvidia.com/gpu", "1").PodGroup("train").
						SchedulingGates(v1alpha1.SchedulingGateAdmission).Obj())
				}
				c.Events = []corev1.Event{
					*pt.MakeEvent("e1", "team-a", "PodGroup", "train", AdmitterComponent, v1alpha1.ReasonWaitingForQuota).
						Message("old news").At(now.Add(-10 * time.Minute)).Obj(),
					*pt.MakeEvent("e2", "team-a", "PodGroup", "train", AdmitterComponent, v1alpha1.ReasonWaitingForMembers).
						Message("3 of 4 pods exist").At(now.Add(-90 * time.Second)).Count(5).Obj(),
					// About another pod: not reported.
					*pt.MakeEvent("e3", "team-a", "Pod", "w2", "default-scheduler", "FailedScheduling").At(now).Obj(),
				}
				return c
			},
			pod: "w0",
			// The gate is the symptom; the summary names the cause.
			wantSummary: "PodGroup team-a/train (pod w0) waits: gang incomplete: 3 of 4 pods exist (PodGroup train, minMember 4); the gang starts only when all exist",
			wantWaiting: true,
			want: []Finding{
				{Check: CheckRequest, Status: StatusOK, Message: "asks for 1 whole GPU (container main)", Numbers: map[string]float64{"gpus": 1}},
				{Check: CheckGates, Status: StatusBlocking, Message: "waiting for the admission loop: the scheduling gate partita.dev/admission is still on (the checks below say why it is not admitted)"},
				{Check: CheckGang, Status: StatusBlocking, Message: "gang incomplete: 3 of 4 pods exist (PodGroup train, minMember 4); the gang starts only when all exist",
					Numbers: map[string]float64{"members": 3, "minMember": 4}},
				{Check: CheckGang, Status: StatusInfo, Message: "PodGroup train is Pending: waiting for 1 more pod (admitted 0, running 0)",
					Numbers: map[string]float64{"admitted": 0, "running": 0}},
				{Check: CheckQueue, Status: StatusBlocking, Message: "queue team-a is at its limit: 4 of 4 GPUs allocated; its gang needs (3 pods not bound) 3 more",
					Numbers: map[string]float64{"allocatedGPUs": 4, "limitGPUs": 4, "neededGPUs": 3}},
				{Check: CheckFairShare, Status: StatusInfo, Message: "queue team-a would go over its fair share: 4 allocated + 3 needed > fair share 3 GPUs (quota 2); it gets only GPUs other queues leave idle, and they may be reclaimed",
					Numbers: map[string]float64{"allocatedGPUs": 4, "fairShareGPUs": 3, "neededGPUs": 3}},
				{Check: CheckEvents, Status: StatusBlocking, Message: "partita-admitter on the PodGroup train, 90s ago, 5 times: WaitingForMembers: 3 of 4 pods exist",
					Numbers: map[string]float64{"count": 5, "ageSeconds": 90}},
				{Check: CheckFit, Status: StatusOK, Message: "a device has room now: it fits 2 of 2 candidate nodes, e.g. n1, GPU 1 (whole)",
					Numbers: map[string]float64{"gpuNodes": 2, "candidates": 2, "fitting": 2}},
				// Three whole GPUs: n1 has one free, n2 two.
				{Check: CheckFit, Status: StatusOK, Message: "the gang's 3 unbound pods fit together now", Numbers: map[string]float64{"pods": 3}},
			},
		},
		"a pod of a mapped workload is named after its workload": {
			cluster: func() *Cluster {
				c := twoNodes()
				c.Queues = []v1alpha1.Queue{*pt.MakeQueue("team-a").GPU("8", "-1", 1).Obj(), *pt.MakeQueue("default").Obj()}
				pg := pt.MakePodGroup("jobset-llama-ft", "team-a").MinMember(8).Queue("team-a").Obj()
				pg.Labels = map[string]string{v1alpha1.LabelWorkloadKind: "JobSet"}
				// An explicit gang of the same name is another gang.
				c.PodGroups = []v1alpha1.PodGroup{*pg}
				for _, n := range []string{"w0", "w1"} {
					c.Pods = append(c.Pods, *pt.MakePod(n, "team-a").Queue("default").Resource("", "nvidia.com/gpu", "1").
						Annotation(v1alpha1.AnnotationWorkload, "JobSet/llama-ft").Annotation(v1alpha1.AnnotationWorkloadPodGroup, "jobset-llama-ft").
						SchedulingGates(v1alpha1.SchedulingGateAdmission).Obj())
				}
				c.Pods = append(c.Pods, *pt.MakePod("intruder", "team-a").Resource("", "nvidia.com/gpu", "1").PodGroup("jobset-llama-ft").Obj())
				return c
			},
			pod:         "w0",
			wantSummary: "JobSet team-a/llama-ft (pod w0) waits: gang incomplete: 2 of 8 pods exist (JobSet team-a/llama-ft, grouped by the workload map; status in PodGroup jobset-llama-ft, minMember 8); the gang starts only when all exist",
			wantWaiting: true,
			want: []Finding{
				{Check: CheckRequest, Status: StatusOK, Message: "asks for 1 whole GPU (container main)", Numbers: map[string]float64{"gpus": 1}},
				{Check: CheckGates, Status: StatusBlocking, Message: "waiting for the admission loop: the scheduling gate partita.dev/admission is still on (the checks below say why it is not admitted)"},
				{Check: CheckGang, Status: StatusBlocking, Message: "gang incomplete: 2 of 8 pods exist (JobSet team-a/llama-ft, grouped by the workload map; status in PodGroup jobset-llama-ft, minMember 8); the gang starts only when all exist",
					Numbers: map[string]float64{"members": 2, "minMember": 8}},
				// The rule's queue, through the PodGroup, not the members' default.
				{Check: CheckQueue, Status: StatusOK, Message: "queue team-a has room: allocation not reported yet, no limit; its gang needs (2 pods not bound) 2; 0 workloads pending in it",
					Numbers: map[string]float64{"neededGPUs": 2, "pendingWorkloads": 0}},
				{Check: CheckFairShare, Status: StatusInfo, Message: "queue team-a (quota 8): the admission loop has not reported its fair share and allocation yet"},
				{Check: CheckEvents, Status: StatusInfo, Message: "no events from partita-admitter or kube-scheduler about the pod"},
				{Check: CheckFit, Status: StatusOK, Message: "a device has room now: it fits 2 of 2 candidate nodes, e.g. n1, GPU 1 (whole)",
					Numbers: map[string]float64{"gpuNodes": 2, "candidates": 2, "fitting": 2}},
				{Check: CheckFit, Status: StatusOK, Message: "the gang's 2 unbound pods fit together now", Numbers: map[string]float64{"pods": 2}},
			},
		},
		"more GPUs than any node has, with kube-scheduler's word": {
			cluster: func() *Cluster {
				c := twoNodes()
				c.Queues = []v1alpha1.Queue{*pt.MakeQueue("team-a").GPU("8", "-1", 1).Obj()}
				c.Pods = append(c.Pods, *pt.MakePod("big", "team-a").Queue("team-a").Resource("", "nvidia.com/gpu", "4").Obj())
				c.Events = []corev1.Event{
					*pt.MakeEvent("e", "team-a", "Pod", "big", "", "FailedScheduling").Warning().
						Message("0/2 nodes are available: 2 Insufficient partita.dev/gpu-milli.").At(now.Add(-2 * time.Minute)).Obj(),
				}
				return c
			},
			pod:         "big",
			wantSummary: "pod team-a/big waits: it can never fit any of the 2 candidate nodes, even empty; closest: node n2: 2 GPUs free; pod needs 4 whole GPUs (container main); it can never fit this node",
			wantWaiting: true,
			want: []Finding{
				{Check: CheckRequest, Status: StatusOK, Message: "asks for 4 whole GPUs (container main)", Numbers: map[string]float64{"gpus": 4}},
				{Check: CheckGates, Status: StatusOK, Message: "no scheduling gates: kube-scheduler may place it"},
				{Check: CheckGang, Status: StatusOK, Message: "not in a gang: it is admitted on its own"},
				{Check: CheckQueue, Status: StatusOK, Message: "queue team-a counts it already: it is past the admission gate, so its GPUs are in the queue's allocation"},
				{Check: CheckEvents, Status: StatusBlocking, Message: "kube-scheduler on the pod, 2m ago: FailedScheduling: 0/2 nodes are available: 2 Insufficient partita.dev/gpu-milli.",
					Numbers: map[string]float64{"count": 1, "ageSeconds": 120}},
				{Check: CheckFit, Status: StatusBlocking, Message: "it can never fit any of the 2 candidate nodes, even empty; closest: node n2: 2 GPUs free; pod needs 4 whole GPUs (container main); it can never fit this node",
					Numbers: map[string]float64{"gpuNodes": 2, "candidates": 2, "fitting": 0, "bestFreeGPUs": 1}},
			},
		},
		"a queue that is not a leaf, and a node selector no GPU node matches": {
			cluster: func() *Cluster {
				c := twoNodes()
				c.Nodes = []corev1.Node{node("n1", nil), node("n2", map[string]string{"zone": "b"})}
				c.Queues = []v1alpha1.Queue{*pt.MakeQueue("org").Obj(), *pt.MakeQueue("team-a").Parent("org").Obj()}
				p := pt.MakePod("p", "team-a").Queue("org").GPUFraction("0.5").Obj()
				p.Spec.NodeSelector = map[string]string{"zone": "a"}
				c.Pods = append(c.Pods, *p)
				return c
			},
			pod:         "p",
			wantSummary: "pod team-a/p waits: queue org is not a leaf (children: team-a): only leaf queues take work",
			wantWaiting: true,
			want: []Finding{
				{Check: CheckRequest, Status: StatusOK, Message: "asks for 0.5 of a GPU (container main)", Numbers: map[string]float64{"gpus": 0.5}},
				{Check: CheckGates, Status: StatusOK, Message: "no scheduling gates: kube-scheduler may place it"},
				{Check: CheckGang, Status: StatusOK, Message: "not in a gang: it is admitted on its own"},
				{Check: CheckQueue, Status: StatusBlocking, Message: "queue org is not a leaf (children: team-a): only leaf queues take work"},
				{Check: CheckEvents, Status: StatusInfo, Message: "no events from partita-admitter or kube-scheduler about the pod"},
				{Check: CheckFit, Status: StatusBlocking, Message: "no node can take it: none of the 2 GPU nodes matches its node selector, affinity and tolerations, or they are cordoned",
					Numbers: map[string]float64{"gpuNodes": 2, "candidates": 0}},
			},
		},
		"the only node with room has a silent agent": {
			cluster: func() *Cluster {
				c := twoNodes()
				// n2 is full; n1's agent last reported 4 minutes ago.
				c.GPUNodes[0] = *pt.MakeGPUNode("n1").Devices(2, "H100", 81920).Heartbeat(now.Add(-4 * time.Minute)).Obj()
				c.GPUNodes[1] = *pt.MakeGPUNode("n2").Devices(2, "H100", 81920).Heartbeat(now.Add(-10 * time.Second)).Obj()
				for i := range int32(2) {
					c.Pods = append(c.Pods, *pt.MakePod(fmt.Sprintf("f%d", i), "other").GPUFraction("1").BoundTo("n2", i).Obj())
				}
				c.Pods = append(c.Pods, *pt.MakePod("p", "team-a").GPUFraction("0.5").Obj())
				return c
			},
			pod:         "p",
			wantSummary: "pod team-a/p waits: the agent on node n1 has not reported for 4m0s (last heartbeat 2026-03-01T11:56:00Z): the node takes no new GPU pods until it does",
			wantWaiting: true,
			want: []Finding{
				{Check: CheckRequest, Status: StatusOK, Message: "asks for 0.5 of a GPU (container main)", Numbers: map[string]float64{"gpus": 0.5}},
				{Check: CheckGates, Status: StatusOK, Message: "no scheduling gates: kube-scheduler may place it"},
				{Check: CheckGang, Status: StatusOK, Message: "not in a gang: it is admitted on its own"},
				{Check: CheckQueue, Status: StatusInfo, Message: "names no queue (label partita.dev/queue), and neither does its PodGroup"},
				{Check: CheckEvents, Status: StatusInfo, Message: "no events from partita-admitter or kube-scheduler about the pod"},
				{Check: CheckFit, Status: StatusBlocking, Message: "the agent on node n1 has not reported for 4m0s (last heartbeat 2026-03-01T11:56:00Z): the node takes no new GPU pods until it does",
					Numbers: map[string]float64{"gpuNodes": 2, "candidates": 2, "fitting": 0, "silentAgents": 1}},
			},
		},
		"a silent agent beside a node with room": {
			cluster: func() *Cluster {
				c := twoNodes()
				c.GPUNodes[1] = *pt.MakeGPUNode("n2").Devices(2, "H100", 81920).Heartbeat(now.Add(-time.Hour)).Obj()
				c.Pods = append(c.Pods, *pt.MakePod("p", "team-a").GPUFraction("0.5").Obj())
				return c
			},
			pod:         "p",
			wantSummary: "pod team-a/p waits, but no check here holds it: kube-scheduler should place it soon ('kubectl describe pod' shows its own reasons)",
			wantWaiting: true,
			want: []Finding{
				{Check: CheckRequest, Status: StatusOK, Message: "asks for 0.5 of a GPU (container main)", Numbers: map[string]float64{"gpus": 0.5}},
				{Check: CheckGates, Status: StatusOK, Message: "no scheduling gates: kube-scheduler may place it"},
				{Check: CheckGang, Status: StatusOK, Message: "not in a gang: it is admitted on its own"},
				{Check: CheckQueue, Status: StatusInfo, Message: "names no queue (label partita.dev/queue), and neither does its PodGroup"},
				{Check: CheckEvents, Status: StatusInfo, Message: "no events from partita-admitter or kube-scheduler about the pod"},
				{Check: CheckFit, Status: StatusInfo, Message: "the agent on node n2 has not reported for 1h0m0s (last heartbeat 2026-03-01T11:00:00Z): the node takes no new GPU pods until it does",
					Numbers: map[string]float64{"gpuNodes": 2, "candidates": 2, "fitting": 1, "silentAgents": 1}},
				{Check: CheckFit, Status: StatusOK, Message: "a device has room now: it fits 1 of 2 candidate nodes, e.g. n1, GPU 1 (0.5)",
					Numbers: map[string]float64{"gpuNodes": 2, "candidates": 2, "fitting": 1, "silentAgents": 1}},
			},
		},
		"no room now, a missing queue, other gates": {
			cluster: func() *Cluster {
				c := twoNodes()
				// Every device holds 0.75, n1's 0 included.
				for i, n := range []string{"n1", "n2", "n2"} {
					c.Pods = append(c.Pods, *pt.MakePod("f"+string(rune('0'+i)), "other").GPUFraction("0.75").BoundTo(n, int32((i+1)%2)).Obj())
				}
				c.Pods = append(c.Pods, *pt.MakePod("p", "team-a").Queue("nope").GPUFraction("0.5").SchedulingGates("example.com/hold").Obj())
				return c
			},
			pod:         "p",
			wantSummary: "pod team-a/p waits: held by scheduling gates that are not Partita's: example.com/hold (whoever added them must remove them)",
			wantWaiting: true,
			want: []Finding{
				{Check: CheckRequest, Status: StatusOK, Message: "asks for 0.5 of a GPU (container main)", Numbers: map[string]float64{"gpus": 0.5}},
				{Check: CheckGates, Status: StatusBlocking, Message: "held by scheduling gates that are not Partita's: example.com/hold (whoever added them must remove them)"},
				{Check: CheckGang, Status: StatusOK, Message: "not in a gang: it is admitted on its own"},
				{Check: CheckQueue, Status: StatusBlocking, Message: "queue nope does not exist"},
				{Check: CheckEvents, Status: StatusInfo, Message: "no events from partita-admitter or kube-scheduler about the pod"},
				// 0.25 free everywhere: the tie goes to the first node by name.
				{Check: CheckFit, Status: StatusBlocking, Message: "no device has room now on any of the 2 candidate nodes; closest: node n1: largest free slice 0.25 on GPU 0; pod needs 0.5 (container main)",
					Numbers: map[string]float64{"gpuNodes": 2, "candidates": 2, "fitting": 0, "bestFreeGPUs": 0.25}},
			},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			c := tc.cluster()
			ns := "team-a"
			got, err := Why(c, ns, tc.pod, now)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got.Findings); diff != "" {
				t.Errorf("findings (-want,+got):\n%s", diff)
			}
			if got.Summary != tc.wantSummary {
				t.Errorf("summary:\n got %s\nwant %s", got.Summary, tc.wantSummary)
			}
			if got.Waiting != tc.wantWaiting {
				t.Errorf("waiting = %v, want %v", got.Waiting, tc.wantWaiting)
			}
		})
	}
}

func node(name string, labels map[string]string) corev1.Node {
	n := corev1.Node{}
	n.Name = name
	n.Labels = labels
	return n
}

// TestWhyHeartbeatTimeout: the bound is the caller's.
func TestWhyHeartbeatTimeout(t *testing.T) {
	c := twoNodes()
	for i := range c.GPUNodes {
		c.GPUNodes[i].Status.Heartbeat = &metav1.Time{Time: now.Add(-time.Minute)}
	}
	c.Pods = append(c.Pods, *pt.MakePod("p", "team-a").GPUFraction("0.5").Obj())
	for timeout, wantSilent := range map[time.Duration]bool{0: false, 45 * time.Second: true, 2 * time.Minute: false} {
		r, err := WhyWithOptions(c, "team-a", "p", now, WhyOptions{AgentHeartbeatTimeout: timeout})
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(r.Summary, "have not reported"); got != wantSilent {
			t.Errorf("timeout %s: summary %q, want silent=%v", timeout, r.Summary, wantSilent)
		}
	}
}

func TestWhyBadInput(t *testing.T) {
	c := twoNodes()
	c.Pods = append(c.Pods, *pt.MakePod("web", "team-a").Obj())
	cases := map[string]struct {
		pod  string
		want error
	}{
		"unknown pod":      {pod: "ghost", want: ErrPodNotFound},
		"pod without GPUs": {pod: "web", want: ErrNotGPUPod},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := Why(c, "team-a", tc.pod, now)
			if !errors.Is(err, tc.want) {
				t.Errorf("err = %v, want %v", err, tc.want)
			}
		})
	}
}

// TestWhyCPUAndMemoryLimits: a queue's CPU and memory limits hold a pod as
// its GPU limit does, and why says which.
func TestWhyCPUAndMemoryLimits(t *testing.T) {
	c := twoNodes()
	c.Queues = []v1alpha1.Queue{*pt.MakeQueue("team-a").CPU("1", "2", 1).Memory("0", "16Gi", 1).GPUStatus("0", "1", "1", 1).
		ResourceStatus(v1alpha1.ResourceCPU, "1500m", "2", "2500m").ResourceStatus(v1alpha1.ResourceMemory, "12Gi", "16Gi", "20Gi").Obj()}
	c.Pods = append(c.Pods, *pt.MakePod("p", "team-a").Queue("team-a").GPUFraction("0.5").
		Request(pt.DefaultContainer, corev1.ResourceCPU, "1").Request(pt.DefaultContainer, corev1.ResourceMemory, "8Gi").
		SchedulingGates(v1alpha1.SchedulingGateAdmission).Obj())
	r, err := Why(c, "team-a", "p", now)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range r.Findings {
		if f.Check == CheckQueue && f.Status == StatusBlocking {
			got = append(got, f.Message)
		}
	}
	want := []string{
		"queue team-a would pass its CPU limit: 1.5 CPUs of 2 CPUs allocated; the pod needs 1 CPU",
		"queue team-a would pass its memory limit: 12Gi of 16Gi allocated; the pod needs 8Gi",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("blocking queue findings (-want,+got):\n%s", diff)
	}
	if !strings.Contains(r.Summary, "CPU limit") {
		t.Errorf("summary %q does not name the CPU limit", r.Summary)
	}
}

// TestWhyHistoryDecided: where the queue's past usage changed its fair
// share, the fair-share check says so, with what it used against the
// sibling that used least; elsewhere the message is as without usage.
func TestWhyHistoryDecided(t *testing.T) {
	over := "queue team-a would go over its fair share: 4 allocated + 1 needed > fair share 3 GPUs (quota 2); it gets only GPUs other queues leave idle, and they may be reclaimed"
	cases := map[string]struct {
		queues []v1alpha1.Queue
		want   Finding
	}{
		"usage off": {
			queues: []v1alpha1.Queue{*pt.MakeQueue("team-a").GPU("2", "-1", 1).GPUStatus("4", "3", "5", 1).Obj()},
			want: Finding{Check: CheckFairShare, Status: StatusInfo, Message: over,
				Numbers: map[string]float64{"allocatedGPUs": 4, "fairShareGPUs": 3, "neededGPUs": 1}},
		},
		"usage changed nothing": {
			queues: []v1alpha1.Queue{*pt.MakeQueue("team-a").GPU("2", "-1", 1).GPUStatus("4", "3", "5", 1).UsageStatus("410", "0.3", "3").Obj()},
			want: Finding{Check: CheckFairShare, Status: StatusInfo, Message: over,
				Numbers: map[string]float64{"allocatedGPUs": 4, "fairShareGPUs": 3, "neededGPUs": 1}},
		},
		"history decided, against the sibling that used least": {
			queues: []v1alpha1.Queue{
				*pt.MakeQueue("research").UsageStatus("460", "0.4", "8").Obj(),
				*pt.MakeQueue("team-a").Parent("research").GPU("2", "-1", 1).GPUStatus("4", "3", "5", 1).UsageStatus("410.4", "0.3", "5").Obj(),
				*pt.MakeQueue("team-b").Parent("research").UsageStatus("12.34", "0.01", "3").Obj(),
				*pt.MakeQueue("team-c").Parent("research").UsageStatus("30", "0.03", "0").Obj(),
				// Not a sibling: another parent's.
				*pt.MakeQueue("other").UsageStatus("1", "0", "0").Obj(),
			},
			want: Finding{Check: CheckFairShare, Status: StatusInfo,
				Message: over + "; history decided: without usage its fair share would be 5 GPUs; it used 410 GPU-hours (sliding 168h window, half-life 24h) against 12.3 for queue team-b",
				Numbers: map[string]float64{"allocatedGPUs": 4, "fairShareGPUs": 3, "neededGPUs": 1,
					"fairShareWithoutUsageGPUs": 5, "usageGPUHours": 410.4, "siblingUsageGPUHours": 12.34}},
		},
		"history decided in its favour, no sibling reports usage": {
			queues: []v1alpha1.Queue{
				*pt.MakeQueue("team-a").GPU("2", "-1", 1).GPUStatus("4", "6", "5", 1).UsageStatus("0.04", "0", "4").Obj(),
				*pt.MakeQueue("team-b").Obj(),
			},
			want: Finding{Check: CheckFairShare, Status: StatusOK,
				Message: "queue team-a stays within its fair share: 4 allocated + 1 needed <= fair share 6 GPUs (quota 2); history decided: without usage its fair share would be 4 GPUs; it used 0.04 GPU-hours (sliding 168h window, half-life 24h)",
				Numbers: map[string]float64{"allocatedGPUs": 4, "fairShareGPUs": 6, "neededGPUs": 1, "fairShareWithoutUsageGPUs": 4, "usageGPUHours": 0.04}},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			c := twoNodes()
			c.Queues = tc.queues
			c.Pods = append(c.Pods, *pt.MakePod("p", "team-a").Queue("team-a").Resource("", "nvidia.com/gpu", "1").
				SchedulingGates(v1alpha1.SchedulingGateAdmission).Obj())
			r, err := Why(c, "team-a", "p", now)
			if err != nil {
				t.Fatal(err)
			}
			var got []Finding
			for _, f := range r.Findings {
				if f.Check == CheckFairShare {
					got = append(got, f)
				}
			}
			if diff := cmp.Diff([]Finding{tc.want}, got); diff != "" {
				t.Errorf("fair-share findings (-want,+got):\n%s", diff)
			}
		})
	}
}
