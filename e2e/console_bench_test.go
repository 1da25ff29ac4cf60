package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestConsoleMapAt500Nodes measures the console's workload map on a dev
// cluster of 500 nodes × 8 GPUs (4,000 cells) with 2,000 pods holding
// slices, in headless Chromium: the time from navigation to the first
// render of the map, the size of the map's JSON, how long the page takes
// to apply one node's update and a filter, and the latency from a pod's
// bind reaching the console to its cell changing on the page (and from the
// pod's creation, through admission, scheduling and bind). docs/benchmarks.md
// has the numbers. It runs only with PARTITA_E2E_BENCH=1:
//
//	make build && flock /tmp/partita-heavy.lock env PARTITA_E2E_BENCH=1 PARTITA_BIN=$PWD/bin/partita go test -count=1 -v -timeout 40m -run TestConsoleMapAt500Nodes ./e2e/
func TestConsoleMapAt500Nodes(t *testing.T) {
	if os.Getenv("PARTITA_E2E_BENCH") == "" {
		t.Skip("set PARTITA_E2E_BENCH=1 to run the console benchmark")
	}
	const nodes, gpus, fill, probes = 500, 8, 2000, 30
	ctx := benchContext(t, 35*time.Minute)
	start := time.Now()
	bc, cs, _ := benchCluster(ctx, t, clusterName+"-console", nodes, gpus)
	t.Logf("cluster of %d nodes × %d GPUs ready in %s", nodes, gpus, time.Since(start).Round(time.Second))
	ensureGPUPriorityClass(ctx, t, cs)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "console-bench"}}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	waitServiceAccount(ctx, t, cs, ns.Name)

	// Slices of a quarter and a half on a quarter of the GPUs.
	pods := make([]*corev1.Pod, fill)
	for i := range pods {
		pods[i] = extGPUPod(ns.Name, fmt.Sprintf("fill-%04d", i), []int64{250, 500}[i%2], 1, gpuNodes)
	}
	begin := time.Now()
	createPods(ctx, t, cs, pods, 32)
	poll(t, 10*time.Minute, "the fill bound", func() (bool, string) {
		list, err := cs.CoreV1().Pods(ns.Name).List(ctx, metav1.ListOptions{ResourceVersion: "0"})
		if err != nil {
			return false, err.Error()
		}
		b, _ := countBound(list.Items)
		return b == fill, fmt.Sprintf("%d of %d bound", b, fill)
	})
	t.Logf("%d pods bound in %s", fill, time.Since(begin).Round(time.Second))

	url := runConsole(t, "--kubeconfig", bc.KubeconfigPath())
	base := strings.SplitN(url, "#", 2)[0]
	token := strings.SplitN(url, "#token=", 2)[1]
	mapBytes, gzBytes := mapSize(ctx, t, base, token)
	t.Logf("GET /api/v1/map: %d KiB of JSON, %d KiB gzipped", mapBytes>>10, gzBytes>>10)

	b := startBrowser(t)
	var firsts, fetches, renders []float64
	for range 5 {
		page(t, b, 2*time.Minute, "open the map", chromedp.Navigate(url), chromedp.WaitVisible(chromedp.CSS(".node")))
		waitFor(t, b, time.Minute, "the first render", `window.__partita && window.__partita.firstRender !== null`)
		firsts = append(firsts, eval[float64](t, b, `window.__partita.firstRender`))
		fetches = append(fetches, eval[float64](t, b, `window.__partita.mapFetchMs`))
		renders = append(renders, eval[float64](t, b, `window.__partita.mapRenderMs`))
		if n := eval[int](t, b, `document.querySelectorAll(".gpu").length`); n != nodes*gpus {
			t.Fatalf("the map has %d cells, want %d", n, nodes*gpus)
		}
		page(t, b, time.Minute, "leave the map", chromedp.Navigate("about:blank"))
	}
	page(t, b, 2*time.Minute, "open the map", chromedp.Navigate(url), chromedp.WaitVisible(chromedp.CSS(".node")))
	t.Logf("RESULT first render of %d cells, ms after navigation: %s (median %.0f); of which GET /api/v1/map %s, drawing %s",
		nodes*gpus, joinFloats(firsts), quantile(firsts, 0.5), joinFloats(fetches), joinFloats(renders))
	filterMs := eval[float64](t, b, `(() => {
		const sel = document.querySelector('select[aria-label="namespace"]');
		const t0 = performance.now();
		sel.value = "console-bench"; sel.dispatchEvent(new Event("change"));
		sel.value = ""; sel.dispatchEvent(new Event("change"));
		return (performance.now() - t0) / 2;
	})()`)
	t.Logf("RESULT a namespace filter over %d nodes applies in %.0f ms", nodes, filterMs)

	// One pod at a time: its bind reaches the console, which sends the
	// node, and the page redraws its cell.
	var viaConsole, inConsole, endToEnd, handle []float64
	for i := range probes {
		name := fmt.Sprintf("probe-%02d", i)
		p := extGPUPod(ns.Name, name, 250, 1, gpuNodes)
		created := time.Now()
		createPods(ctx, t, cs, []*corev1.Pod{p}, 1)
		key := ns.Name + "/" + name
		waitFor(t, b, time.Minute, "probe "+name+" on the map", fmt.Sprintf(`window.__partita.updates.some((u) => u.pods.includes(%s))`, jsString(key)))
		u := eval[map[string]float64](t, b, fmt.Sprintf(`(() => { const u = window.__partita.updates.find((u) => u.pods.includes(%s));
			return {changedAt: u.changedAt, sentAt: u.sentAt, renderedAt: u.renderedAt, handleMs: u.handleMs}; })()`, jsString(key)))
		viaConsole = append(viaConsole, u["renderedAt"]-u["changedAt"])
		inConsole = append(inConsole, u["sentAt"]-u["changedAt"])
		endToEnd = append(endToEnd, float64(int64(u["renderedAt"])-created.UnixMilli()))
		handle = append(handle, u["handleMs"])
	}
	t.Logf("RESULT pod event to its cell redrawn (the bind reaching the console → the page showing it), ms: p50 %.0f, p90 %.0f, max %.0f",
		quantile(viaConsole, 0.5), quantile(viaConsole, 0.9), quantile(viaConsole, 1))
	t.Logf("RESULT of which in the console (coalescing, snapshot, diff, encoding), ms: p50 %.0f, p90 %.0f, max %.0f",
		quantile(inConsole, 0.5), quantile(inConsole, 0.9), quantile(inConsole, 1))
	t.Logf("RESULT pod created to its cell redrawn (admission, scheduling, bind included), ms: p50 %.0f, p90 %.0f, max %.0f",
		quantile(endToEnd, 0.5), quantile(endToEnd, 0.9), quantile(endToEnd, 1))
	t.Logf("RESULT the page applies a nodes event in ms: p50 %.1f, max %.1f", quantile(handle, 0.5), quantile(handle, 1))
	sum, count := buildTime(ctx, t, base, token)
	t.Logf("RESULT the console built %d snapshots in the run, %.1f ms each on average", int(count), sum/count*1000)
	heap := eval[float64](t, b, `performance.memory ? performance.memory.usedJSHeapSize / 1048576 : -1`)
	domNodes := eval[int](t, b, `document.getElementsByTagName("*").length`)
	t.Logf("RESULT the page holds %d DOM elements and %.0f MiB of JS heap", domNodes, heap)
}

