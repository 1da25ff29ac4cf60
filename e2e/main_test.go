package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/partita-dev/partita/devcluster"
)

// The shared cluster of this test binary.
var (
	partitaBin  string
	clusterName string
	cluster     *devcluster.Cluster
	clientset   kubernetes.Interface
	// addons are the workload controllers the shared cluster runs.
	addons []string
	// externalKubeconfig is PARTITA_E2E_KUBECONFIG: a cluster with the chart
	// installed (e2e/kind/run.sh), instead of a dev cluster. Only the tests
	// that can run there (TestKind*, TestComponentPermissions) are run.
	externalKubeconfig string
)

const (
	e2eNodes       = 4
	e2eGPUsPerNode = 8
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	var err error
	if externalKubeconfig = os.Getenv("PARTITA_E2E_KUBECONFIG"); externalKubeconfig != "" {
		cfg, err := clientcmd.BuildConfigFromFlags("", externalKubeconfig)
		if err == nil {
			clientset, err = kubernetes.NewForConfig(cfg)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "e2e: PARTITA_E2E_KUBECONFIG:", err)
			return 1
		}
		return m.Run()
	}
	partitaBin, err = findBinary()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	clusterName = fmt.Sprintf("e2e-%d", os.Getpid())
	if benchOnly() {
		// The benchmarks bring up clusters of their own; an idle shared
		// cluster beside them (its controllers, addons and console) would
		// take CPU from what they measure.
		fmt.Fprintln(os.Stderr, "e2e: PARTITA_E2E_BENCH=only: no shared dev cluster; only the benchmarks run")
		return m.Run()
	}
	opts := devcluster.DefaultOptions()
	opts.Name = clusterName
	cluster, err = devcluster.New(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	start := time.Now()
	args := []string{"dev", "up", "--name", clusterName, "--nodes", fmt.Sprint(e2eNodes), "--gpus-per-node", fmt.Sprint(e2eGPUsPerNode)}
	// The workload controllers the workload map's tests run against
	// (workloads_test.go), where `make cluster-bins` built them.
	if addons = builtAddons(cluster); len(addons) > 0 {
		args = append(args, "--addons", strings.Join(addons, ","))
	}
	out, err := partita(context.Background(), args...)
	fmt.Fprintf(os.Stderr, "e2e: partita dev up took %.1fs\n%s", time.Since(start).Seconds(), out)
	if os.Getenv("PARTITA_E2E_KEEP") == "" {
		defer func() {
			if out, err := partita(context.Background(), "dev", "down", "--name", clusterName); err != nil {
				fmt.Fprintf(os.Stderr, "e2e: dev down: %v\n%s", err, out)
			}
		}()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: dev up failed: %v\n", err)
		// dev down deletes the logs: show the ends of Partita's and the
		// addons' here.
		logs, _ := filepath.Glob(filepath.Join(cluster.LogsDir(), "partita-*.log"))
		for _, l := range logs {
			if b, rerr := os.ReadFile(l); rerr == nil {
				fmt.Fprintf(os.Stderr, "e2e: the end of %s:\n%s\n", filepath.Base(l), b[max(0, len(b)-3000):])
			}
		}
		return 1
	}
	clientset, err = cluster.Clientset()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	return m.Run()
}

// builtAddons are the addons whose controllers are built.
func builtAddons(c *devcluster.Cluster) []string {
	var out []string
	for _, a := range devcluster.Addons() {
		if _, err := os.Stat(filepath.Join(c.AddonDir(a), "bin", a.Name)); err == nil {
			out = append(out, a.Name)
		}
	}
	return out
}

// findBinary returns PARTITA_BIN or builds the binary into a temp dir.
func findBinary() (string, error) {
	if b := os.Getenv("PARTITA_BIN"); b != "" {
		if _, err := os.Stat(b); err != nil {
			return "", fmt.Errorf("PARTITA_BIN=%s: %w", b, err)
		}
		return b, nil
	}
	dir, err := os.MkdirTemp("", "partita-e2e")
	if err != nil {
		return "", fmt.Errorf("create temp dir: %w", err)
	}
	bin := filepath.Join(dir, "partita")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/partita-dev/partita/cmd/partita")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build partita: %w\n%s", err, out)
	}
	return bin, nil
}

// partita runs the partita binary with a timeout and returns its combined output.
func partita(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, partitaBin, args...)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("partita %s: %w", strings.Join(args, " "), err)
	}
	return out.String(), nil
}

// testContext returns a context that ends with the test or after d.
func testContext(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	if clientset == nil {
		t.Skip("PARTITA_E2E_BENCH=only: the shared dev cluster this test runs on is not up")
	}
	return benchContext(t, d)
}

// benchContext is testContext for the benchmarks, which bring up clusters
// of their own and so also run with PARTITA_E2E_BENCH=only.
func benchContext(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// benchOnly: PARTITA_E2E_BENCH=only runs the benchmarks without the shared
// dev cluster (every other test skips).
func benchOnly() bool { return os.Getenv("PARTITA_E2E_BENCH") == "only" }
