package node

import (
	"context"
	"sync"

	"github.com/go-logr/logr"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// Fleet is the model caches of simulated nodes (the dev cluster's kwok
// nodes, which run no kubelet and so mount nothing), served by one
// process: a Service per node, made at the node's first prefetch request,
// each with a cache and a state directory of its own. What they fetch,
// verify and write into a Model's status is what a real node's cache does;
// only the CSI side, which needs a kubelet, is missing.
type Fleet struct {
	// Serves says whether node is one of the fleet's.
	Serves func(ctx context.Context, node string) bool
	// NewService makes node's Service.
	NewService func(ctx context.Context, node string) (*Service, error)
	Log        logr.Logger

	lock     sync.Mutex
	services map[string]*Service
}

// Prefetch starts, out of the caller's way, the prefetches m asks of the
// fleet's nodes (their Pending entries in m's status).
func (f *Fleet) Prefetch(ctx context.Context, m *v1alpha1.Model) {
	for _, n := range m.Status.Nodes {
		if n.Phase != v1alpha1.ModelPending || !f.Serves(ctx, n.Name) {
			continue
		}
		svc, err := f.service(ctx, n.Name)
		if err != nil {
			// The next update of the Model tries again.
			f.Log.Error(err, "Could not start the model cache of a simulated node", "node", n.Name)
			continue
		}
		go svc.Prefetch(ctx, m.DeepCopy())
	}
}

// service returns node's Service, made once.
func (f *Fleet) service(ctx context.Context, node string) (*Service, error) {
	f.lock.Lock()
	defer f.lock.Unlock()
	if svc, ok := f.services[node]; ok {
		return svc, nil
	}
	svc, err := f.NewService(ctx, node)
	if err != nil {
		return nil, err
	}
	if f.services == nil {
		f.services = map[string]*Service{}
	}
	f.services[node] = svc
	return svc, nil
}
