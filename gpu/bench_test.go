package gpu_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/partita-dev/partita/gpu"
	pt "github.com/partita-dev/partita/internal/partitatest"
)

const (
	benchNodes   = 5000
	benchDevices = 8
	benchPods    = 40000
)

// benchLedger is a cluster of 5,000 nodes × 8 H100s holding 40,000
// allocations of mixed sizes (whole GPUs, halves, quarters and 20Gi memory
// slices, chosen at random), placed with Choose and Assume: about half the
// cluster's GPU capacity is in use, and nodes differ.
func benchLedger(b *testing.B) (*gpu.Ledger, []string) {
	b.Helper()
	l := gpu.NewLedger()
	names := make([]string, benchNodes)
	for i := range names {
		names[i] = fmt.Sprintf("node-%05d", i)
		l.UpsertNode(pt.MakeGPUNode(names[i]).Devices(benchDevices, "NVIDIA H100 80GB HBM3", 81920).Obj())
	}
	kinds := []*gpu.PodRequest{
		benchReq(b, pt.MakePod("k", "ns").GPUCount(1)),
		benchReq(b, pt.MakePod("k", "ns").GPUFraction("0.5")),
		benchReq(b, pt.MakePod("k", "ns").GPUFraction("0.25")),
		benchReq(b, pt.MakePod("k", "ns").GPUMemory("20Gi")),
	}
	rnd := rand.New(rand.NewPCG(1, 2))
	for i := range benchPods {
		r := *kinds[rnd.IntN(len(kinds))]
		r.Name, r.UID = fmt.Sprintf("pod-%d", i), types.UID(fmt.Sprintf("uid-%d", i))
		a, err := l.Choose(names[i%benchNodes], &r, "")
		if err != nil {
			b.Fatalf("setup Choose: %v", err)
		}
		if err := l.Assume(a); err != nil {
			b.Fatalf("setup Assume: %v", err)
		}
	}
	return l, names
}

func benchReq(b *testing.B, w *pt.PodWrapper) *gpu.PodRequest {
	b.Helper()
	r, errs := gpu.ParsePod(w.Obj())
	if len(errs) > 0 {
		b.Fatal(errs)
	}
	return r
}

// BenchmarkFitScan checks one request against every node: a half GPU, which
// fits almost every node, and a quarter on each of 8 GPUs, which fits only
// nodes without a whole-GPU pod, so that most answers are InsufficientErrors.
func BenchmarkFitScan(b *testing.B) {
	l, names := benchLedger(b)
	reqs := map[string]*gpu.PodRequest{
		"half":         benchReq(b, pt.MakePod("p", "ns").GPUFraction("0.5")),
		"quarter-on-8": benchReq(b, pt.MakePod("p", "ns").GPUFraction("0.25").GPUCount(8)),
	}
	for _, name := range []string{"half", "quarter-on-8"} {
		b.Run(name, func(b *testing.B) {
			r := reqs[name]
			b.ReportAllocs()
			fit := 0
			for b.Loop() {
				fit = 0
				for _, n := range names {
					if l.Fit(n, r) == nil {
						fit++
					}
				}
			}
			b.ReportMetric(float64(fit), "fitting-nodes")
		})
	}
}

// BenchmarkSnapshot takes a snapshot of the whole ledger: a new one, and one
// refreshed in place.
func BenchmarkSnapshot(b *testing.B) {
	l, _ := benchLedger(b)
	b.Run("new", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = l.Snapshot()
		}
	})
	b.Run("refresh", func(b *testing.B) {
		s := l.Snapshot()
		b.ReportAllocs()
		for b.Loop() {
			l.Refresh(s)
		}
	})
}

func gang(b *testing.B, w func(name string) *pt.PodWrapper) []*gpu.PodRequest {
	reqs := make([]*gpu.PodRequest, 64)
	for i := range reqs {
		reqs[i] = benchReq(b, w(fmt.Sprintf("member-%d", i)))
	}
	return reqs
}

// BenchmarkPlaceGang64 places a 64-member gang on a snapshot over every node
// and forgets it again, so each iteration starts from the same state.
func BenchmarkPlaceGang64(b *testing.B) {
	l, _ := benchLedger(b)
	shapes := map[string]func(string) *pt.PodWrapper{
		"whole": func(n string) *pt.PodWrapper { return pt.MakePod(n, "ns").GPUCount(1) },
		"half":  func(n string) *pt.PodWrapper { return pt.MakePod(n, "ns").GPUFraction("0.5") },
	}
	for _, name := range []string{"whole", "half"} {
		b.Run(name, func(b *testing.B) {
			reqs := gang(b, shapes[name])
			s := l.Snapshot()
			b.ReportAllocs()
			for b.Loop() {
				allocs, err := s.PlaceGang(reqs, nil, "")
				if err != nil {
					b.Fatal(err)
				}
				for _, a := range allocs {
					s.Forget(a.UID)
				}
			}
		})
	}
}

// BenchmarkSnapshotPlaceGang64 is one admission cycle for one gang: take a
// snapshot and place 64 whole-GPU members on it.
func BenchmarkSnapshotPlaceGang64(b *testing.B) {
	l, _ := benchLedger(b)
	reqs := gang(b, func(n string) *pt.PodWrapper { return pt.MakePod(n, "ns").GPUCount(1) })
	b.ReportAllocs()
	for b.Loop() {
		if _, err := l.Snapshot().PlaceGang(reqs, nil, ""); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkFilterPrioritize500 is the extender's filter and prioritize for
// one pod over 500 candidate nodes: Fit, then Score for the nodes that fit.
func BenchmarkFilterPrioritize500(b *testing.B) {
	l, names := benchLedger(b)
	candidates := make([]string, 0, 500)
	for i := 0; i < len(names) && len(candidates) < 500; i += len(names) / 500 {
		candidates = append(candidates, names[i])
	}
	r := benchReq(b, pt.MakePod("p", "ns").GPUFraction("0.25"))
	b.ReportAllocs()
	for b.Loop() {
		for _, n := range candidates {
			if l.Fit(n, r) == nil {
				_ = l.Score(n, r, "")
			}
		}
	}
}
