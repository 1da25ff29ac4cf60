package podtrim

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	resourcehelper "k8s.io/component-helpers/resource"

	"github.com/partita-dev/partita/gpu"
	pt "github.com/partita-dev/partita/internal/partitatest"
)

// kitchenSink is a pod with most of what a pod may carry: what a kubelet
// reads and what places it.
func kitchenSink() *corev1.Pod {
	always := corev1.ContainerRestartPolicyAlways
	p := pt.MakePod("sink", "ns").Queue("team-a").PodGroup("train").GPUFraction("0.5").
		Env("main", "MODEL", "llama").Mount("main", corev1.VolumeMount{Name: "data", MountPath: "/data"}).Priority(100).NodeSelector("gpu", "h100").
		RequiredNodeAffinity(corev1.NodeSelectorRequirement{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}}).
		Toleration("gpu", "h100").SchedulingGates("partita.dev/admission").
		Claim("gpus", "shared").Request("main", corev1.ResourceCPU, "2").Request("main", corev1.ResourceMemory, "4Gi").Obj()
	p.Annotations[LastAppliedAnnotation] = `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"sink"}}`
	p.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationApply}}
	c := &p.Spec.Containers[0]
	c.Command, c.Args, c.Image = []string{"python"}, []string{"train.py"}, "registry.example.com/train:1"
	c.Ports = []corev1.ContainerPort{{ContainerPort: 8080, HostPort: 8080}}
	c.LivenessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"true"}}}}
	p.Spec.InitContainers = []corev1.Container{
		{Name: "fetch", Image: "busybox", Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("3")}}},
		{Name: "sidecar", Image: "envoy", RestartPolicy: &always, Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")}}},
	}
	p.Spec.Overhead = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m")}
	p.Spec.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{{MaxSkew: 1, TopologyKey: "zone", WhenUnsatisfiable: corev1.DoNotSchedule}}
	p.Spec.Volumes = append(p.Spec.Volumes,
		corev1.Volume{Name: "ckpt", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "ckpt"}}},
		corev1.Volume{Name: "scratch", VolumeSource: corev1.VolumeSource{Ephemeral: &corev1.EphemeralVolumeSource{}}},
		corev1.Volume{Name: "token", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{}}},
	)
	p.Status.Phase = corev1.PodRunning
	p.Status.Conditions = []corev1.PodCondition{{Type: "partita.dev/Admitted", Status: corev1.ConditionFalse, Reason: "WaitingForCapacity"}}
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "main", Image: "registry.example.com/train:1", ImageID: "sha256:1"}}
	return p
}

