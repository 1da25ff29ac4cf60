package node

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/models/cache"
	"github.com/partita-dev/partita/models/fetch"
)

// TestFleetServesItsSimulatedNodes: one process takes up the prefetch
// requests of the simulated nodes it serves, each into a cache of its own,
// and leaves other nodes' requests to their own caches.
func TestFleetServesItsSimulatedNodes(t *testing.T) {
	e := newEnv(t, 10<<20)
	m := e.model(t, "served", map[string][]byte{"model.safetensors": safetensorsFile(10_000, false)})
	caches := t.TempDir()
	var made sync.Map
	f := &Fleet{
		Serves: func(_ context.Context, node string) bool { return node == "sim-0" || node == "sim-1" },
		NewService: func(ctx context.Context, node string) (*Service, error) {
			if _, again := made.LoadOrStore(node, true); again {
				t.Errorf("the Service of %s was made twice", node)
			}
			var svc *Service
			c, err := cache.New(filepath.Join(caches, node), 10<<20, cache.WithOnEvict(func(k string) { svc.Evicted(k) }))
			if err != nil {
				return nil, err
			}
			svc, err = New(ctx, Config{NodeName: node, Cache: c, Client: e.c, StateDir: t.TempDir(), FileRoots: []string{e.roots},
				Fetch: fetch.Options{ChunkSize: 64 << 10, Concurrency: 2, Pool: fetch.NewPool(2, 64<<10)}, Log: testr.New(t)})
			return svc, err
		},
		Log: testr.New(t),
	}
	m.Status.Nodes = []v1alpha1.ModelNodeStatus{
		{Name: "sim-0", Phase: v1alpha1.ModelPending, Message: "prefetch requested: admitted team-a/serve"},
		{Name: "sim-1", Phase: v1alpha1.ModelPending, Message: "prefetch requested: admitted team-a/serve"},
		{Name: "real-node", Phase: v1alpha1.ModelPending, Message: "prefetch requested: admitted team-a/serve"},
	}
	f.Prefetch(t.Context(), m)
	f.Prefetch(t.Context(), m) // an update before the first is done: one fill per node

	deadline := time.Now().Add(30 * time.Second)
	for {
		st := e.status(t, "served")
		ready := 0
		for _, n := range []string{"sim-0", "sim-1"} {
			if e := st.ModelNode(n); e != nil && e.Phase == v1alpha1.ModelReady {
				ready++
			}
		}
		if ready == 2 {
			if n := st.ModelNode("real-node"); n != nil {
				t.Errorf("status.nodes[real-node] = %+v, want none: that node is not the fleet's", n)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the fleet's nodes did not both fetch the model: %+v", st.Nodes)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, n := range []string{"sim-0", "sim-1"} {
		matches, _ := filepath.Glob(filepath.Join(caches, n, "entries", "*", "model.safetensors"))
		if len(matches) != 1 {
			t.Errorf("cache of %s holds %v, want one copy of model.safetensors", n, matches)
		}
	}
}
