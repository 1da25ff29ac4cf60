// Package realnode holds the end-to-end tests of Partita's chart on the dev
// cluster's real node. TestMain brings up one cluster with `partita dev up
// --real-node --mode chart` (kwok nodes with simulated GPUs beside a real
// kubelet and containerd on this host, and Partita installed from its Helm
// chart onto the real node, release partita in partita-system), runs the
// tests in file order and tears it down. The last test stops the node the
// hard way and checks that `dev down` leaves the host as it found it.
//
// The tests need root, the Debian packages of hack/real-node-deps.sh, the
// cluster binaries (make cluster-bins) and the images (make images). Only
// a non-root run skips them, saying so; anything else missing fails.
// PARTITA_BIN names the partita binary (make sets it; its images are in
// images/ beside it), PARTITA_IMAGES_DIR overrides the images' directory.
package realnode

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/partita-dev/partita/devcluster"
	"github.com/partita-dev/partita/devcluster/realnode"
	"github.com/partita-dev/partita/dra"
)

var (
	partitaBin  string
	imagesDir   string
	clusterName string
	cluster     *devcluster.Cluster
	clientset   kubernetes.Interface
	// before is the host before `dev up`, for TestRealNodeDownRestoresHost.
	before realnode.HostSnapshot
	// skipReason is set where the host cannot run a real node at all
	// (not root); every test skips with it.
	skipReason string
	// down is set once the cluster is gone.
	down bool
	// backend is the cluster's GPU backend: PARTITA_E2E_GPU_BACKEND
	// (extender by default; make test-real-node-dra sets dra).
	backend = dra.BackendExtender
)

const (
	simulatedNodes = 2
	gpusPerNode    = 4
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	var err error
	if partitaBin, err = findBinary(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e/realnode:", err)
		return 1
	}
	imagesDir = os.Getenv("PARTITA_IMAGES_DIR")
	if imagesDir == "" {
		imagesDir = filepath.Join(filepath.Dir(partitaBin), "images")
	}
	opts := devcluster.DefaultOptions()
	if err := realnode.CheckHost(opts.BinDir, imagesDir); err != nil {
		if realnode.IsNotRoot(err) {
			skipReason = "the real node needs root (kubelet and containerd mount, create cgroups, change iptables and sysctls): run the tests as root"
			fmt.Fprintln(os.Stderr, "e2e/realnode: SKIPPING every test:", skipReason)
			return m.Run()
		}
		fmt.Fprintf(os.Stderr, "e2e/realnode: %v\n(make test installs the packages with hack/real-node-deps.sh and builds the images with make images)\n", err)
		return 1
	}
	removeLeftover()
	if before, err = realnode.TakeHostSnapshot(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "e2e/realnode: read the host's state:", err)
		return 1
	}
	if backend, err = dra.ParseBackend(os.Getenv("PARTITA_E2E_GPU_BACKEND")); err != nil {
		fmt.Fprintln(os.Stderr, "e2e/realnode: PARTITA_E2E_GPU_BACKEND:", err)
		return 1
	}
	clusterName = fmt.Sprintf("rn-%d", os.Getpid())
	opts.Name = clusterName
	if cluster, err = devcluster.New(opts); err != nil {
		fmt.Fprintln(os.Stderr, "e2e/realnode:", err)
		return 1
	}
	start := time.Now()
	out, err := partita(context.Background(), "dev", "up", "--name", clusterName, "--real-node", "--mode", "chart",
		"--gpu-backend", string(backend),
		"--nodes", fmt.Sprint(simulatedNodes), "--gpus-per-node", fmt.Sprint(gpusPerNode), "--images-dir", imagesDir,
		// The S3 store the Model tests read from (models_test.go).
		"--addons", devcluster.AddonS3)
	fmt.Fprintf(os.Stderr, "e2e/realnode: partita dev up --real-node --mode chart took %.1fs\n%s", time.Since(start).Seconds(), out)
	if os.Getenv("PARTITA_E2E_KEEP") == "" {
		defer func() {
			if down {
				return
			}
			if out, err := partita(context.Background(), "dev", "down", "--name", clusterName); err != nil {
				fmt.Fprintf(os.Stderr, "e2e/realnode: dev down: %v\n%s", err, out)
			}
		}()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e/realnode: dev up failed: %v\n", err)
		return 1
	}
	if clientset, err = cluster.Clientset(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e/realnode:", err)
		return 1
	}
	return m.Run()
}

