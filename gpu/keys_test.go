package gpu_test

import (
	"testing"

	"github.com/partita-dev/partita/gpu"
	"github.com/partita-dev/partita/internal/partitatest"
)

// TestRequestKeys: the exported key lists say what ParsePod reads, so that
// rules built from them (the admission policies' CEL) pick the same pods.
func TestRequestKeys(t *testing.T) {
	for _, k := range gpu.RequestAnnotations() {
		req, errs := gpu.ParsePod(partitatest.MakePod("p", "ns").Annotation(k, "1").Obj())
		if req == nil && len(errs) == 0 {
			t.Errorf("annotation %s: ParsePod reads no request", k)
		}
	}
	for _, r := range gpu.ResourceNames() {
		req, errs := gpu.ParsePod(partitatest.MakePod("p", "ns").Limit("main", r, "1").Obj())
		if req == nil && len(errs) == 0 {
			t.Errorf("resource %s: ParsePod reads no request", r)
		}
		if req, errs := gpu.ParsePod(partitatest.MakePod("p", "ns").Limit("main", r, "0").Obj()); req != nil || len(errs) > 0 {
			t.Errorf("resource %s of 0: ParsePod reads %+v, %v; want no request", r, req, errs)
		}
	}
	for _, l := range gpu.ForeignLabels() {
		req, errs := gpu.ParsePod(partitatest.MakePod("p", "ns").GPUFraction("0.5").Label(l, "team").Obj())
		if len(errs) > 0 || (req.Queue != "team" && req.PodGroup != "team") {
			t.Errorf("label %s: ParsePod reads queue %q, pod group %q (%v)", l, req.Queue, req.PodGroup, errs)
		}
	}
	if req, errs := gpu.ParsePod(partitatest.MakePod("p", "ns").GPUFraction("0.5").Annotation(gpu.AnnotationRunAIPodGroup, "g").Obj()); len(errs) > 0 || req.PodGroup != "g" {
		t.Errorf("annotation %s: ParsePod reads pod group %q (%v)", gpu.AnnotationRunAIPodGroup, req.PodGroup, errs)
	}
}
