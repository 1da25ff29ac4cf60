package realnode

import (
	"context"
	_ "embed"
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
)

//go:embed coredns.yaml
var coreDNSTemplate string

// CoreDNSManifest is CoreDNS on the real node: Deployment coredns and
// Service kube-dns (ClusterDNS) in kube-system, with the RBAC it needs.
func CoreDNSManifest() []byte {
	return []byte(strings.NewReplacer("{{IMAGE}}", ImageCoreDNS.Ref, "{{NODE}}", NodeName,
		"{{DNS}}", ClusterDNS, "{{DOMAIN}}", ClusterDomain).Replace(coreDNSTemplate))
}

// ensureCoreDNS applies CoreDNS and waits until it is available.
func (n *Node) ensureCoreDNS(ctx context.Context, cs kubernetes.Interface) error {
	if n.cfg.Apply == nil {
		return fmt.Errorf("no way to apply CoreDNS's manifest")
	}
	if err := n.cfg.Apply(ctx, CoreDNSManifest()); err != nil {
		return fmt.Errorf("apply CoreDNS: %w", err)
	}
	var seen string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		d, err := cs.AppsV1().Deployments("kube-system").Get(ctx, "coredns", metav1.GetOptions{})
		if err != nil {
			seen = err.Error()
			return false, nil
		}
		seen = fmt.Sprintf("%d of %d replicas available", d.Status.AvailableReplicas, d.Status.Replicas)
		return d.Status.AvailableReplicas >= 1 && d.Status.UpdatedReplicas == d.Status.Replicas, nil
	})
	if err != nil {
		return fmt.Errorf("CoreDNS did not become available on %s (%s): %w\n%s", NodeName, seen, err, describeKubeSystemPods(ctx, cs))
	}
	return nil
}

// waitNodeReady waits until the Node is Ready.
func waitNodeReady(ctx context.Context, cs kubernetes.Interface, timeout time.Duration, kubeletLog string) error {
	var seen string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		node, err := cs.CoreV1().Nodes().Get(ctx, NodeName, metav1.GetOptions{})
		if err != nil {
			seen = err.Error()
			return false, nil
		}
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady {
				seen = fmt.Sprintf("Ready=%s (%s: %s)", c.Status, c.Reason, c.Message)
				return c.Status == corev1.ConditionTrue, nil
			}
		}
		seen = "no Ready condition yet"
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("node %s did not become Ready within %s: %s: %w\n%s", NodeName, timeout, seen, err, describeLog(kubeletLog, 20))
	}
	return nil
}

func describeKubeSystemPods(ctx context.Context, cs kubernetes.Interface) string {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	pods, err := cs.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "k8s-app=kube-dns"})
	if err != nil {
		return "  (could not list CoreDNS's pods: " + err.Error() + ")"
	}
	var b strings.Builder
	for _, p := range pods.Items {
		fmt.Fprintf(&b, "  pod %s: %s on %q", p.Name, p.Status.Phase, p.Spec.NodeName)
		for _, s := range p.Status.ContainerStatuses {
			if s.State.Waiting != nil {
				fmt.Fprintf(&b, ", %s waiting: %s %s", s.Name, s.State.Waiting.Reason, s.State.Waiting.Message)
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}

func httpOK(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s answered %s", url, resp.Status)
	}
	return nil
}

func execOutput(ctx context.Context, bin string, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	return string(out), err
}
