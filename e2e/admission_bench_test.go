package e2e

import (
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// TestGangAdmissionThroughput is the admission loop's end-to-end benchmark
// (docs/benchmarks.md): 100 gangs × 8 pods of 1 GPU on 200 simulated nodes
// × 8 GPUs, created through the webhook as fast as the box allows. It
// reports the seconds from the first creation to every pod bound, and per
// gang the admission latency: from its 8th pod's creation to its admission
// (partita.dev/admitted), p50 and p99.
func TestGangAdmissionThroughput(t *testing.T) {
	if os.Getenv("PARTITA_E2E_BENCH") == "" {
		t.Skip("set PARTITA_E2E_BENCH=1 to run the end-to-end admission benchmark")
	}
	const nodes, gpus, gangs, size = 200, 8, 100, 8
	ctx := benchContext(t, 30*time.Minute)
	_, cs, c := benchCluster(ctx, t, clusterName+"-gangs", nodes, gpus)
	ensureGPUPriorityClass(ctx, t, cs)
	ns := createNamespace(ctx, t, cs)
	waitServiceAccount(ctx, t, cs, ns)

	var lock sync.Mutex
	lastCreated := map[string]time.Time{}
	start := time.Now()
	var wg sync.WaitGroup
	work := make(chan int)
	for range 8 {
		wg.Go(func() {
			for g := range work {
				name := fmt.Sprintf("gang-%03d", g)
				if err := c.Create(ctx, &v1alpha1.PodGroup{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: v1alpha1.PodGroupSpec{MinMember: size}}); err != nil {
					t.Errorf("create pod group %s: %v", name, err)
					continue
				}
				for _, p := range gangPods(ns, name, size, gpuNodes) {
					if _, err := cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
						t.Errorf("create pod %s: %v", p.Name, err)
					}
				}
				lock.Lock()
				lastCreated[name] = time.Now()
				lock.Unlock()
			}
		})
	}
	for g := range gangs {
		work <- g
	}
	close(work)
	wg.Wait()
	created := time.Since(start)
	var pods *corev1.PodList
	var err error
	poll(t, 10*time.Minute, "every pod bound", func() (bool, string) {
		pods, err = cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		b, p := countBound(pods.Items)
		return b == gangs*size, fmt.Sprintf("%d bound, %d pending", b, p)
	})
	total := time.Since(start)
	admitted := map[string]time.Time{}
	for _, p := range pods.Items {
		at, err := time.Parse(time.RFC3339, p.Annotations[v1alpha1.AnnotationAdmitted])
		if err != nil {
			t.Fatalf("pod %s: admitted %q: %v", p.Name, p.Annotations[v1alpha1.AnnotationAdmitted], err)
		}
		g := p.Labels[v1alpha1.LabelPodGroup]
		if admitted[g].IsZero() || at.After(admitted[g]) {
			admitted[g] = at
		}
	}
	var lat []time.Duration
	for g, at := range admitted {
		lat = append(lat, max(0, at.Sub(lastCreated[g])))
	}
	slices.Sort(lat)
	pct := func(q float64) time.Duration { return lat[min(len(lat)-1, int(q*float64(len(lat))))] }
	t.Logf("%d gangs × %d pods on %d nodes × %d GPUs: created in %.1fs, all bound after %.1fs; per-gang admission latency p50 %s, p99 %s, max %s",
		gangs, size, nodes, gpus, created.Seconds(), total.Seconds(), pct(0.5).Round(time.Millisecond), pct(0.99).Round(time.Millisecond), lat[len(lat)-1].Round(time.Millisecond))
}
