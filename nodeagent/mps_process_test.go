package nodeagent

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/klog/v2/textlogger"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/internal/envtestutil"
)

// hardware serves simulated devices as if they were real: the agent treats
// its node like an NVML one, so mps mode runs real processes through
// ExecRunner rather than simulated daemons.
type hardware struct{ *Simulated }

// Environment of the agent process TestMPSAgentProcess runs.
const (
	envAgentKubeconfig = "PARTITA_TEST_MPS_AGENT_KUBECONFIG"
	envAgentControl    = "PARTITA_TEST_MPS_AGENT_CONTROL"
	envAgentMPSDir     = "PARTITA_TEST_MPS_AGENT_MPS_DIR"
	envAgentStateDir   = "PARTITA_TEST_MPS_AGENT_STATE_DIR"
)

// TestMPSAgentProcess is not a test of its own: the tests below run the
// test binary again with it and the environment above, and it runs a real
// agent in mps mode in that process, on node n1 with two devices, until
// SIGTERM (a graceful stop) or SIGKILL.
func TestMPSAgentProcess(t *testing.T) {
	kubeconfig := os.Getenv(envAgentKubeconfig)
	if kubeconfig == "" {
		t.Skip("runs only as the agent process of TestMPSDaemonsOutliveTheAgent")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	log := textlogger.NewLogger(textlogger.NewConfig(textlogger.Verbosity(2), textlogger.Output(os.Stderr)))
	a, err := New(cfg, Options{
		NodeName: "n1", Mode: v1alpha1.IsolationMPS,
		Backends:     StaticBackend(hardware{NewSimulated("n1", h100(2))}),
		SyncInterval: 100 * time.Millisecond, HeartbeatInterval: time.Hour, Recorder: &recorder{},
		MPS: MPSConfig{ControlPath: os.Getenv(envAgentControl), Dir: os.Getenv(envAgentMPSDir), StateDir: os.Getenv(envAgentStateDir)},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Run(logr.NewContext(ctx, log)); err != nil {
		t.Fatal(err)
	}
}

// writeKubeconfig writes a kubeconfig for cfg.
func writeKubeconfig(t *testing.T, cfg *rest.Config) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["envtest"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData, CertificateAuthority: cfg.CAFile}
	kc.AuthInfos["envtest"] = &clientcmdapi.AuthInfo{
		ClientCertificateData: cfg.CertData, ClientCertificate: cfg.CertFile,
		ClientKeyData: cfg.KeyData, ClientKey: cfg.KeyFile, Token: cfg.BearerToken,
	}
	kc.Contexts["envtest"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "envtest"}
	kc.CurrentContext = "envtest"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// mpsNode is the directories of a node's MPS daemons, for tests that run
// real ones through testdata/fake-mps-control.
type mpsNode struct {
	control, mpsDir, stateDir string
	uuids                     []string
}

func newMPSNode(t *testing.T, node string, devices int) *mpsNode {
	t.Helper()
	control, err := filepath.Abs("testdata/fake-mps-control")
	if err != nil {
		t.Fatal(err)
	}
	n := &mpsNode{control: control, mpsDir: t.TempDir(), stateDir: t.TempDir()}
	for i := range devices {
		n.uuids = append(n.uuids, SimulatedUUID(node, i))
	}
	// Whatever happens, no daemon outlives the test.
	t.Cleanup(func() {
		for _, u := range n.uuids {
			if p, ok := n.find(u); ok {
				_ = (ExecRunner{}).Signal(p, syscall.SIGKILL)
			}
		}
	})
	return n
}

func (n *mpsNode) pipe(uuid string) string { return filepath.Join(n.mpsDir, uuid, "pipe") }

// find is the running daemon of a device.
func (n *mpsNode) find(uuid string) (DaemonProcess, bool) {
	return ExecRunner{}.Find(n.pipe(uuid), n.control)
}

// starts counts the daemons ever started for a device.
func (n *mpsNode) starts(uuid string) int {
	b, _ := os.ReadFile(filepath.Join(n.mpsDir, uuid, "log", "starts"))
	return len(strings.Fields(string(b)))
}

// setting is what a device's daemon was last set to ("default_...").
func (n *mpsNode) setting(uuid, name string) string {
	b, _ := os.ReadFile(filepath.Join(n.pipe(uuid), name))
	return strings.TrimSpace(string(b))
}

// daemons are the running daemons by device, and a description of them.
func (n *mpsNode) daemons() (map[string]DaemonProcess, string) {
	out := map[string]DaemonProcess{}
	var desc []string
	for _, u := range n.uuids {
		p, ok := n.find(u)
		if ok {
			out[u] = p
		}
		desc = append(desc, fmt.Sprintf("%s: running=%v pid=%d starts=%d", u, ok, p.PID, n.starts(u)))
	}
	return out, strings.Join(desc, "; ")
}

// startAgentProcess runs TestMPSAgentProcess in a child process.
func startAgentProcess(t *testing.T, kubeconfig string, n *mpsNode, name string) (*exec.Cmd, string) {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestMPSAgentProcess$", "-test.v") //nolint:gosec // the test binary itself
	cmd.Env = append(os.Environ(),
		envAgentKubeconfig+"="+kubeconfig, envAgentControl+"="+n.control,
		envAgentMPSDir+"="+n.mpsDir, envAgentStateDir+"="+n.stateDir)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	_ = logFile.Close()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("log of %s:\n%s", name, b)
		}
	})
	return cmd, logPath
}

