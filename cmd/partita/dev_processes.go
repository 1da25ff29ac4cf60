package main

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/console"
	"github.com/partita-dev/partita/devcluster"
	"github.com/partita-dev/partita/devcluster/realnode"
	"github.com/partita-dev/partita/dra"
	"github.com/partita-dev/partita/extender"
)

// extenderSA is the chart's ServiceAccount of the extender, which the dev
// cluster's webhook trusts.
const extenderSA = devcluster.ChartRelease + "-extender"

// devHostProcesses lists Partita's own processes that `partita dev up` runs on
// the host for the cluster, each on loopback ports chosen once per cluster
// ({port:NAME}, stable across restarts, so the webhook configurations'
// URLs stay right) and with the token of its chart ServiceAccount (never as
// admin, never impersonating).
//
// In mode chart the chart runs the webhook, the extender and the real
// node's agent; the host keeps only an agent for the simulated nodes.
//
// With the dra GPU backend the agent publishes ResourceSlices and the
// webhook writes claims; the real node (mode host) gets an agent of its own
// that is the node's DRA kubelet plugin, registered in the real kubelet's
// plugin directories and writing CDI specs where its containerd reads them.
//
// extra's flags go at the end of the webhook's and the extender's command
// lines (dev up's --extender-flag, and its hidden --webhook-flag for
// measuring what an option costs), where they override the defaults above.
//
// In mode host the extender runs as replicas extender, extender-2, ...
// (devExtenderReplicas), and kube-scheduler calls them through
// devExtenderProxy.
func devHostProcesses(mode devcluster.Mode, backend dra.Backend, realNode bool, extra extraFlags, replicas int) ([]devcluster.HostProcess, error) {
	if err := devcluster.CheckExtenderReplicas(replicas); err != nil {
		return nil, err
	}
	selector := v1alpha1.LabelGPUNode + "=true"
	realNodeAgent := backend == dra.BackendDRA && realNode && mode == devcluster.ModeHost
	if mode == devcluster.ModeChart || realNodeAgent {
		selector += "," + devcluster.SimulatedNodeSelector
	}
	agent := devcluster.HostProcess{
		Name: "agent",
		// One agent serves every simulated GPU node (and in mode host the
		// real node), with devices from their GPU Feature Discovery labels.
		Args: []string{"agent", "--kubeconfig", "{kubeconfig}",
			"--simulate-nodes=" + selector, devcluster.AgentNodeResourcesFlag(),
			// Heartbeats every 15s, so that the extender's 45s bound below
			// calls a stopped agent silent within a minute in tests.
			"--sync-interval", "2s", "--heartbeat-interval", "15s", "--overuse-report-interval", "1m",
			"--health-addr", "127.0.0.1:{port:agent}", "--v", "2"},
		ReadyURL:       "http://127.0.0.1:{port:agent}/readyz",
		ServiceAccount: devcluster.ChartRelease + "-agent",
	}
	wh := devcluster.HostProcess{
		Name: "webhook",
		// Registers its own Mutating- and ValidatingWebhookConfiguration
		// (url https://127.0.0.1:<port>, self-signed CA from the cluster
		// directory) once it is ready; kube-system and partita-system are
		// never blocked.
		Args: []string{"webhook", "--kubeconfig", "{kubeconfig}", "--dev-register",
			"--addr", "127.0.0.1:{port:webhook}",
			"--cert-dir", "{dir}/partita/webhook-certs", "--cert-rotation", "none",
			// Only the API server, with the client certificate dev up
			// gave it (devcluster.WebhookClientDir), is answered.
			"--client-ca-file", "{state}/webhook-client/" + extender.DevCAFile, "--client-allowed-names", devcluster.WebhookClientName,
			// As the chart does: only the extender's ServiceAccount may bind
			// with device annotations. The admin (system:masters) is not
			// trusted, so tests must not write system annotations as admin
			// outside kube-system.
			"--trusted-users", "system:serviceaccount:" + devcluster.PartitaNamespace + ":" + extenderSA, "--v", "2"},
		ReadyURL:       "https://127.0.0.1:{port:webhook}/readyz",
		ServiceAccount: devcluster.ChartRelease + "-webhook",
	}
	ext := devcluster.HostProcess{
		Name: devcluster.ExtenderName,
		// kube-scheduler reaches it through devExtenderProxy, over HTTPS
		// with the client certificate of devExtenderCertDir, which
		// devPrepare writes before kube-scheduler starts. Its Lease is in
		// Partita's namespace, where the chart's Role lets it elect itself.
		Args: []string{"extender", "--kubeconfig", "{kubeconfig}", "--addr", "127.0.0.1:{port:extender}",
			"--cert-dir", devExtenderCertDir, "--client-ca-file", devExtenderCertDir + "/" + extender.DevCAFile,
			"--leader-election-namespace", devcluster.PartitaNamespace,
			// A short shelter from eviction keeps the demo and the tests
			// quick; production keeps the default minute.
			"--preempt-min-runtime", "5s",
			// And a short wait before a head of line gets room held for it
			// (production: 3m).
			"--starvation-bound", "10s",
			// Three of the dev agent's heartbeats: a stopped agent's nodes
			// take no new pods after 45s (production: 3m for 1m).
			"--agent-heartbeat-timeout", "45s",
			// No kubelet restarts a host process: a leader that could not
			// renew its Lease (an API server at a full core) starts itself
			// again as a standby rather than leaving the cluster without it.
			"--on-lost-leadership=restart", "--v", "2"},
		ReadyURL:       "https://127.0.0.1:{port:extender}/readyz",
		ServiceAccount: extenderSA,
	}
	if backend == dra.BackendDRA {
		agent.Args = append(agent.Args, "--gpu-backend", string(dra.BackendDRA))
		wh.Args = append(wh.Args, "--gpu-backend", string(dra.BackendDRA))
	}
	wh.Args = append(wh.Args, extra.webhook...)
	if mode == devcluster.ModeChart {
		return []devcluster.HostProcess{agent, devConsole}, nil
	}
	exts := devExtenderReplicas(ext, replicas, extra.extender)
	procs := append(append([]devcluster.HostProcess{agent, wh}, exts...), devExtenderProxy(exts), devConsole, devModelCaches)
	if realNodeAgent {
		procs = append(procs, devRealNodeAgent)
	}
	return procs, nil
}

