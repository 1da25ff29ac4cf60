package gpu_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
	pt "github.com/partita-dev/partita/internal/partitatest"
)

// fuzzKey is one key the fuzz decoder may put on a pod.
type fuzzKey struct {
	kind string // "annotation", "label" or "resource"
	name string
}

func fuzzKeys() []fuzzKey {
	return []fuzzKey{
		{"annotation", v1alpha1.AnnotationGPUFraction},
		{"annotation", v1alpha1.AnnotationGPUMemory},
		{"annotation", v1alpha1.AnnotationGPUCount},
		{"annotation", v1alpha1.AnnotationGPUCores},
		{"annotation", v1alpha1.AnnotationPlacement},
		{"annotation", gpu.AnnotationRunAIGPUFraction},
		{"annotation", gpu.AnnotationRunAIGPUMemory},
		{"annotation", gpu.AnnotationRunAIGPUFractionNumDevices},
		{"annotation", gpu.AnnotationRunAIPodGroup},
		{"label", v1alpha1.LabelQueue},
		{"label", gpu.LabelRunAIQueue},
		{"label", gpu.LabelKAIQueue},
		{"label", v1alpha1.LabelPodGroup},
		{"label", gpu.LabelCoschedulingPodGroup},
		{"resource", string(gpu.ResourceNVIDIAGPU)},
		{"resource", string(gpu.ResourceHAMiGPUMem)},
		{"resource", string(gpu.ResourceHAMiGPUMemPercentage)},
		{"resource", string(gpu.ResourceHAMiGPUCores)},
		{"resource", string(v1alpha1.ResourceGPUMilli)},
		{"annotation", v1alpha1.AnnotationTopology},
		{"annotation", v1alpha1.AnnotationTopologyRequired},
		{"annotation", v1alpha1.AnnotationTopologyPreferred},
		{"annotation", v1alpha1.AnnotationKAITopology},
		{"annotation", v1alpha1.AnnotationKAITopologyRequired},
		{"annotation", v1alpha1.AnnotationKAITopologyPreferred},
		{"annotation", v1alpha1.AnnotationKueueTopologyRequired},
		{"annotation", v1alpha1.AnnotationKueueTopologyPreferred},
		{"label", v1alpha1.LabelSubGroup},
		{"label", v1alpha1.LabelKAISubGroup},
	}
}

// Decoder bits above the keys (29 of them, bits 0 to 28).
const (
	// fuzzSecond puts resources on container "b" instead of "a".
	fuzzSecond = 1 << 29
	// fuzzBoth puts resources on both containers.
	fuzzBoth = 1 << 30
	// fuzzRequestsOnly sets resource requests without limits.
	fuzzRequestsOnly = 1 << 31
)

// fuzzPod decodes a pod with containers "a" and "b": bit i of keys puts
// fuzzKeys()[i] on it, with vals[i%len(vals)] as the value (a resource whose
// value does not parse as a quantity is left out, as the API server would
// refuse it); the bits above select the containers.
func fuzzPod(keys uint32, vals [4]string) *corev1.Pod {
	w := pt.MakePod("p", "ns").Container("a").Container("b")
	for i, k := range fuzzKeys() {
		if keys&(1<<i) == 0 {
			continue
		}
		v := vals[i%len(vals)]
		switch k.kind {
		case "annotation":
			w.Annotation(k.name, v)
		case "label":
			w.Label(k.name, v)
		case "resource":
			if _, err := resource.ParseQuantity(v); err != nil {
				continue
			}
			ctrs := []string{"a"}
			switch {
			case keys&fuzzBoth != 0:
				ctrs = []string{"a", "b"}
			case keys&fuzzSecond != 0:
				ctrs = []string{"b"}
			}
			for _, c := range ctrs {
				if keys&fuzzRequestsOnly != 0 {
					w.Request(c, corev1.ResourceName(k.name), v)
				} else {
					w.Resource(c, corev1.ResourceName(k.name), v)
				}
			}
		}
	}
	return w.Obj()
}

