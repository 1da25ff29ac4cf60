package devcluster

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// GPUModel describes a simulated device as GPU Feature Discovery labels it.
type GPUModel struct {
	// Product is the nvidia.com/gpu.product label value.
	Product string
	// MemoryMiB is the device memory (nvidia.com/gpu.memory).
	MemoryMiB int64
}

// GPUModels are the device models a dev cluster can simulate, by flag value.
var GPUModels = map[string]GPUModel{
	"H100-80GB":  {Product: "NVIDIA-H100-80GB-HBM3", MemoryMiB: 81559},
	"H200-141GB": {Product: "NVIDIA-H200", MemoryMiB: 143771},
	"A100-40GB":  {Product: "NVIDIA-A100-SXM4-40GB", MemoryMiB: 40960},
	"A100-80GB":  {Product: "NVIDIA-A100-SXM4-80GB", MemoryMiB: 81920},
	"L40S":       {Product: "NVIDIA-L40S", MemoryMiB: 46068},
	"L4":         {Product: "NVIDIA-L4", MemoryMiB: 23034},
	"T4":         {Product: "Tesla-T4", MemoryMiB: 15360},
}

// ModelNames lists the keys of GPUModels, sorted.
func ModelNames() []string {
	names := make([]string, 0, len(GPUModels))
	for n := range GPUModels {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Labels and annotations that make kwok manage a node.
const (
	kwokNodeAnnotation = "kwok.x-k8s.io/node"
	kwokNodeType       = "type"
)

// SimulatedNodeSelector selects the simulated (kwok) nodes and not the
// real one.
const SimulatedNodeSelector = kwokNodeType + "=kwok"

// NodeName is the name of the i-th simulated GPU node.
func NodeName(i int) string { return fmt.Sprintf("gpu-node-%d", i) }

// SimulatedNodeResources is what each simulated GPU node offers pods
// besides its GPUs: the capacity and allocatable `up` writes on the nodes
// it creates, and that the agent fills in on a kwok node added by hand
// (AgentNodeResourcesFlag).
func SimulatedNodeResources() corev1.ResourceList {
	return corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("64"),
		corev1.ResourceMemory: resource.MustParse("512Gi"),
		corev1.ResourcePods:   resource.MustParse("110"),
	}
}

// AgentNodeResourcesFlag is the agent's --simulate-node-resources value for
// the dev cluster: a kwok node added by hand gets SimulatedNodeResources
// where its status has none. Without it such a node could get its GPU
// capacity from the agent before kwok writes its status, which kwok then
// keeps as it is, without pods, CPU or memory: no pod could bind there.
func AgentNodeResourcesFlag() string {
	r := SimulatedNodeResources()
	names := make([]string, 0, len(r))
	for n := range r {
		names = append(names, string(n))
	}
	sort.Strings(names)
	parts := make([]string, len(names))
	for i, n := range names {
		q := r[corev1.ResourceName(n)]
		parts[i] = n + "=" + q.String()
	}
	return "--simulate-node-resources=" + strings.Join(parts, ",")
}

// SimulatedGPUNode returns the Node object of the i-th simulated GPU node. It
// carries GPU Feature Discovery's labels, so the node agent's simulated
// backend can derive its devices from them.
func SimulatedGPUNode(i, gpus int, model GPUModel) *corev1.Node {
	name := NodeName(i)
	capacity := SimulatedNodeResources()
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: name,
			Annotations: map[string]string{
				kwokNodeAnnotation:             "fake",
				"node.alpha.kubernetes.io/ttl": "0",
			},
			Labels: map[string]string{
				"kubernetes.io/hostname":       name,
				"kubernetes.io/os":             "linux",
				"kubernetes.io/arch":           "amd64",
				"topology.kubernetes.io/zone":  fmt.Sprintf("zone-%c", 'a'+rune(i%2)),
				kwokNodeType:                   "kwok",
				v1alpha1.LabelGPUNode:          "true",
				v1alpha1.LabelNVIDIAGPUCount:   strconv.Itoa(gpus),
				v1alpha1.LabelNVIDIAGPUProduct: model.Product,
				v1alpha1.LabelNVIDIAGPUMemory:  strconv.FormatInt(model.MemoryMiB, 10),
			},
		},
		Status: corev1.NodeStatus{
			Capacity:    capacity,
			Allocatable: capacity.DeepCopy(),
			NodeInfo: corev1.NodeSystemInfo{
				Architecture:    "amd64",
				OperatingSystem: "linux",
				KubeletVersion:  "fake",
			},
		},
	}
}

// ensureGPUNodes creates the missing simulated nodes and removes simulated
// nodes beyond the wanted count, so `up --nodes N` converges to N.
func ensureGPUNodes(ctx context.Context, cs kubernetes.Interface, opts Options) error {
	model := GPUModels[opts.GPUModel]
	existing, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: v1alpha1.LabelGPUNode + "=true," + kwokNodeType + "=kwok"})
	if err != nil {
		return fmt.Errorf("list simulated nodes: %w", err)
	}
	have := map[string]bool{}
	for _, n := range existing.Items {
		have[n.Name] = true
	}
	for i := range opts.Nodes {
		if have[NodeName(i)] {
			delete(have, NodeName(i))
			continue
		}
		node := SimulatedGPUNode(i, opts.GPUsPerNode, model)
		_, err := cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("create node %s: %w", node.Name, err)
		}
		// Capacity lives in status, which create ignores. A merge patch carries
		// no resourceVersion, so it does not race kwok's own status updates.
		patch, err := json.Marshal(map[string]any{"status": map[string]any{
			"capacity": node.Status.Capacity, "allocatable": node.Status.Allocatable, "nodeInfo": node.Status.NodeInfo,
		}})
		if err != nil {
			return fmt.Errorf("encode status of node %s: %w", node.Name, err)
		}
		if _, err := cs.CoreV1().Nodes().Patch(ctx, node.Name, types.MergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
			return fmt.Errorf("set capacity of node %s: %w", node.Name, err)
		}
	}
	for name := range have {
		if err := cs.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete surplus node %s: %w", name, err)
		}
	}
	return nil
}

// waitNodesReady waits until want simulated nodes report Ready, and says
// which are not when it gives up.
func waitNodesReady(ctx context.Context, cs kubernetes.Interface, want int, timeout time.Duration) error {
	var notReady []string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: v1alpha1.LabelGPUNode + "=true"})
		if err != nil {
			return false, nil //nolint:nilerr // a transient API error: keep polling until the timeout
		}
		notReady = notReady[:0]
		ready := 0
		for _, n := range nodes.Items {
			if NodeReady(&n) {
				ready++
			} else {
				notReady = append(notReady, n.Name)
			}
		}
		return ready >= want, nil
	})
	if err != nil {
		return fmt.Errorf("wait for %d GPU nodes to be Ready: %w; not ready: %v (is the kwok controller running? see its log)", want, err, notReady)
	}
	return nil
}

// NodeReady reports whether a node's Ready condition is True.
func NodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
