package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestDemoTellsTheStory runs `partita dev demo` twice on a cluster of its
// own and checks that the story's key claims are in its output: the demo
// checks each claim against the cluster before it prints it, so a line
// that is there was true.
//
// Not on the suite's shared cluster: the demo fills every GPU, and fair
// shares depend on every queue in the cluster, so the other tests and the
// demo would disturb each other. A cluster of its own starts in seconds.
func TestDemoTellsTheStory(t *testing.T) {
	if externalKubeconfig != "" {
		t.Skip("the demo runs on a dev cluster")
	}
	ctx := testContext(t, 10*time.Minute)
	name := fmt.Sprintf("demo-e2e-%d", os.Getpid())
	t.Cleanup(func() {
		if os.Getenv("PARTITA_E2E_KEEP") != "" {
			return
		}
		if out, err := partita(context.WithoutCancel(ctx), "dev", "down", "--name", name); err != nil {
			t.Errorf("dev down: %v\n%s", err, out)
		}
	})
	if out, err := partita(ctx, "dev", "up", "--name", name); err != nil {
		t.Fatalf("dev up: %v\n%s", err, out)
	}

	want := []string{
		`(?m)^  32 GPUs in all\.`,
		`(?m)^    team-a  8 +24 +team-a$`,
		`6 notebooks asking for 2 GPUs in all use [23] GPUs\.`,
		`Replica llm-0 \(half a GPU, annotation partita.dev/model: demo-llm\) is admitted to gpu-node-\d,`,
		`gpu-node-\d's cache (fetched 268\.4 MB in \d+\.\ds|already held demo-llm)`,
		`A second replica, llm-1, goes to gpu-node-\d too, where demo-llm already is`,
		`(?m)^  team-a +demo-llm +Ready +256\.0Mi +1 +0 +0 +2 +0 +file://`,
		`gang team-b/train needs 8 pods before any starts; 7 exist`,
		`All 8 bound within \d+\.\d\ds of each other, \d+\.\ds after the 8th pod was created; none before it existed\.`,
		`PodGroup train: phase Running, 8 running\.`,
		`the gang of 32 pods asks for 32 GPUs, more than the 24 GPU limit of queue "team-a"`,
		`waits \(WaitingForQuota\): queue team-a is at its limit: 24 of 24 GPUs`,
		`Partita evicted 8 pods of team-a's .*: (batch-\d\d, ){7}batch-\d\d\n`,
		`reclaimed for team-b/burst: queue team-b is below its fair share \(8 of 16 GPUs\) and queue team-a is above its own \(24 of 16 GPUs\)`,
		`team-b's gang burst runs: all 8 bound`,
		`(?m)^  NODE \\ GPU +0 +1 +2 +3 +4 +5 +6 +7$`,
		// Notebooks packed on 2 devices (the usual case), or spread over 3
		// with quarter-GPU pods filling team-a's limit.
		`(?m)^  32 GPUs on 4 nodes: 32 allocated, 0 free \((36|39) pods\)$`,
		`(?m)^    team-a +100 +8 +24 +16 +16 +17 +1 +(20|23) +0 +1$`,
		`(?m)^    team-b +100 +16 +32 +16 +16 +16 +0 +16 +0 +0$`,
		`the 6 notebooks ask for 2 GPUs and use [23] GPUs here; whole-GPU allocation would have taken 6 GPUs \([23]× as many\)`,
		`all (36 running pods hold 32 GPUs here; whole-GPU allocation would need 36 GPUs, 4|39 running pods hold 32 GPUs here; whole-GPU allocation would need 39 GPUs, 7) more than the cluster has: [47] pods would not run\.`,
		`kubectl partita why batch-2[23] -n team-a`,
		`blocking fit: no device has room now`,
		`bin/partita dev down --name ` + name,
	}
	consoleLine := regexp.MustCompile(`The Partita console keeps serving with the cluster \(until 'partita dev down'\):\n  (http://127\.0\.0\.1:\d+/#token=(\S+))\n`)
	var consoleURLs []string
	for run := 1; run <= 2; run++ {
		start := time.Now()
		out, err := partita(ctx, "dev", "demo", "--name", name)
		t.Logf("demo run %d took %.1fs:\n%s", run, time.Since(start).Seconds(), out)
		if err != nil {
			t.Fatalf("demo run %d: %v", run, err)
		}
		for _, w := range want {
			if !regexp.MustCompile(w).MatchString(out) {
				t.Errorf("demo run %d: the output does not match %s", run, w)
			}
		}
		// The first run's model comes from its source, through the node
		// cache that the admission asked for it.
		if fetched := regexp.MustCompile(`gpu-node-\d's cache fetched 268\.4 MB in`); run == 1 && !fetched.MatchString(out) {
			t.Errorf("demo run 1: the output does not match %s", fetched)
		}
		// The demo returns by itself and names the cluster's console,
		// which keeps running with the cluster, at the same URL each run.
		m := consoleLine.FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("demo run %d: no console URL at the end", run)
		}
		if !strings.Contains(out, "The Partita console (open it to watch the story live): "+m[1]) {
			t.Errorf("demo run %d: the console's URL is not printed once the cluster is up", run)
		}
		consoleURLs = append(consoleURLs, m[1])
		checkDemoConsole(ctx, t, m[1], m[2])
		// A second run starts from nothing: it removes what the first left.
		if again := strings.Contains(out, "Removing what the last run of the demo left"); again != (run == 2) {
			t.Errorf("demo run %d: says it removed a previous run's objects: %v, want %v", run, again, run == 2)
		}
	}
	if consoleURLs[0] != consoleURLs[1] {
		t.Errorf("the console's URL changed between runs: %s, then %s", consoleURLs[0], consoleURLs[1])
	}
	status, err := partita(ctx, "dev", "status", "--name", name)
	if err != nil || !regexp.MustCompile(`(?m)^  partita-console +running$`).MatchString(status) || !strings.Contains(status, "Console:     "+consoleURLs[0]) {
		t.Errorf("dev status (%v) does not show the console running at %s:\n%s", err, consoleURLs[0], status)
	}
}

// checkDemoConsole asks the dev cluster's console who the caller is, with
// the token of its URL (the cluster's admin, as the local console acts with
// its user's credentials) and without (refused).
func checkDemoConsole(ctx context.Context, t *testing.T, url, token string) {
	t.Helper()
	base, _, _ := strings.Cut(url, "#")
	api := strings.TrimSuffix(base, "/") + "/api/v1/whoami"
	get := func(bearer string) (int, string) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, api, nil)
		if err != nil {
			t.Fatal(err)
		}
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", api, err)
		}
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if status, body := get(token); status != http.StatusOK || !strings.Contains(body, `"mode":"local"`) {
		t.Errorf("GET whoami with the URL's token: %d %s, want 200 from a local console", status, body)
	}
	if status, body := get(""); status != http.StatusUnauthorized {
		t.Errorf("GET whoami without a token: %d %s, want 401", status, body)
	}
}
