package extender

import (
	"context"
	"fmt"
	"slices"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
)

// IndexPodUID is the pod cache's index by UID, which preempt needs to find
// victims that kube-scheduler names by UID alone. Register it with
// IndexPodsByUID before the cache starts.
const IndexPodUID = "metadata.uid"

// IndexPodsByUID adds the IndexPodUID index to a pod cache.
func IndexPodsByUID(ctx context.Context, indexer client.FieldIndexer) error {
	err := indexer.IndexField(ctx, &corev1.Pod{}, IndexPodUID, podUIDIndex)
	if err != nil {
		return fmt.Errorf("index pods by UID: %w", err)
	}
	return nil
}

func podUIDIndex(obj client.Object) []string { return []string{string(obj.GetUID())} }

// Preempt answers kube-scheduler's preemption for a GPU pod: of the nodes
// and victims kube-scheduler proposes, it keeps only the nodes where
// evicting the victims really frees a device slice that fits the pod, and
// drops every node where a victim belongs to a gang (a gang is evicted whole
// by Partita's admission loop, never in part). Managed pods carry
// preemptionPolicy Never, so kube-scheduler proposes nothing for them; this
// guards pods that do not.
func (e *Extender) Preempt(ctx context.Context, args *extenderv1.ExtenderPreemptionArgs) (*extenderv1.ExtenderPreemptionResult, error) {
	start := e.clock.Now()
	defer func() { e.metrics.observeVerb(VerbPreempt, e.clock.Since(start)) }()
	if args == nil || args.Pod == nil {
		return nil, &RequestError{Verb: VerbPreempt, Reason: "no pod"}
	}
	if !e.synced() {
		return nil, ErrNotSynced
	}
	proposed := metaVictims(args)
	out := &extenderv1.ExtenderPreemptionResult{NodeNameToMetaVictims: map[string]*extenderv1.MetaVictims{}}
	req, errs := gpu.ParsePod(args.Pod)
	if len(errs) > 0 {
		return out, nil
	}
	if req == nil {
		out.NodeNameToMetaVictims = proposed
		return out, nil
	}
	log := logr.FromContextOrDiscard(ctx).WithValues("pod", klog.KObj(args.Pod))
	pinned := e.pinnedNode(args.Pod)
	snap := e.ledger.Snapshot()
	nodes := make([]string, 0, len(proposed))
	for n := range proposed {
		nodes = append(nodes, n)
	}
	slices.Sort(nodes)
	for _, node := range nodes {
		mv := proposed[node]
		if mv == nil {
			continue
		}
		if pinned != "" && node != pinned {
			log.V(4).Info("Refused preemption on node", "node", node, "why", "the pod's GPUs are reserved on node "+pinned)
			continue
		}
		if gang := e.gangVictim(ctx, mv); gang != "" {
			log.V(4).Info("Refused preemption on node", "node", node, "why", "a victim belongs to gang "+gang)
			continue
		}
		for _, v := range mv.Pods {
			if v != nil {
				snap.Forget(types.UID(v.UID))
			}
		}
		if err := snap.Fit(node, req); err != nil {
			log.V(4).Info("Refused preemption on node", "node", node, "why", err.Error())
			continue
		}
		out.NodeNameToMetaVictims[node] = mv
	}
	log.V(3).Info("Answered preemption", "proposedNodes", len(proposed), "keptNodes", len(out.NodeNameToMetaVictims))
	return out, nil
}

// metaVictims are the proposed victims by UID, whichever form they came in.
func metaVictims(args *extenderv1.ExtenderPreemptionArgs) map[string]*extenderv1.MetaVictims {
	if args.NodeNameToMetaVictims != nil {
		return args.NodeNameToMetaVictims
	}
	out := make(map[string]*extenderv1.MetaVictims, len(args.NodeNameToVictims))
	for node, v := range args.NodeNameToVictims {
		if v == nil {
			continue
		}
		mv := &extenderv1.MetaVictims{Pods: []*extenderv1.MetaPod{}, NumPDBViolations: v.NumPDBViolations}
		for _, p := range v.Pods {
			if p != nil {
				mv.Pods = append(mv.Pods, &extenderv1.MetaPod{UID: string(p.UID)})
			}
		}
		out[node] = mv
	}
	return out
}

// gangVictim returns the gang of the first victim that belongs to one, ""
// if none does. A victim that cannot be looked up counts as a gang member:
// evicting part of a gang is worse than not preempting.
func (e *Extender) gangVictim(ctx context.Context, mv *extenderv1.MetaVictims) string {
	for _, v := range mv.Pods {
		if v == nil {
			continue
		}
		var pods corev1.PodList
		if err := e.pods.List(ctx, &pods, client.MatchingFields{IndexPodUID: v.UID}); err != nil {
			return "(unknown: " + err.Error() + ")"
		}
		for i := range pods.Items {
			if g := podGroupOf(&pods.Items[i]); g != "" {
				return g
			}
		}
	}
	return ""
}

// podGroupOf is the gang a pod belongs to, GPU pod or not, in any dialect.
func podGroupOf(pod *corev1.Pod) string {
	if req, _ := gpu.ParsePod(pod); req != nil && req.PodGroup != "" {
		return req.PodGroup
	}
	for _, k := range []string{v1alpha1.LabelPodGroup, gpu.LabelCoschedulingPodGroup} {
		if g := pod.Labels[k]; g != "" {
			return g
		}
	}
	return pod.Annotations[gpu.AnnotationRunAIPodGroup]
}
