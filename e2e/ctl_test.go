package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/devcluster"
	pt "github.com/partita-dev/partita/internal/partitatest"
	"github.com/partita-dev/partita/report"
)

// TestCtl runs `partita ctl` and `kubectl partita` the way a user does, on
// the shared cluster: a fractional pod shows on its device in `nodes`, and
// `why` explains, with numbers, a pod that asks for more GPUs than a node
// has.
func TestCtl(t *testing.T) {
	ctx := testContext(t, 5*time.Minute)
	ensureGPUPriorityClass(ctx, t, clientset)
	ns := extNamespace(ctx, t, clientset)
	t.Cleanup(func() { deletePods(ctx, t, ns) })
	kubeconfig := cluster.KubeconfigPath()
	c := crClient(t)

	// kubectl finds plugins on PATH by name: a kubectl-partita link to the
	// binary under test, first on PATH, is what installing the plugin does.
	pluginDir := t.TempDir()
	if err := os.Symlink(partitaBin, filepath.Join(pluginDir, "kubectl-partita")); err != nil {
		t.Fatal(err)
	}
	kubectlPartita := func(args ...string) (string, error) {
		bin := filepath.Join(pluginDir, "kubectl-partita")
		kubectlBin := filepath.Join(devcluster.CacheDir(), "bin", "k8s-"+devcluster.K8sVersion, "kubectl")
		// Through kubectl when the dev cluster's kubectl is built, which is
		// the user's way; the plugin binary itself otherwise.
		var cmd *exec.Cmd
		if _, err := os.Stat(kubectlBin); err == nil {
			cmd = exec.CommandContext(ctx, kubectlBin, append([]string{"partita"}, args...)...)
		} else {
			cmd = exec.CommandContext(ctx, bin, args...)
		}
		cmd.Env = append(os.Environ(), "PATH="+pluginDir+string(os.PathListSeparator)+os.Getenv("PATH"), "KUBECONFIG="+kubeconfig)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		return out.String(), err
	}

	quarter := extGPUPod(ns, "quarter", 250, 1, gpuNodes)
	tooBig := extGPUPod(ns, "too-big", 1000, 2*e2eGPUsPerNode, gpuNodes)
	createPods(ctx, t, clientset, []*corev1.Pod{quarter, tooBig}, 2)
	pods := waitPods(ctx, t, ns, 2*time.Minute, "quarter bound and too-big held for want of room", func(pods []corev1.Pod) (bool, string) {
		var bound, held bool
		for _, p := range pods {
			if p.Name == "quarter" && p.Spec.NodeName != "" && len(devicesOf(&p)) == 1 {
				bound = true
			}
			if c := admissionCondition(&p); p.Name == "too-big" && c != nil && c.Reason == v1alpha1.ReasonWaitingForCapacity {
				held = true
			}
		}
		return bound && held, fmt.Sprintf("quarter bound %v, too-big held by the admission loop %v", bound, held)
	})
	waitEvent(ctx, t, ns, "too-big", v1alpha1.ReasonWaitingForCapacity, "pod needs 16 GPUs")
	var node, uuid string
	for _, p := range pods {
		if p.Name == "quarter" {
			node, uuid = p.Spec.NodeName, devicesOf(&p)[0]
		}
	}
	var gn v1alpha1.GPUNode
	if err := c.Get(ctx, client.ObjectKey{Name: node}, &gn); err != nil {
		t.Fatal(err)
	}
	index := int32(-1)
	for _, d := range gn.Status.Devices {
		if d.UUID == uuid {
			index = d.Index
		}
	}

	t.Run("nodes shows the slice on its device", func(t *testing.T) {
		out, err := partita(ctx, "ctl", "nodes", "--kubeconfig", kubeconfig)
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		t.Logf("partita ctl nodes:\n%s", out)
		want := []string{node, fmt.Sprint(index), "0.25", "0.75 / ", ns + "/quarter 0.25"}
		if !hasRow(out, want) {
			t.Errorf("no row with %q in:\n%s", want, out)
		}
		if !hasRow(out, []string{"TOTAL", fmt.Sprintf("(%d", e2eNodes), fmt.Sprint(e2eNodes * e2eGPUsPerNode)}) {
			t.Errorf("no total line for %d nodes of %d GPUs in:\n%s", e2eNodes, e2eGPUsPerNode, out)
		}

		out, err = kubectlPartita("nodes", "-o", "json")
		if err != nil {
			t.Fatalf("kubectl partita nodes -o json: %v\n%s", err, out)
		}
		var rep report.NodesReport
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatalf("decode: %v\n%s", err, out)
		}
		found := false
		for _, n := range rep.Nodes {
			for _, d := range n.Devices {
				for _, s := range d.Slices {
					if s.Namespace == ns && s.Pod == "quarter" {
						found = n.Name == node && d.Index == index && s.Milli == 250 && d.FreeMilli == 750
					}
				}
			}
		}
		if !found {
			t.Errorf("-o json does not show %s/quarter with 250 milli on %s GPU %d, 750 free:\n%s", ns, node, index, out)
		}
	})

	t.Run("why explains the pod that cannot fit", func(t *testing.T) {
		out, err := kubectlPartita("why", "too-big", "-n", ns)
		if err != nil {
			t.Fatalf("kubectl partita why: %v\n%s", err, out)
		}
		t.Logf("kubectl partita why too-big:\n%s", out)
		for _, want := range []string{
			"asks for 16 whole GPUs",
			"it can never fit any of the 4 candidate nodes",
			"8 GPUs free; pod needs 16 whole GPUs",
			"partita-admitter on the pod",
			"WaitingForCapacity: pod needs 16 GPUs",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("why does not say %q:\n%s", want, out)
			}
		}
		out, err = partita(ctx, "ctl", "why", "too-big", "-n", ns, "-o", "json", "--kubeconfig", kubeconfig)
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		var rep report.WhyReport
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatalf("decode: %v\n%s", err, out)
		}
		var fit *report.Finding
		for i := range rep.Findings {
			if rep.Findings[i].Check == report.CheckFit {
				fit = &rep.Findings[i]
			}
		}
		if fit == nil || fit.Status != report.StatusBlocking || fit.Numbers["candidates"] != e2eNodes || fit.Numbers["fitting"] != 0 {
			t.Errorf("fit finding = %+v, want blocking with 4 candidates and 0 fitting", fit)
		}

		out, err = partita(ctx, "ctl", "why", "quarter", "-n", ns, "--kubeconfig", kubeconfig)
		if err != nil || !strings.Contains(out, fmt.Sprintf("is not waiting: it is bound to %s, GPU %d (0.25)", node, index)) {
			t.Errorf("why quarter: %v\n%s", err, out)
		}
		t.Logf("partita ctl why quarter:\n%s", out)
	})

	t.Run("bad input says what is wrong", func(t *testing.T) {
		out, err := partita(ctx, "ctl", "why", "ghost", "-n", ns, "--kubeconfig", kubeconfig)
		if err == nil || !strings.Contains(out, "pod not found") {
			t.Errorf("why ghost: %v\n%s", err, out)
		}
	})

	t.Run("queues shows the tree", func(t *testing.T) {
		suffix := strings.TrimPrefix(ns, "e2e-")
		org, team := "e2e-org-"+suffix, "e2e-team-"+suffix
		for _, q := range []*v1alpha1.Queue{
			pt.MakeQueue(org).GPU("8", "-1", 1).Obj(),
			pt.MakeQueue(team).Parent(org).GPU("4", "6", 1).Obj(),
		} {
			if err := c.Create(ctx, q); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Delete(context.WithoutCancel(ctx), q) })
		}
		out, err := partita(ctx, "ctl", "queues", "--kubeconfig", kubeconfig)
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		t.Logf("partita ctl queues:\n%s", out)
		if !hasRow(out, []string{org, "100", "8", "none"}) || !hasRow(out, []string{"  " + team, "100", "4", "6"}) {
			t.Errorf("queues does not show %s above %s, indented, with quota and limit:\n%s", org, team, out)
		}
	})
}

// hasRow reports whether a line of out holds every field, in order.
func hasRow(out string, fields []string) bool {
	for _, line := range strings.Split(out, "\n") {
		rest, ok := line, true
		for _, f := range fields {
			i := strings.Index(rest, f)
			if i < 0 {
				ok = false
				break
			}
			rest = rest[i+len(f):]
		}
		if ok {
			return true
		}
	}
	return false
}
