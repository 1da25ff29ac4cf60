// Package dra tests the dra GPU backend end to end on a dev cluster of its
// own (partita dev up --gpu-backend dra), started once for the package:
// kwok nodes whose GPUs the agent publishes as ResourceSlices of
// gpu.partita.dev, the webhook turning every request dialect into claims,
// and the real kube-scheduler's DRA plugin placing them.
package dra

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

	"github.com/partita-dev/partita/devcluster"
)

// The cluster: nodes × GPUs of the default model.
const (
	nodes       = 4
	gpusPerNode = 2
)

var (
	partitaBin  string
	clusterName string
	cluster     *devcluster.Cluster
	clientset   kubernetes.Interface
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	var err error
	if partitaBin, err = findBinary(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e/dra:", err)
		return 1
	}
	clusterName = fmt.Sprintf("e2e-dra-%d", os.Getpid())
	opts := devcluster.DefaultOptions()
	opts.Name = clusterName
	if cluster, err = devcluster.New(opts); err != nil {
		fmt.Fprintln(os.Stderr, "e2e/dra:", err)
		return 1
	}
	start := time.Now()
	out, err := partita(context.Background(), "dev", "up", "--name", clusterName, "--gpu-backend", "dra",
		"--nodes", fmt.Sprint(nodes), "--gpus-per-node", fmt.Sprint(gpusPerNode))
	fmt.Fprintf(os.Stderr, "e2e/dra: partita dev up --gpu-backend dra took %.1fs\n%s", time.Since(start).Seconds(), out)
	if os.Getenv("PARTITA_E2E_KEEP") == "" {
		defer func() {
			if out, err := partita(context.Background(), "dev", "down", "--name", clusterName); err != nil {
				fmt.Fprintf(os.Stderr, "e2e/dra: dev down: %v\n%s", err, out)
			}
		}()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e/dra: dev up failed: %v\n", err)
		return 1
	}
	if clientset, err = cluster.Clientset(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e/dra:", err)
		return 1
	}
	return m.Run()
}

// findBinary returns PARTITA_BIN or builds the binary into a temp dir.
func findBinary() (string, error) {
	if b := os.Getenv("PARTITA_BIN"); b != "" {
		if _, err := os.Stat(b); err != nil {
			return "", fmt.Errorf("PARTITA_BIN=%s: %w", b, err)
		}
		return b, nil
	}
	dir, err := os.MkdirTemp("", "partita-e2e-dra")
	if err != nil {
		return "", fmt.Errorf("create temp dir: %w", err)
	}
	bin := filepath.Join(dir, "partita")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/partita-dev/partita/cmd/partita").CombinedOutput(); err != nil {
		return "", fmt.Errorf("build partita: %w\n%s", err, out)
	}
	return bin, nil
}

// partita runs the partita binary and returns its combined output.
func partita(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, partitaBin, args...)
	if cluster != nil {
		cmd.Env = append(os.Environ(), "KUBECONFIG="+cluster.KubeconfigPath())
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("partita %s: %w", strings.Join(args, " "), err)
	}
	return out.String(), nil
}

func testContext(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}
