package partitatest

import (
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
)

// Held returns a running pod bound to node that holds the devices with the
// given UUIDs, in canonical form (reference device memory refMiB) with its
// allocation annotations, as the webhook and bind leave it. amount "1"
// means whole devices, a value ending in "i" an amount of memory ("16Gi"),
// anything else a fraction. It panics on a request the parser refuses: a
// test's mistake.
func Held(name, node, amount string, refMiB int64, uuids ...string) *corev1.Pod {
	w := MakePod(name, "ns").GPUCount(len(uuids)).Node(node).Phase(corev1.PodRunning)
	switch {
	case strings.HasSuffix(amount, "i"):
		w.GPUMemory(amount)
	case amount != "1":
		w.GPUFraction(amount)
	}
	w.Annotation(v1alpha1.AnnotationNode, node)
	w.Annotation(v1alpha1.AnnotationDevicesPrefix+DefaultContainer, strings.Join(uuids, ","))
	pod := w.Obj()
	r, errs := gpu.ParsePod(pod)
	if len(errs) > 0 {
		panic(errs.ToAggregate())
	}
	return gpu.ApplyCanonical(pod, r, refMiB)
}