// TestMPSDaemonsOutliveTheAgent runs real agent processes in mps mode with
// real daemon processes (testdata/fake-mps-control daemonises and writes
// its PID file as nvidia-cuda-mps-control does): killing the agent with
// SIGKILL, or stopping it gracefully, leaves the daemons running; the next
// agent adopts them, starting none, and sets their limits; a node that
// leaves mps mode gets them ended.
func TestMPSDaemonsOutliveTheAgent(t *testing.T) {
	cfg, c := envtestutil.Start(t)
	createNode(t, c, "n1", nil)
	kubeconfig := writeKubeconfig(t, cfg)
	n := newMPSNode(t, "n1", 2)

	agent, _ := startAgentProcess(t, kubeconfig, n, "agent-1")
	var first map[string]DaemonProcess
	// The agent records a daemon just after its PID file appears: wait for
	// the record too, or a fast reader sees one daemon recorded of two.
	waitFor(t, "a daemon per device with its limits, both recorded", func() (bool, error) {
		var desc string
		first, desc = n.daemons()
		recorded := recordedUUIDs(t, n.stateDir)
		return len(first) == 2 && len(recorded) == 2 && n.setting(n.uuids[1], "default_device_pinned_mem_limit.0") == "1M",
			fmt.Errorf("%s; recorded %v", desc, recorded)
	})

	// The agent is killed (OOM, a node problem): the daemons do not notice.
	if err := agent.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = agent.Wait()
	time.Sleep(2 * mpsPoll)
	if now, desc := n.daemons(); len(now) != 2 || now[n.uuids[0]] != first[n.uuids[0]] || now[n.uuids[1]] != first[n.uuids[1]] {
		t.Fatalf("after SIGKILL of the agent: %s; want the same two daemons running", desc)
	}

	// While no agent runs, a pod takes 20Gi of device 0: the next agent
	// must set the new limits on the daemon it adopts, and on its running
	// server.
	if err := os.WriteFile(filepath.Join(n.pipe(n.uuids[0]), "server_list"), []byte("4242\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns"}}); err != nil {
		t.Fatal(err)
	}
	pod := heldPod("p", "n1", "20Gi", 0)
	pod.UID = ""
	if err := c.Create(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	agent, logPath := startAgentProcess(t, kubeconfig, n, "agent-2")
	waitFor(t, "the new agent sets the adopted daemon's new limits", func() (bool, error) {
		got, server := n.setting(n.uuids[0], "default_device_pinned_mem_limit.0"), n.setting(n.uuids[0], "device_pinned_mem_limit.4242.0")
		return got == "20480M" && server == "20480M", fmt.Errorf("device 0 pinned memory default %q, server 4242's %q", got, server)
	})
	now, desc := n.daemons()
	if now[n.uuids[0]] != first[n.uuids[0]] || now[n.uuids[1]] != first[n.uuids[1]] || n.starts(n.uuids[0]) != 1 || n.starts(n.uuids[1]) != 1 {
		t.Errorf("after the restart: %s; want the first agent's daemons, each started once", desc)
	}
	if b, _ := os.ReadFile(logPath); strings.Count(string(b), "Adopted the MPS control daemon a previous agent started") != 2 {
		t.Errorf("the new agent's log does not say it adopted both daemons:\n%s", b)
	}

	// A graceful stop (an upgrade) leaves them running too: no quit.
	if err := agent.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := agent.Wait(); err != nil {
		t.Errorf("agent did not stop cleanly: %v", err)
	}
	if now, desc := n.daemons(); len(now) != 2 || now[n.uuids[0]] != first[n.uuids[0]] {
		t.Fatalf("after a graceful stop: %s; want the same two daemons running", desc)
	}

	// One daemon crashes while no agent runs; then the node leaves mps mode
	// (the operator pins time-slicing): the next agent ends the daemon left.
	_ = (ExecRunner{}).Signal(first[n.uuids[1]], syscall.SIGKILL)
	metrics := NewMetrics()
	runAgent(t, cfg, Options{
		NodeName: "n1", Mode: v1alpha1.IsolationTimeSlicing, Metrics: metrics,
		Backends: StaticBackend(hardware{NewSimulated("n1", h100(2))}),
		MPS:      MPSConfig{ControlPath: n.control, Dir: n.mpsDir, StateDir: n.stateDir},
	})
	waitFor(t, "the daemons ended", func() (bool, error) {
		now, desc := n.daemons()
		return len(now) == 0 && len(recordedUUIDs(t, n.stateDir)) == 0, fmt.Errorf("%s", desc)
	})
	if n.starts(n.uuids[1]) != 1 {
		t.Errorf("device 1's daemon was started %d times, want once (not again in time-slicing mode)", n.starts(n.uuids[1]))
	}
}