// devModelCaches are the model caches of the simulated nodes (mode host):
// one process takes up the prefetch requests of every simulated GPU node
// (the admission loop's, at admission, and spec.prefetch's), fetching and
// verifying each model into a cache per node and reporting it in the
// Model's status as a real node's cache does; kwok runs no kubelet, so
// nothing is mounted. file:// Models may name the cluster's model-files
// directory (devcluster.Cluster.ModelFilesDir), which the demo uses.
var devModelCaches = devcluster.HostProcess{
	Name: "model-cache",
	Args: []string{"model-cache", "--kubeconfig", "{kubeconfig}",
		"--simulate-nodes=" + v1alpha1.LabelGPUNode + "=true," + devcluster.SimulatedNodeSelector,
		"--cache-dir", "{state}/model-cache/cache", "--state-dir", "{state}/model-cache/state", "--cache-size", "2Gi",
		"--file-roots", "{state}/" + devcluster.ModelFilesDirName,
		"--health-addr", "127.0.0.1:{port:model-cache}", "--v", "1"},
	ReadyURL:       "http://127.0.0.1:{port:model-cache}/readyz",
	ServiceAccount: devcluster.ChartRelease + "-model-cache",
}

// devLeaderElectionFlags are the extender replicas' Lease timings: a
// killed leader is replaced within about 7 seconds (its Lease expires
// after 6, the others try every second), where the defaults take up to 17;
// a 4-second renew deadline still rides out a slow API server on a busy
// 2-core box (a leader that misses it starts itself again as a standby:
// --on-lost-leadership=restart).
var devLeaderElectionFlags = []string{"--leader-election-lease-duration=6s", "--leader-election-renew-deadline=4s", "--leader-election-retry-period=1s"}

// devExtenderReplicas makes n replicas of the extender ext, each on its own
// port ({port:NAME}) with its own log, and extra (--extender-flag's) at
// the end of every command line. One replica is ext as it always was;
// with more, each names itself in the Lease (--replica-name, so that the
// Lease says which leads) and the Lease's timings are short
// (devLeaderElectionFlags), so that a test that kills the leader sees
// another take over in seconds.
func devExtenderReplicas(ext devcluster.HostProcess, n int, extra []string) []devcluster.HostProcess {
	out := make([]devcluster.HostProcess, n)
	for i := range out {
		name := devcluster.ExtenderReplicaName(i + 1)
		r := ext
		r.Name = name
		r.Args = make([]string, 0, len(ext.Args)+len(devLeaderElectionFlags)+2+len(extra))
		for _, a := range ext.Args {
			r.Args = append(r.Args, strings.ReplaceAll(a, "{port:"+devcluster.ExtenderName+"}", "{port:"+name+"}"))
		}
		if n > 1 {
			r.Args = append(append(r.Args, "--replica-name", name), devLeaderElectionFlags...)
		}
		r.Args = append(r.Args, extra...)
		r.ReadyURL = "https://127.0.0.1:{port:" + name + "}/readyz"
		out[i] = r
	}
	return out
}

