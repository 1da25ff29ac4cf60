package node

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/types"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/models/origin"
	"github.com/partita-dev/partita/models/prefetch"
)

// Prefetch takes up a request (a Pending entry for this node in the Model's
// status, models/prefetch): it fills the cache with the model and returns
// when the fill ends (callers run it in a goroutine), leaving the complete
// entry pinned for AdmittedHold when admitted pods asked for it, so that no
// other model evicts it before they mount it (spec.prefetch's copies stay
// evictable). A Model with a secretRef cannot be fetched
// before a pod brings its Secret (the cache reads no Secrets): its entry
// says so, and the fetch starts when the kubelet mounts it into a pod.
func (s *Service) Prefetch(ctx context.Context, m *v1alpha1.Model) {
	e := m.Status.ModelNode(s.cfg.NodeName)
	if e == nil || e.Phase != v1alpha1.ModelPending {
		return
	}
	if m.Spec.Source.SecretRef != nil {
		want := "prefetch waits for a pod: the Model's Secret reaches this node only with a pod that mounts it"
		if e.Message != want {
			s.report(m, nodeEntry{phase: v1alpha1.ModelPending, message: want})
		}
		return
	}
	key := types.NamespacedName{Namespace: m.Namespace, Name: m.Name}
	s.lock.Lock()
	running := s.prefetching[key]
	for _, f := range s.fills {
		running = running || f.model == key
	}
	if !running {
		s.prefetching[key] = true
	}
	s.lock.Unlock()
	if running {
		return
	}
	defer func() {
		s.lock.Lock()
		delete(s.prefetching, key)
		s.lock.Unlock()
	}()
	res, err := origin.Resolve(ctx, m.Spec, origin.Options{HTTPClient: s.cfg.HTTPClient, FileRoots: s.cfg.FileRoots, Namespace: m.Namespace})
	if err != nil {
		s.report(m, nodeEntry{phase: v1alpha1.ModelFailed, message: fmt.Sprintf("model %s/%s: %v", m.Namespace, m.Name, err)})
		return
	}
	// The fill reports into m's status: keep what the request said first.
	forPods := prefetch.ForAdmittedPods(e.Message)
	s.cfg.Log.Info("Prefetching model", "model", m.Namespace+"/"+m.Name, "version", res.Version, "why", e.Message)
	f := s.startFill(m, res)
	select {
	case <-f.finish:
	case <-ctx.Done():
		return
	}
	if f.err == nil && forPods {
		// Admitted pods will mount it: no other fill may evict it first.
		s.hold(res.Version)
	}
}

// WantsPrefetch says, cheaply, whether m asks this node for a prefetch.
func (s *Service) WantsPrefetch(m *v1alpha1.Model) bool {
	e := m.Status.ModelNode(s.cfg.NodeName)
	return e != nil && e.Phase == v1alpha1.ModelPending
}