// TestMPSKeeperKeepsDaemonsForTheAgent runs the keeper as the chart does
// (--mps-daemons=keeper): the agent only hands the devices over, the
// keeper runs real daemons, and they survive both the agent and a restart
// of the keeper itself, which adopts them.
func TestMPSKeeperKeepsDaemonsForTheAgent(t *testing.T) {
	cfg, c := envtestutil.Start(t)
	createNode(t, c, "n1", nil)
	n := newMPSNode(t, "n1", 2)
	mps := MPSConfig{ControlPath: n.control, Dir: n.mpsDir, StateDir: n.stateDir}
	runKeeper := func() func() {
		k, err := NewMPSKeeper(KeeperOptions{Node: "n1", MPS: mps, Interval: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- k.Run(ctx) }()
		return func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("keeper: %v", err)
			}
		}
	}
	stopKeeper := runKeeper()
	agentMPS := mps
	agentMPS.Keeper = true
	_, stopAgent := runAgent(t, cfg, Options{
		NodeName: "n1", Mode: v1alpha1.IsolationMPS,
		Backends: StaticBackend(hardware{NewSimulated("n1", h100(2))}), MPS: agentMPS,
	})
	var first map[string]DaemonProcess
	waitFor(t, "the keeper runs a daemon per device with its limits", func() (bool, error) {
		var desc string
		first, desc = n.daemons()
		return len(first) == 2 && n.setting(n.uuids[1], "default_active_thread_percentage") == "100", fmt.Errorf("%s", desc)
	})
	stopAgent()
	stopKeeper()
	if now, desc := n.daemons(); len(now) != 2 {
		t.Fatalf("after the agent and the keeper stopped: %s; want both daemons running", desc)
	}
	// A new keeper adopts them; the agent, back in time-slicing mode, has
	// them ended through it.
	defer runKeeper()()
	time.Sleep(200 * time.Millisecond)
	if now, desc := n.daemons(); now[n.uuids[0]] != first[n.uuids[0]] || n.starts(n.uuids[0]) != 1 {
		t.Errorf("after the keeper restarted: %s; want the same daemons, started once", desc)
	}
	agentMPS.Keeper = true
	runAgent(t, cfg, Options{
		NodeName: "n1", Mode: v1alpha1.IsolationTimeSlicing,
		Backends: StaticBackend(hardware{NewSimulated("n1", h100(2))}), MPS: agentMPS,
	})
	waitFor(t, "the keeper ends the daemons", func() (bool, error) {
		now, desc := n.daemons()
		return len(now) == 0, fmt.Errorf("%s", desc)
	})
}
