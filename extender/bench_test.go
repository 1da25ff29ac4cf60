package extender

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/partita-dev/partita/gpu"
	pt "github.com/partita-dev/partita/internal/partitatest"
)

const (
	benchNodes      = 5000
	benchDevices    = 8
	benchPods       = 40000
	benchCandidates = 500
)

// benchExtender is an extender over 5,000 nodes × 8 H100s holding 40,000
// allocations of mixed sizes (whole GPUs, halves, quarters and 20Gi memory
// slices at random, about half the capacity), and 500 candidate node names
// drawn at random, as kube-scheduler would send them for one pod.
func benchExtender(b *testing.B) (*Extender, []string) {
	b.Helper()
	l := gpu.NewLedger()
	all := make([]string, benchNodes)
	for i := range all {
		all[i] = fmt.Sprintf("node-%05d", i)
		l.UpsertNode(pt.MakeGPUNode(all[i]).Devices(benchDevices, pt.H100, pt.H100MiB).Obj())
	}
	kinds := []*pt.PodWrapper{
		pt.MakePod("k", "ns").GPUCount(1),
		pt.MakePod("k", "ns").GPUFraction("0.5"),
		pt.MakePod("k", "ns").GPUFraction("0.25"),
		pt.MakePod("k", "ns").GPUMemory("20Gi"),
	}
	reqs := make([]*gpu.PodRequest, len(kinds))
	for i, k := range kinds {
		r, errs := gpu.ParsePod(k.Obj())
		if len(errs) > 0 {
			b.Fatal(errs)
		}
		reqs[i] = r
	}
	rnd := rand.New(rand.NewPCG(1, 2))
	for i := range benchPods {
		r := *reqs[rnd.IntN(len(reqs))]
		r.Name, r.UID = fmt.Sprintf("pod-%d", i), types.UID(fmt.Sprintf("uid-%d", i))
		a, err := l.Choose(all[i%benchNodes], &r, "")
		if err != nil {
			b.Fatalf("setup Choose: %v", err)
		}
		if err := l.Assume(a); err != nil {
			b.Fatalf("setup Assume: %v", err)
		}
	}
	candidates := slices.Clone(all)
	rnd.Shuffle(len(candidates), func(i, j int) { candidates[i], candidates[j] = candidates[j], candidates[i] })
	return New(l, fakeClient(), &fakeBinder{}), candidates[:benchCandidates]
}

// reportPercentiles reports the 50th and 99th percentiles of the wall and
// thread CPU times of the ops.
func reportPercentiles(b *testing.B, wall, cpu []time.Duration) {
	if len(wall) == 0 {
		return
	}
	at := func(d []time.Duration, p float64) float64 {
		slices.Sort(d)
		return float64(d[min(len(d)-1, int(p*float64(len(d))))].Nanoseconds()) / 1e3
	}
	b.ReportMetric(at(wall, 0.50), "p50-µs")
	b.ReportMetric(at(wall, 0.99), "p99-µs")
	b.ReportMetric(at(cpu, 0.50), "cpu-p50-µs")
	b.ReportMetric(at(cpu, 0.99), "cpu-p99-µs")
}

// threadCPU is the CPU time the calling OS thread has used. On a machine
// shared with other work, wall time also counts waiting for a CPU; thread
// CPU time counts only the work itself (including garbage collection assists
// on this thread).
func threadCPU(b *testing.B) time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ts.Nano())
}

// BenchmarkFilterPrioritize500 is one pod's two calls in the scheduling
// cycle: filter on 500 candidate names of a 5,000-node × 8-GPU ledger, then
// prioritize on the nodes that passed (target p99 ≤ 1 ms, docs/benchmarks.md).
// "verbs" calls the methods on decoded arguments; "http" goes through the
// gin handler with the JSON kube-scheduler sends, decoding and encoding
// included.
func BenchmarkFilterPrioritize500(b *testing.B) {
	e, candidates := benchExtender(b)
	pod := pt.FractionPod("bench", "0.25", "250").Obj()
	ctx := logr.NewContext(b.Context(), logr.Discard())

	b.Run("verbs", func(b *testing.B) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		b.ReportAllocs()
		var lat, cpu []time.Duration
		for b.Loop() {
			start, startCPU := time.Now(), threadCPU(b)
			f, err := e.Filter(ctx, &extenderv1.ExtenderArgs{Pod: pod, NodeNames: &candidates})
			if err != nil {
				b.Fatal(err)
			}
			if _, err := e.Prioritize(ctx, &extenderv1.ExtenderArgs{Pod: pod, NodeNames: f.NodeNames}); err != nil {
				b.Fatal(err)
			}
			cpu = append(cpu, threadCPU(b)-startCPU)
			lat = append(lat, time.Since(start))
		}
		reportPercentiles(b, lat, cpu)
	})

	b.Run("http", func(b *testing.B) {
		h := NewServer(logr.Discard(), e).Handler()
		filterBody, err := json.Marshal(&extenderv1.ExtenderArgs{Pod: pod, NodeNames: &candidates})
		if err != nil {
			b.Fatal(err)
		}
		// kube-scheduler sends prioritize the nodes filter passed; the
		// ledger does not change, so they are the same every time.
		passed, err := e.Filter(ctx, &extenderv1.ExtenderArgs{Pod: pod, NodeNames: &candidates})
		if err != nil {
			b.Fatal(err)
		}
		prioBody, err := json.Marshal(&extenderv1.ExtenderArgs{Pod: pod, NodeNames: passed.NodeNames})
		if err != nil {
			b.Fatal(err)
		}
		conn := schedulerConn(b)
		serve := func(path string, body []byte) {
			rec := httptest.NewRecorder()
			req := httptest.NewRequestWithContext(ctx, http.MethodPost, path, bytes.NewReader(body))
			req.TLS = conn
			h.ServeHTTP(rec, req)
			if rec.Code != http.StatusOK {
				b.Fatalf("%s: %d %s", path, rec.Code, rec.Body.String())
			}
		}
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		b.ReportAllocs()
		var lat, cpu []time.Duration
		for b.Loop() {
			start, startCPU := time.Now(), threadCPU(b)
			serve("/filter", filterBody)
			serve("/prioritize", prioBody)
			cpu = append(cpu, threadCPU(b)-startCPU)
			lat = append(lat, time.Since(start))
		}
		reportPercentiles(b, lat, cpu)
	})
}