// devExtenderProxy is what kube-scheduler calls (devExtenderURL): `partita
// dev extender-proxy` forwards each connection, TLS and all, to a replica,
// the leader first. It runs with one replica too: kube-scheduler's
// configuration is written once, when the cluster is created, so only a
// proxy that is always there lets a later dev up add replicas it reaches.
// Its command line names the cluster's state (the CA it verifies the
// replicas' probes with), so dev down stops it with the rest.
func devExtenderProxy(replicas []devcluster.HostProcess) devcluster.HostProcess {
	args := []string{"dev", "extender-proxy", "--listen", "127.0.0.1:{port:" + devcluster.ExtenderProxyName + "}",
		"--probe-ca-file", devExtenderCertDir + "/" + extender.DevCAFile}
	for _, r := range replicas {
		args = append(args, "--backend", "127.0.0.1:{port:"+r.Name+"}")
	}
	return devcluster.HostProcess{
		Name: devcluster.ExtenderProxyName,
		Args: append(args, "--v", "2"),
		// Through the proxy to a replica: the whole path kube-scheduler
		// takes.
		ReadyURL: "https://127.0.0.1:{port:" + devcluster.ExtenderProxyName + "}/readyz",
	}
}

// extraFlags are flags added to host processes' command lines.
type extraFlags struct {
	webhook, extender []string
}

// devRealNodeAgent serves the real node in dra mode (mode host): its
// simulated GPUs as the node's pool, published by the DRA kubelet plugin it
// registers with the node's kubelet (whose --root-dir and containerd's CDI
// directory are under the cluster's state, realnode.Node.KubeletRootDir and
// CDIDir), which writes each claim's CDI spec.
var devRealNodeAgent = devcluster.HostProcess{
	Name: "agent-" + realnode.NodeName,
	Args: []string{"agent", "--kubeconfig", "{kubeconfig}", "--node-name", realnode.NodeName,
		"--simulate", "{gpus}", "--gpu-backend", string(dra.BackendDRA),
		"--kubelet-dir", "{state}/real-node/kubelet/root", "--cdi-dir", "{state}/real-node/cdi",
		"--state-dir", "{state}/real-node/agent-state",
		"--sync-interval", "2s", "--heartbeat-interval", "15s",
		"--health-addr", "127.0.0.1:{port:agent-" + realnode.NodeName + "}", "--v", "2"},
	ReadyURL:       "http://127.0.0.1:{port:agent-" + realnode.NodeName + "}/readyz",
	ServiceAccount: devcluster.ChartRelease + "-agent",
}

// devConsole is the console of the dev cluster: `partita console` in local
// mode, as its user runs it, with the cluster's admin kubeconfig (no
// ServiceAccount: a local console acts with its user's own credentials) on
// a loopback port of the cluster. Its token is kept in the cluster's state
// (devConsoleTokenFile), so the URL devConsoleURL prints stays the same
// across restarts; dev down stops it with the rest.
var devConsole = devcluster.HostProcess{
	Name: "console",
	Args: []string{"console", "--kubeconfig", "{kubeconfig}", "--addr", "127.0.0.1:{port:console}",
		"--token-file", devConsoleTokenFile, "--partita-namespace", devcluster.PartitaNamespace,
		// The demo's steps are seconds apart; so are its samples.
		"--sample-interval", "5s", "--v", "2"},
	ReadyURL: "http://127.0.0.1:{port:console}/readyz",
}

// devConsoleTokenFile is where the dev console keeps its URL's token.
const devConsoleTokenFile = "{state}/console-token"

// devConsoleURL is the URL of the dev cluster's console, with its token,
// as `partita console` prints it.
func devConsoleURL(c *devcluster.Cluster) (string, error) {
	port, err := c.Port(devConsole.Name)
	if err != nil {
		return "", err
	}
	tok, err := console.LocalToken(strings.ReplaceAll(devConsoleTokenFile, "{state}", c.StateDir()))
	if err != nil {
		return "", fmt.Errorf("the dev console's token: %w", err)
	}
	return fmt.Sprintf("http://127.0.0.1:%d/#token=%s", port, tok), nil
}

// devPrepare runs before the dev cluster starts or repairs anything: it
// writes the extender's serving certificate, kube-scheduler's client
// certificate and their CA into the cluster's state directory (kept while
// valid, renewed a month before they end), where kube-scheduler, started by
// kwokctl, and the extender read them. It also makes the directory of the
// simulated nodes' file:// Models (devModelCaches).
func devPrepare(stateDir string) error {
	if err := os.MkdirAll(filepath.Join(stateDir, devcluster.ModelFilesDirName), 0o755); err != nil {
		return fmt.Errorf("create the model files directory: %w", err)
	}
	return extender.EnsureDevCertificates(extender.DevCertificateOptions{
		Dir: strings.ReplaceAll(devExtenderCertDir, "{state}", stateDir),
		IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Now: time.Now(),
	})
}

// selfBinary is the path of the running partita binary.
func selfBinary() (string, error) {
	p, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("find the partita binary: %w", err)
	}
	return p, nil
}