// removeLeftover takes down the real node of an earlier run of these tests
// that died without its dev down (one real node per host: it would refuse
// this run's); a cluster rn-<pid> whose process is gone is one.
func removeLeftover() {
	b, err := os.ReadFile(filepath.Join(realnode.RunDir, "state.json"))
	if err != nil {
		return
	}
	var st struct{ Cluster string }
	if json.Unmarshal(b, &st) != nil {
		return
	}
	pid, err := strconv.Atoi(strings.TrimPrefix(st.Cluster, "rn-"))
	if err != nil || !strings.HasPrefix(st.Cluster, "rn-") || syscall.Kill(pid, 0) == nil {
		return
	}
	fmt.Fprintf(os.Stderr, "e2e/realnode: taking down cluster %s, left by an earlier run\n", st.Cluster)
	if out, err := partita(context.Background(), "dev", "down", "--name", st.Cluster); err != nil {
		fmt.Fprintf(os.Stderr, "e2e/realnode: dev down --name %s: %v\n%s", st.Cluster, err, out)
	}
}

// findBinary returns PARTITA_BIN or builds the binary into a temp dir.
func findBinary() (string, error) {
	if b := os.Getenv("PARTITA_BIN"); b != "" {
		if _, err := os.Stat(b); err != nil {
			return "", fmt.Errorf("PARTITA_BIN=%s: %w", b, err)
		}
		return filepath.Abs(b)
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
	if os.Getenv("PARTITA_IMAGES_DIR") == "" {
		// The repository's images (make images), two levels up.
		abs, err := filepath.Abs(filepath.Join("..", "..", "bin", "images"))
		if err == nil {
			_ = os.Setenv("PARTITA_IMAGES_DIR", abs)
		}
	}
	return bin, nil
}

// partita runs the partita binary with a timeout and returns its output.
func partita(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, partitaBin, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("partita %s: %w", strings.Join(args, " "), err)
	}
	return out.String(), nil
}

// needCluster skips a test where the host cannot run the real node and
// fails it when the cluster is already down.
func needCluster(t *testing.T) {
	t.Helper()
	if skipReason != "" {
		t.Skip(skipReason)
	}
	if down {
		t.Fatal("the cluster is down already (TestRealNodeDownRestoresHost ran)")
	}
	draTest := strings.HasPrefix(t.Name(), "TestRealNodeDRA")
	switch {
	case backend == dra.BackendDRA && !draTest && !backendNeutral[strings.SplitN(t.Name(), "/", 2)[0]]:
		t.Skip("a test of the extender backend; this run's cluster has the dra backend (PARTITA_E2E_GPU_BACKEND=dra)")
	case backend != dra.BackendDRA && draTest:
		t.Skip("a test of the dra backend: run with PARTITA_E2E_GPU_BACKEND=dra (make test-real-node-dra)")
	}
}

// backendNeutral are the tests that hold with either GPU backend.
var backendNeutral = map[string]bool{
	"TestRealNodeJoined": true, "TestRealNodeNoGPUPodSeesVoid": true, "TestRealNodeDownRestoresHost": true,
	// The interposer reaches a hami-core slice through the NRI hook or
	// through the claim's CDI spec; the webhook answers only the API
	// server whichever backend it serves.
	"TestRealNodeHAMiCoreSliceGetsThePreload": true, "TestRealNodeWebhookAnswersOnlyTheAPIServer": true,
}

// testContext returns a context that ends with the test or after d.
func testContext(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// poll calls cond until it reports true; past d the test fails with what
// cond saw last.
func poll(t *testing.T, d time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ok, msg := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %s: %s", what, d, msg)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// kubectl runs the cluster's kubectl as admin.
func kubectl(ctx context.Context, t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(cluster.BinDir(), "kubectl"), append([]string{"--kubeconfig", cluster.KubeconfigPath()}, args...)...)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("kubectl %s: %v\n%s%s", strings.Join(args, " "), err, out.String(), stderr.String())
	}
	return out.String()
}

// kubectlOutput runs the cluster's kubectl as admin and returns its
// standard output, and an error with its standard error when it fails
// (kubectl exec: when the command in the container fails).
func kubectlOutput(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(cluster.BinDir(), "kubectl"), append([]string{"--kubeconfig", cluster.KubeconfigPath()}, args...)...)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	return out.String(), nil
}

// helm runs the cluster's helm as admin.
func helm(ctx context.Context, t *testing.T, args ...string) string {
	t.Helper()
	out, err := cluster.Helm(ctx, args...)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	return out
}

func execCommand(ctx context.Context, bin string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, bin, args...)
}
