package partitatest

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// DefaultContainer is the name of the container a PodWrapper adds when a
// method needs a container and the pod has none.
const DefaultContainer = "main"

// PodWrapper builds a Pod.
type PodWrapper struct{ corev1.Pod }

// MakePod starts a pod with the given name and namespace and the UID
// "uid-<namespace>-<name>". It gets a container named DefaultContainer
// unless one is added.
func MakePod(name, namespace string) *PodWrapper {
	return &PodWrapper{corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:      name,
			Namespace: namespace,
			UID:       types.UID("uid-" + namespace + "-" + name),
		},
	}}
}

// Obj returns the pod, adding DefaultContainer if it has no container.
func (w *PodWrapper) Obj() *corev1.Pod {
	w.ensureContainer()
	return &w.Pod
}

// Clone returns a deep copy of the wrapper.
func (w *PodWrapper) Clone() *PodWrapper {
	return &PodWrapper{*w.Pod.DeepCopy()}
}

// Container adds a container.
func (w *PodWrapper) Container(name string) *PodWrapper {
	w.Spec.Containers = append(w.Spec.Containers, corev1.Container{Name: name, Image: "registry.k8s.io/pause:3.10"})
	return w
}

// InitContainer adds an init container.
func (w *PodWrapper) InitContainer(name string) *PodWrapper {
	w.Spec.InitContainers = append(w.Spec.InitContainers, corev1.Container{Name: name, Image: "registry.k8s.io/pause:3.10"})
	return w
}

// Annotation sets an annotation.
func (w *PodWrapper) Annotation(key, value string) *PodWrapper {
	if w.ObjectMeta.Annotations == nil {
		w.ObjectMeta.Annotations = map[string]string{}
	}
	w.ObjectMeta.Annotations[key] = value
	return w
}

// Annotations sets several annotations.
func (w *PodWrapper) Annotations(kv map[string]string) *PodWrapper {
	for k, v := range kv {
		w.Annotation(k, v)
	}
	return w
}

// Label sets a label.
func (w *PodWrapper) Label(key, value string) *PodWrapper {
	if w.Labels == nil {
		w.Labels = map[string]string{}
	}
	w.Labels[key] = value
	return w
}

// GPUFraction sets partita.dev/gpu-fraction.
func (w *PodWrapper) GPUFraction(v string) *PodWrapper {
	return w.Annotation(v1alpha1.AnnotationGPUFraction, v)
}

// GPUMemory sets partita.dev/gpu-memory.
func (w *PodWrapper) GPUMemory(v string) *PodWrapper {
	return w.Annotation(v1alpha1.AnnotationGPUMemory, v)
}

// GPUCount sets partita.dev/gpu-count.
func (w *PodWrapper) GPUCount(n int) *PodWrapper {
	return w.Annotation(v1alpha1.AnnotationGPUCount, itoa(n))
}

// GPUCores sets partita.dev/gpu-cores.
func (w *PodWrapper) GPUCores(percent int) *PodWrapper {
	return w.Annotation(v1alpha1.AnnotationGPUCores, itoa(percent))
}

// Placement sets partita.dev/placement.
func (w *PodWrapper) Placement(p string) *PodWrapper {
	return w.Annotation(v1alpha1.AnnotationPlacement, p)
}

// Queue sets the partita.dev/queue label.
func (w *PodWrapper) Queue(q string) *PodWrapper {
	return w.Label(v1alpha1.LabelQueue, q)
}

// PodGroup sets the partita.dev/pod-group label.
func (w *PodWrapper) PodGroup(g string) *PodWrapper {
	return w.Label(v1alpha1.LabelPodGroup, g)
}

// Resource sets a resource's request and limit on a container; container ""
// means the last container added (DefaultContainer if none).
func (w *PodWrapper) Resource(container string, name corev1.ResourceName, quantity string) *PodWrapper {
	w.Request(container, name, quantity)
	return w.Limit(container, name, quantity)
}

// Request sets a resource's request only.
func (w *PodWrapper) Request(container string, name corev1.ResourceName, quantity string) *PodWrapper {
	r := &w.container(container).Resources
	if r.Requests == nil {
		r.Requests = corev1.ResourceList{}
	}
	r.Requests[name] = resource.MustParse(quantity)
	return w
}

// Limit sets a resource's limit only.
func (w *PodWrapper) Limit(container string, name corev1.ResourceName, quantity string) *PodWrapper {
	r := &w.container(container).Resources
	if r.Limits == nil {
		r.Limits = corev1.ResourceList{}
	}
	r.Limits[name] = resource.MustParse(quantity)
	return w
}

// Node binds the pod to a node (spec.nodeName).
func (w *PodWrapper) Node(name string) *PodWrapper {
	w.Spec.NodeName = name
	return w
}

// Phase sets status.phase.
func (w *PodWrapper) Phase(p corev1.PodPhase) *PodWrapper {
	w.Status.Phase = p
	return w
}

// UID sets the UID.
func (w *PodWrapper) UID(uid types.UID) *PodWrapper {
	w.ObjectMeta.UID = uid
	return w
}

// Claim adds a pod claim named name of the ResourceClaim claim, used by
// the last container added.
func (w *PodWrapper) Claim(name, claim string) *PodWrapper {
	w.Spec.ResourceClaims = append(w.Spec.ResourceClaims, corev1.PodResourceClaim{Name: name, ResourceClaimName: &claim})
	c := w.container("")
	c.Resources.Claims = append(c.Resources.Claims, corev1.ResourceClaim{Name: name})
	return w
}

// ClaimTemplate adds a pod claim named name from the ResourceClaimTemplate
// template, used by the last container added; made, when not empty, is
// the claim kube-controller-manager made from it (status).
func (w *PodWrapper) ClaimTemplate(name, template, made string) *PodWrapper {
	w.Spec.ResourceClaims = append(w.Spec.ResourceClaims, corev1.PodResourceClaim{Name: name, ResourceClaimTemplateName: &template})
	c := w.container("")
	c.Resources.Claims = append(c.Resources.Claims, corev1.ResourceClaim{Name: name})
	if made != "" {
		w.Status.ResourceClaimStatuses = append(w.Status.ResourceClaimStatuses, corev1.PodResourceClaimStatus{Name: name, ResourceClaimName: &made})
	}
	return w
}

// SchedulingGates adds scheduling gates.
func (w *PodWrapper) SchedulingGates(names ...string) *PodWrapper {
	for _, n := range names {
		w.Spec.SchedulingGates = append(w.Spec.SchedulingGates, corev1.PodSchedulingGate{Name: n})
	}
	return w
}

func (w *PodWrapper) ensureContainer() {
	if len(w.Spec.Containers) == 0 {
		w.Container(DefaultContainer)
	}
}

// container finds a container or init container by name; "" means the last
// container added.
func (w *PodWrapper) container(name string) *corev1.Container {
	w.ensureContainer()
	if name == "" {
		return &w.Spec.Containers[len(w.Spec.Containers)-1]
	}
	for i := range w.Spec.Containers {
		if w.Spec.Containers[i].Name == name {
			return &w.Spec.Containers[i]
		}
	}
	for i := range w.Spec.InitContainers {
		if w.Spec.InitContainers[i].Name == name {
			return &w.Spec.InitContainers[i]
		}
	}
	w.Container(name)
	return &w.Spec.Containers[len(w.Spec.Containers)-1]
}
