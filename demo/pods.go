package demo

import (
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
)

// LabelRole marks the demo's pods with their part in the story: notebook,
// train, batch or burst.
const LabelRole = "demo.partita.dev/role"

// The roles of LabelRole.
const (
	roleNotebook = "notebook"
	roleTrain    = "train"
	roleBatch    = "batch"
	roleBurst    = "burst"
)

// image is what the simulated containers "run"; kwok never pulls it.
const image = "registry.k8s.io/pause:3.10"

// basePod is a bare pod of queue q, in the namespace of the same name, as a
// user would write it: the GPU request is added by the caller in one of the
// dialects the webhook reads.
func basePod(q, name, role string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:      name,
			Namespace: q,
			Labels:    map[string]string{v1alpha1.LabelQueue: q, LabelRole: role},
		},
		Spec: corev1.PodSpec{
			// Bare pods: kwok keeps them Running until they are deleted.
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: ptr.To[int64](0),
			Containers:                    []corev1.Container{{Name: "main", Image: image}},
		},
	}
}

// fractionPod asks for a fraction of one GPU with the annotation
// partita.dev/gpu-fraction.
func fractionPod(q, name, role, fraction string) *corev1.Pod {
	p := basePod(q, name, role)
	p.Annotations = map[string]string{v1alpha1.AnnotationGPUFraction: fraction}
	return p
}

// wholeGPUPod asks for one whole GPU the way most manifests do, with the
// resource nvidia.com/gpu: the webhook translates it (and removes it, as no
// NVIDIA device plugin runs on Partita's nodes).
func wholeGPUPod(q, name, role string) *corev1.Pod {
	p := basePod(q, name, role)
	p.Annotations = map[string]string{}
	p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{gpu.ResourceNVIDIAGPU: resource.MustParse("1")}
	return p
}

// gangMember is a 1-GPU member of the PodGroup group.
func gangMember(q, group, name, role string) *corev1.Pod {
	p := wholeGPUPod(q, name, role)
	p.Labels[v1alpha1.LabelPodGroup] = group
	return p
}

// gangMemberOfSize is a gang member that says its gang's size itself
// (partita.dev/min-member), so the webhook can judge the whole gang.
func gangMemberOfSize(q, group, name, role string, size int) *corev1.Pod {
	p := gangMember(q, group, name, role)
	p.Annotations[v1alpha1.AnnotationMinMember] = strconv.Itoa(size)
	return p
}

// podGroup is a gang of size in queue q.
func podGroup(q, name string, size int) *v1alpha1.PodGroup {
	return &v1alpha1.PodGroup{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: q},
		Spec:       v1alpha1.PodGroupSpec{MinMember: int32(size), Queue: q},
	}
}

// gpuQueue is a queue with a GPU quota and limit (-1 for none) and weight 1.
func gpuQueue(name, parent string, quota, limit int, namespaces ...string) *v1alpha1.Queue {
	q := func(n int) *resource.Quantity { return resource.NewQuantity(int64(n), resource.DecimalSI) }
	return &v1alpha1.Queue{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.QueueSpec{
			Parent:     parent,
			Namespaces: namespaces,
			Resources: v1alpha1.QueueResources{GPU: &v1alpha1.ResourceQuota{
				Quota: q(quota), Limit: q(limit), OverQuotaWeight: ptr.To[int32](1),
			}},
		},
	}
}

// podCondition is the pod's condition of type t, nil when it has none.
func podCondition(p *corev1.Pod, t corev1.PodConditionType) *corev1.PodCondition {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == t {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}

// gated reports whether the pod still waits for Partita's admission.
func gated(p *corev1.Pod) bool {
	for _, g := range p.Spec.SchedulingGates {
		if g.Name == v1alpha1.SchedulingGateAdmission {
			return true
		}
	}
	return false
}

// podMilli is the pod's GPU demand in milli-GPUs, as the webhook wrote it
// (partita.dev/gpu-milli on its containers).
func podMilli(p *corev1.Pod) int64 {
	var m int64
	for _, c := range p.Spec.Containers {
		q := c.Resources.Requests[v1alpha1.ResourceGPUMilli]
		m += q.Value()
	}
	return m
}