// FuzzParsePod checks that ParsePod never panics, and that whatever it
// accepts canonicalises to itself: ParsePod(ApplyCanonical(pod)) gives the
// same request, and canonicalising again changes nothing.
func FuzzParsePod(f *testing.F) {
	bit := func(name string) uint32 {
		for i, k := range fuzzKeys() {
			if k.name == name {
				return 1 << i
			}
		}
		panic(name)
	}
	f.Add(bit(v1alpha1.AnnotationGPUFraction), "0.5", "", "", "", int64(81920))
	f.Add(bit(v1alpha1.AnnotationGPUMemory)|bit(v1alpha1.AnnotationGPUCount), "20Gi", "", "2", "", int64(81920))
	f.Add(bit(v1alpha1.AnnotationGPUFraction)|bit(v1alpha1.AnnotationGPUCores)|bit(v1alpha1.LabelQueue), "0.3333", "team-a", "", "50", int64(40960))
	f.Add(bit(gpu.AnnotationRunAIGPUFraction)|bit(gpu.AnnotationRunAIGPUFractionNumDevices)|bit(gpu.LabelRunAIQueue), "q", "0.25", "2", "q", int64(81920))
	f.Add(bit(gpu.AnnotationRunAIGPUMemory), "", "", "20480", "", int64(0))
	f.Add(bit(string(gpu.ResourceNVIDIAGPU))|bit(string(gpu.ResourceHAMiGPUMem))|fuzzBoth, "", "", "1", "3000", int64(24576))
	f.Add(bit(string(gpu.ResourceNVIDIAGPU))|bit(string(gpu.ResourceHAMiGPUCores))|fuzzSecond, "50", "", "2", "", int64(81920))
	f.Add(bit(string(gpu.ResourceNVIDIAGPU))|bit(string(gpu.ResourceHAMiGPUMemPercentage)), "25", "", "1", "", int64(81920))
	f.Add(bit(string(gpu.ResourceNVIDIAGPU))|fuzzRequestsOnly, "", "", "4", "", int64(81920))
	f.Add(bit(string(v1alpha1.ResourceGPUMilli))|bit(v1alpha1.AnnotationGPUFraction), "0.5", "", "", "500", int64(81920))
	f.Add(bit(v1alpha1.AnnotationGPUFraction)|bit(gpu.AnnotationRunAIGPUFraction), "NaN", "1e3", "-1", "0x10", int64(-1))
	f.Add(uint32(0xffffffff), "1", "1", "1", "1", int64(1))
	// Topology keys take vals[i%4] too: these agree across dialects, then
	// disagree and are malformed.
	f.Add(bit(v1alpha1.AnnotationGPUCount)|bit(v1alpha1.AnnotationTopology)|bit(v1alpha1.AnnotationTopologyRequired)|bit(v1alpha1.AnnotationKAITopologyRequired)|
		bit(v1alpha1.LabelSubGroup)|bit(v1alpha1.LabelKAISubGroup), "rack", "", "2", "rack", int64(81920))
	f.Add(bit(string(gpu.ResourceNVIDIAGPU))|bit(v1alpha1.AnnotationTopologyPreferred)|bit(v1alpha1.AnnotationKueueTopologyRequired)|
		bit(v1alpha1.AnnotationKueueTopologyPreferred)|bit(v1alpha1.LabelKAISubGroup), "-x", "topology.kubernetes.io/zone", "1", "a/b/c", int64(81920))
	f.Fuzz(func(t *testing.T, keys uint32, v0, v1, v2, v3 string, ref int64) {
		pod := fuzzPod(keys, [4]string{v0, v1, v2, v3})
		req, errs := gpu.ParsePod(pod)
		if req != nil && len(errs) > 0 {
			t.Fatalf("ParsePod returned a request and errors: %v", errs)
		}
		if req == nil {
			return
		}
		// What ParsePod accepts, the admission loop's readers of any
		// dialect read alike.
		if got, want := req.Topology, v1alpha1.TopologyRequestOf(pod.Annotations); got != want {
			t.Fatalf("ParsePod read topology %+v, TopologyRequestOf %+v", got, want)
		}
		if got, want := req.SubGroup, v1alpha1.SubGroupOf(pod.Labels); got != want {
			t.Fatalf("ParsePod read sub-group %q, SubGroupOf %q", got, want)
		}
		once := gpu.ApplyCanonical(pod, req, ref)
		again, errs := gpu.ParsePod(once)
		if len(errs) > 0 {
			t.Fatalf("ParsePod(ApplyCanonical(pod)) refused what ParsePod(pod) accepted: %v\npod annotations %v", errs, once.Annotations)
		}
		// The resources of HAMi and nvidia.com/gpu are translated and
		// removed: the canonical pod reads as Partita's own dialect.
		want := *req
		if want.Dialect == gpu.DialectHAMi || want.Dialect == gpu.DialectWholeGPU {
			want.Dialect = gpu.DialectPartita
		}
		if diff := cmp.Diff(&want, again); diff != "" {
			t.Fatalf("ParsePod(ApplyCanonical(pod)) (-want,+got):\n%s", diff)
		}
		if diff := cmp.Diff(once, gpu.ApplyCanonical(once, again, ref)); diff != "" {
			t.Fatalf("ApplyCanonical twice (-once,+twice):\n%s", diff)
		}
	})
}
