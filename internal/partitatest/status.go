package partitatest

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// BoundTo binds the pod to node the way the extender's Binding does: spec.nodeName,
// partita.dev/node, and partita.dev/devices.<container> with the UUIDs
// MakeGPUNode gives the devices, on the last container added.
func (w *PodWrapper) BoundTo(node string, devices ...int32) *PodWrapper {
	c := w.container("")
	uuids := ""
	for i, d := range devices {
		if i > 0 {
			uuids += ","
		}
		uuids += DeviceUUID(node, d)
	}
	w.Node(node)
	w.Annotation(v1alpha1.AnnotationNode, node)
	return w.Annotation(v1alpha1.AnnotationDevicesPrefix+c.Name, uuids)
}

// GPUStatus sets the queue's GPU status as the admission loop writes it:
// allocated, fair share and requested GPUs ("" leaves one out) and the
// number of pending workloads.
func (w *QueueWrapper) GPUStatus(allocated, fairShare, requested string, pending int32) *QueueWrapper {
	set := func(l *corev1.ResourceList, v string) {
		if v == "" {
			return
		}
		if *l == nil {
			*l = corev1.ResourceList{}
		}
		(*l)[v1alpha1.ResourceGPU] = resource.MustParse(v)
	}
	set(&w.Status.Allocated, allocated)
	set(&w.Status.FairShare, fairShare)
	set(&w.Status.Requested, requested)
	w.Status.PendingWorkloads = pending
	return w
}

// ResourceStatus sets status.allocated, fairShare and requested of one
// resource (cpu, memory); "" leaves an entry out.
func (w *QueueWrapper) ResourceStatus(name corev1.ResourceName, allocated, fairShare, requested string) *QueueWrapper {
	set := func(l *corev1.ResourceList, v string) {
		if v == "" {
			return
		}
		if *l == nil {
			*l = corev1.ResourceList{}
		}
		(*l)[name] = resource.MustParse(v)
	}
	set(&w.Status.Allocated, allocated)
	set(&w.Status.FairShare, fairShare)
	set(&w.Status.Requested, requested)
	return w
}

// Phase sets the PodGroup's status phase and the reason it waits.
func (w *PodGroupWrapper) Phase(phase v1alpha1.PodGroupPhase, reason string) *PodGroupWrapper {
	w.Status.Phase = phase
	w.Status.Reason = reason
	return w
}

// UsageStatus sets status.usage as the admission loop writes it with
// time-based fair share on: the GPU-hours the queue used, their share of the
// cluster's, and the GPU fair share without usage ("" leaves one out),
// counted over a sliding 168h window with a 24h half-life (the extender's
// defaults) unless UsageWindow set others.
func (w *QueueWrapper) UsageStatus(gpuHours, share, fairShareWithoutUsage string) *QueueWrapper {
	if w.Status.Usage == nil {
		w.Status.Usage = &v1alpha1.QueueUsage{
			HalfLife: metav1.Duration{Duration: 24 * time.Hour}, Window: metav1.Duration{Duration: 7 * 24 * time.Hour},
			WindowType: v1alpha1.UsageWindowSliding,
		}
	}
	u := w.Status.Usage
	set := func(l *corev1.ResourceList, v string) {
		if v == "" {
			return
		}
		if *l == nil {
			*l = corev1.ResourceList{}
		}
		(*l)[v1alpha1.ResourceGPU] = resource.MustParse(v)
	}
	set(&u.Hours, gpuHours)
	set(&u.Share, share)
	set(&u.FairShareWithoutUsage, fairShareWithoutUsage)
	return w
}

// UsageWindow sets the settings status.usage was counted with.
func (w *QueueWrapper) UsageWindow(windowType string, window, halfLife time.Duration) *QueueWrapper {
	if w.Status.Usage == nil {
		w.Status.Usage = &v1alpha1.QueueUsage{}
	}
	w.Status.Usage.WindowType, w.Status.Usage.Window, w.Status.Usage.HalfLife = windowType, metav1.Duration{Duration: window}, metav1.Duration{Duration: halfLife}
	return w
}