// buildTime reads partita_console_snapshot_build_seconds from /metrics.
func buildTime(ctx context.Context, t *testing.T, base, token string) (sum, count float64) {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "GET", base+"metrics", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, "partita_console_snapshot_build_seconds_sum "); ok {
			_, _ = fmt.Sscan(v, &sum)
		}
		if v, ok := strings.CutPrefix(line, "partita_console_snapshot_build_seconds_count "); ok {
			_, _ = fmt.Sscan(v, &count)
		}
	}
	if count == 0 {
		t.Fatalf("no snapshot build time in /metrics:\n%s", body)
	}
	return sum, count
}

// mapSize reads the map as the page does, plain and gzipped.
func mapSize(ctx context.Context, t *testing.T, base, token string) (plain, gz int) {
	t.Helper()
	get := func(enc string) int {
		req, _ := http.NewRequestWithContext(ctx, "GET", base+"api/v1/map", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		if enc != "" {
			req.Header.Set("Accept-Encoding", enc)
		}
		tr := &http.Transport{DisableCompression: true}
		resp, err := (&http.Client{Transport: tr, Timeout: time.Minute}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		n, _ := io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET /api/v1/map: %s", resp.Status)
		}
		return int(n)
	}
	return get(""), get("gzip")
}

func quantile(xs []float64, q float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	i := int(q * float64(len(s)-1))
	return s[i]
}

func joinFloats(xs []float64) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmt.Sprintf("%.0f", x)
	}
	b, _ := json.Marshal(parts)
	return strings.Trim(strings.ReplaceAll(string(b), `"`, ""), "[]")
}
