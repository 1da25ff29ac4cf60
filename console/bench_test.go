package console

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/partita-dev/partita/api/v1alpha1"
	pt "github.com/partita-dev/partita/internal/partitatest"
)

// benchLists is a cluster of nodes × 8 GPUs with pods holding a quarter
// or a half of every other GPU.
func benchLists(nodes, pods int) Lists {
	l := Lists{Coverage: everything()}
	for i := range nodes {
		l.GPUNodes = append(l.GPUNodes, *pt.MakeGPUNode(fmt.Sprintf("node-%03d", i)).Devices(8, "NVIDIA-H100-80GB-HBM3", h100MiB).Obj())
	}
	for i := range pods {
		n := fmt.Sprintf("node-%03d", i%nodes)
		dev := int32((i / nodes) % 8)
		p := pt.Held(fmt.Sprintf("p-%04d", i), n, []string{"0.25", "0.5"}[i%2], h100MiB, pt.DeviceUUID(n, dev))
		p.Namespace = fmt.Sprintf("team-%d", i%10)
		p.Labels = map[string]string{v1alpha1.LabelQueue: p.Namespace}
		p.Status.Phase = corev1.PodRunning
		l.Pods = append(l.Pods, *p)
	}
	return l
}

// BenchmarkBuild is one snapshot of 500 nodes × 8 GPUs and 2,000 pods:
// what the console does after each batch of changes.
func BenchmarkBuild(b *testing.B) {
	l := benchLists(500, 2000)
	kinds := NewWorkloadKinds()
	now := time.Now()
	for b.Loop() {
		Build(l, BuildOptions{TopologyKey: DefaultTopologyKey, Kinds: kinds}, 1, now, now)
	}
}
