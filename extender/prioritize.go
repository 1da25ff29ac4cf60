package extender

import (
	"context"
	"math"
	"runtime"

	"github.com/go-logr/logr"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
)

// Prioritize scores each candidate node from 0 to 10 for the pod, at device
// level: with binpack (the default) the fullest device that still fits and
// the node with the fewest partly used devices score highest, so whole
// devices stay free; with spread (per pod annotation or flag) the emptiest.
// A node where the pod does not fit scores 0; so does every node for a pod
// without a GPU request, which leaves the choice to kube-scheduler.
//
// A pod that asks for models (partita.dev/model) scores half by packing and
// half by the share of its models' bytes a node already holds, so that
// replicas start where their weights are, among the nodes where they fit.
func (e *Extender) Prioritize(ctx context.Context, args *extenderv1.ExtenderArgs) (extenderv1.HostPriorityList, error) {
	start := e.clock.Now()
	defer func() { e.metrics.observeVerb(VerbPrioritize, e.clock.Since(start)) }()
	names, err := candidateNames(VerbPrioritize, args)
	if err != nil {
		return nil, err
	}
	if !e.synced() {
		return nil, ErrNotSynced
	}
	out := make(extenderv1.HostPriorityList, len(names))
	for i, n := range names {
		out[i].Host = n
	}
	req, errs := gpu.ParsePod(args.Pod)
	if req == nil || len(errs) > 0 {
		return out, nil
	}
	pl := e.placementFor(req)
	pinned := e.pinnedNode(args.Pod)
	one := func(i int) {
		switch pinned {
		case "":
			out[i].Score = e.ledger.Score(names[i], req, pl)
		case names[i]:
			out[i].Score = extenderv1.MaxExtenderPriority
		}
	}
	if len(names) < e.parallelNodes {
		for i := range names {
			one(i)
		}
	} else {
		workqueue.ParallelizeUntil(ctx, runtime.GOMAXPROCS(0), len(names), one, workqueue.WithChunkSize(256))
	}
	if models := v1alpha1.ModelNamesOf(args.Pod.Annotations); pinned == "" && e.models != nil && len(models) > 0 {
		held := e.models.Held(ctx, args.Pod.Namespace, models)
		for i := range out {
			out[i].Score = withModel(out[i].Score, held[out[i].Host])
		}
	}
	if log := logr.FromContextOrDiscard(ctx); log.V(4).Enabled() {
		for _, hp := range out {
			log.V(4).Info("Scored node", "pod", klog.KObj(args.Pod), "node", hp.Host, "score", hp.Score, "placement", pl)
		}
	}
	return out, nil
}

// withModel mixes a packing score with the share of a pod's models a node
// holds: half each, and never below 1 where the pod fits.
func withModel(score int64, held float64) int64 {
	if score <= 0 {
		return score
	}
	mixed := int64(math.Round(float64(score)/2 + held*float64(extenderv1.MaxExtenderPriority)/2))
	return min(max(mixed, 1), extenderv1.MaxExtenderPriority)
}
