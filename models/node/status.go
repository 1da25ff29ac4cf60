package node

import (
	"context"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/models"
)

// Field managers of the Model status this node writes: its own entry of
// status.nodes, and (shared by every node, which agree on a version's files)
// status.files and status.size.
func (s *Service) nodeManager() string { return "partita-model-cache/" + s.cfg.NodeName }

const filesManager = "partita-model-cache"

// nodeEntry is this node's copy of a model, as status.nodes will say.
type nodeEntry struct {
	phase   v1alpha1.ModelPhase
	bytes   int64
	total   int64
	version string
	message string
	// files, when set, go to status.files (a fill that just verified them).
	files []v1alpha1.ModelFile
}

// report applies the node's entry to the Model's status with server-side
// apply: each node owns its entry, so nodes never conflict. A failed write
// is logged; the next report carries the state again.
func (s *Service) report(m *v1alpha1.Model, e nodeEntry) {
	ctx, cancel := context.WithTimeout(s.ctx, 10*time.Second)
	defer cancel()
	key := types.NamespacedName{Namespace: m.Namespace, Name: m.Name}
	now := metav1.NewTime(s.cfg.Clock.Now().Truncate(time.Second))
	ltt := now
	if prev := m.Status.ModelNode(s.cfg.NodeName); prev != nil && prev.Phase == e.phase && prev.LastTransitionTime != nil {
		ltt = *prev.LastTransitionTime
	}
	entry := map[string]any{
		"name": s.cfg.NodeName, "phase": string(e.phase), "bytes": e.bytes, "total": e.total,
		"version": e.version, "message": truncate(e.message, 1024), "lastTransitionTime": ltt.UTC().Format(time.RFC3339),
	}
	if e.phase == v1alpha1.ModelReady && s.cfg.Peer != nil {
		entry["peer"] = map[string]any{"url": s.cfg.Peer.URL, "certSHA256": s.cfg.Peer.CertSHA256}
	}
	if err := s.apply(ctx, key, s.nodeManager(), map[string]any{"nodes": []any{entry}}); err != nil {
		s.cfg.Log.Error(err, "Could not report the node's copy of a model", "model", key.String(), "phase", e.phase)
		return
	}
	m.Status.Nodes = upsertNode(m.Status.Nodes, v1alpha1.ModelNodeStatus{Name: s.cfg.NodeName, Phase: e.phase, LastTransitionTime: &ltt})
	if e.files == nil {
		return
	}
	files := make([]any, 0, len(e.files))
	var size int64
	for _, f := range e.files {
		files = append(files, map[string]any{"path": f.Path, "size": f.Size, "sha256": f.SHA256})
		size += f.Size
	}
	if err := s.apply(ctx, key, filesManager, map[string]any{"files": files, "size": size}); err != nil {
		s.cfg.Log.Error(err, "Could not report a model's files", "model", key.String())
	}
}

// forget removes this node's entry from the Model (its copy was evicted).
func (s *Service) forget(key types.NamespacedName) {
	ctx, cancel := context.WithTimeout(s.ctx, 10*time.Second)
	defer cancel()
	if err := s.apply(ctx, key, s.nodeManager(), map[string]any{"nodes": []any{}}); err != nil {
		s.cfg.Log.Error(err, "Could not remove the node's evicted copy from a model's status", "model", key.String())
	}
}

func (s *Service) apply(ctx context.Context, key types.NamespacedName, manager string, status map[string]any) error {
	return models.ApplyStatus(ctx, s.cfg.Client, key, manager, status, true)
}

func upsertNode(nodes []v1alpha1.ModelNodeStatus, n v1alpha1.ModelNodeStatus) []v1alpha1.ModelNodeStatus {
	for i := range nodes {
		if nodes[i].Name == n.Name {
			nodes[i] = n
			return nodes
		}
	}
	return append(nodes, n)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}
