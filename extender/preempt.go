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

// Preempt answers kube-scheduler's preemption for a GPU pod (kube-scheduler
// asks the extender only about pods that request partita.dev/gpu-milli).
// kube-scheduler's preemption knows nothing of queues, fair share or gangs,
// so for GPUs only Partita's admission loop evicts (DESIGN §6):
//
//   - A preemptor the admission loop manages (it carries
//     partita.dev/admitted) gets no victims at all: if it does not fit, the
//     loop's own reclaim and preemption decide.
//   - Any other GPU preemptor (a pod the webhook did not gate: an unmanaged
//     namespace, or the admission gate turned off) keeps only the nodes
//     where evicting the proposed victims really frees a device slice that
//     fits it, and where no victim is one the loop manages or belongs to a
//     gang: those are evicted whole by the loop, or not at all.
//
// The chart's own kube-scheduler profile for GPU pods also turns
// kube-scheduler's DefaultPreemption off (SchedulerConfigOptions); this verb
// is what keeps the cluster's own scheduler (scheduler.mode=default, the dev
// cluster) from preempting for GPUs.
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
	if managed(args.Pod) {
		log.V(3).Info("Refused preemption", "why", "the admission loop alone evicts for pods it admits", "proposedNodes", len(proposed))
		return out, nil
	}
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
		if why := e.protectedVictim(ctx, mv); why != "" {
			log.V(4).Info("Refused preemption on node", "node", node, "why", why)
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

// managed reports whether the admission loop admitted the pod.
func managed(pod *corev1.Pod) bool {
	_, ok := pod.Annotations[v1alpha1.AnnotationAdmitted]
	return ok
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

// protectedVictim says why kube-scheduler may not evict one of the
// proposed victims, "" when it may evict them all: a victim the admission
// loop admitted, or that belongs to a gang. A victim that cannot be looked
// up counts as protected: evicting part of a gang is worse than not
// preempting.
func (e *Extender) protectedVictim(ctx context.Context, mv *extenderv1.MetaVictims) string {
	for _, v := range mv.Pods {
		if v == nil {
			continue
		}
		var pods corev1.PodList
		if err := e.pods.List(ctx, &pods, client.MatchingFields{IndexPodUID: v.UID}); err != nil {
			return "a victim could not be looked up: " + err.Error()
		}
		for i := range pods.Items {
			p := &pods.Items[i]
			if g := podGroupOf(p); g != "" {
				return "victim " + p.Namespace + "/" + p.Name + " belongs to gang " + g
			}
			if managed(p) {
				return "victim " + p.Namespace + "/" + p.Name + " was admitted by the admission loop, which alone evicts it"
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