// TestTrimmedPodsPlaceAlike: what the extender and the admission loop read
// of a pod is the same trimmed or not.
func TestTrimmedPodsPlaceAlike(t *testing.T) {
	pods := map[string]*corev1.Pod{
		"kitchen sink":       kitchenSink(),
		"whole GPUs":         pt.WholePod("whole", 2, "2000").Queue("a").Node("n-0").Obj(),
		"a memory slice":     pt.MakePod("mem", "ns").GPUMemory("20000").Queue("a").Obj(),
		"GPUs by count":      pt.MakePod("count", "ns").GPUCount(1).Env("main", "NVIDIA_VISIBLE_DEVICES", "all").Obj(),
		"no GPUs":            pt.MakePod("plain", "ns").Request("main", corev1.ResourceCPU, "1").Obj(),
		"a claim template":   pt.MakePod("tmpl", "ns").ClaimTemplate("gpu", "one-gpu", "tmpl-gpu-x").Obj(),
		"a privileged agent": pt.MakePod("priv", "ns").Privileged("main").HostPath("dev", "/dev").Obj(),
	}
	for name, orig := range pods {
		t.Run(name, func(t *testing.T) {
			trimmed := orig.DeepCopy()
			Pod(trimmed)
			req, errs := gpu.ParsePod(orig)
			treq, terrs := gpu.ParsePod(trimmed)
			if diff := cmp.Diff(req, treq); diff != "" {
				t.Errorf("gpu.ParsePod differs (-original +trimmed):\n%s", diff)
			}
			if diff := cmp.Diff(errs, terrs); diff != "" {
				t.Errorf("gpu.ParsePod errors differ (-original +trimmed):\n%s", diff)
			}
			if diff := cmp.Diff(resourcehelper.PodRequests(orig, resourcehelper.PodResourcesOptions{}), resourcehelper.PodRequests(trimmed, resourcehelper.PodResourcesOptions{})); diff != "" {
				t.Errorf("PodRequests differ (-original +trimmed):\n%s", diff)
			}
			type placed struct {
				NodeName, SchedulerName, PriorityClassName string
				Priority                                   *int32
				NodeSelector                               map[string]string
				Affinity                                   *corev1.Affinity
				Tolerations                                []corev1.Toleration
				Spread                                     []corev1.TopologySpreadConstraint
				Gates                                      []corev1.PodSchedulingGate
				Claims                                     []corev1.PodResourceClaim
				Overhead                                   corev1.ResourceList
				Ports                                      [][]corev1.ContainerPort
				NodeVolumes                                []corev1.Volume
				Labels, Annotations                        map[string]string
				OwnerReferences                            []metav1.OwnerReference
				Status                                     corev1.PodStatus
			}
			what := func(p *corev1.Pod) placed {
				out := placed{NodeName: p.Spec.NodeName, SchedulerName: p.Spec.SchedulerName, PriorityClassName: p.Spec.PriorityClassName, Priority: p.Spec.Priority,
					NodeSelector: p.Spec.NodeSelector, Affinity: p.Spec.Affinity, Tolerations: p.Spec.Tolerations, Spread: p.Spec.TopologySpreadConstraints,
					Gates: p.Spec.SchedulingGates, Claims: p.Spec.ResourceClaims, Overhead: p.Spec.Overhead, Labels: p.Labels, OwnerReferences: p.OwnerReferences,
					Annotations: map[string]string{}, Status: p.Status}
				for k, v := range p.Annotations {
					if k != LastAppliedAnnotation {
						out.Annotations[k] = v
					}
				}
				out.Status.ContainerStatuses = nil
				for _, c := range append(p.Spec.InitContainers, p.Spec.Containers...) {
					out.Ports = append(out.Ports, c.Ports)
				}
				for _, v := range p.Spec.Volumes {
					if v.PersistentVolumeClaim != nil || v.Ephemeral != nil {
						out.NodeVolumes = append(out.NodeVolumes, v)
					}
				}
				return out
			}
			if diff := cmp.Diff(what(orig), what(trimmed)); diff != "" {
				t.Errorf("what places the pod differs (-original +trimmed):\n%s", diff)
			}
		})
	}
}

// TestTrimDropsWhatOnlyKubeletsRead: the fields dropped are gone.
func TestTrimDropsWhatOnlyKubeletsRead(t *testing.T) {
	p := kitchenSink()
	Pod(p)
	c := p.Spec.Containers[0]
	got := map[string]bool{
		"managed fields":    len(p.ManagedFields) > 0,
		"last applied":      p.Annotations[LastAppliedAnnotation] != "",
		"env":               len(c.Env) > 0,
		"mounts":            len(c.VolumeMounts) > 0,
		"command":           len(c.Command) > 0,
		"image":             c.Image != "",
		"probes":            c.LivenessProbe != nil,
		"projected volume":  len(p.Spec.Volumes) != 2,
		"container status":  len(p.Status.ContainerStatuses) > 0,
		"init image":        p.Spec.InitContainers[0].Image != "",
		"sidecar's restart": p.Spec.InitContainers[1].RestartPolicy == nil,
	}
	for what, there := range got {
		if there {
			t.Errorf("%s: still there after trimming", what)
		}
	}
}

func TestTransformLeavesOtherObjects(t *testing.T) {
	node := pt.MakeNode("n").Obj()
	node.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}
	out, err := Transform(node)
	if err != nil || out != node || len(node.ManagedFields) != 1 {
		t.Errorf("Transform(node) = %v, %v; managed fields %d, want the node untouched", out, err, len(node.ManagedFields))
	}
}
