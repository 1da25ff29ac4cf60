package extender

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/partita-dev/partita/gpu"
)

// Filter reasons: why a node passed or failed, as the values of
// partita_extender_filter_nodes_total's reason label.
const (
	// ReasonFits: the node has room for every GPU container of the pod.
	ReasonFits = "Fits"
	// ReasonInsufficientGPU: not now, but it could once other pods leave
	// (FailedNodes: preemption may help).
	ReasonInsufficientGPU = "InsufficientGPU"
	// ReasonNeverFits: the request is bigger than the node's healthy devices,
	// even empty (FailedAndUnresolvableNodes).
	ReasonNeverFits = "NeverFits"
	// ReasonNoGPUInventory: the node has no GPUNode, so no known device.
	ReasonNoGPUInventory = "NoGPUInventory"
	// ReasonReservedElsewhere: the pod's devices are reserved, or were just
	// assigned, on another node.
	ReasonReservedElsewhere = "ReservedElsewhere"
	// ReasonInvalidRequest: the pod's GPU request does not parse; no node
	// can take it.
	ReasonInvalidRequest = "InvalidRequest"
	// ReasonAgentSilent: the node's agent has stopped reporting (see
	// admission.HeartbeatMonitor); nothing new goes there until it does.
	ReasonAgentSilent = gpu.ReasonAgentSilent
	// ReasonDRAManaged: every GPU of the node is published by another DRA
	// driver (GPUNode.status.devices[].draDriver), whose claims allocate
	// them; Partita offers no gpu-milli there.
	ReasonDRAManaged = "DRAManaged"
)

// maxReasonLen bounds a failure message, which kube-scheduler copies into
// events and pod conditions.
const maxReasonLen = 256

// verdict is the filter's answer for one node.
type verdict struct {
	reason  string
	message string
}

func (v verdict) unresolvable() bool {
	return v.reason != ReasonFits && v.reason != ReasonInsufficientGPU
}

// Filter keeps the candidate nodes whose healthy devices can hold every GPU
// container of the pod now. Nodes that cannot go to FailedNodes with a
// reason that has the numbers ("largest free slice 0.25 on GPU 5; pod needs
// 0.5"), or to FailedAndUnresolvableNodes when waiting or preempting cannot
// help: the request is bigger than any device there, the node has no GPU
// inventory, its agent has stopped reporting ("the agent on node n1 has not
// reported for 3m10s ..."), another DRA driver publishes all its GPUs
// ("GPUs managed by DRA driver gpu.nvidia.com ..."), or the pod's devices
// are reserved on another node. A pod whose devices the admission loop reserved on a node before
// its agent fell silent still passes there. A pod without a GPU request
// passes everywhere.
//
// Candidates come as node names (nodeCacheCapable) or, from a scheduler
// configured without it, as whole nodes; the answer has the same form.
func (e *Extender) Filter(ctx context.Context, args *extenderv1.ExtenderArgs) (*extenderv1.ExtenderFilterResult, error) {
	start := e.clock.Now()
	defer func() { e.metrics.observeVerb(VerbFilter, e.clock.Since(start)) }()
	names, err := candidateNames(VerbFilter, args)
	if err != nil {
		return nil, err
	}
	if !e.synced() {
		return nil, ErrNotSynced
	}
	log := logr.FromContextOrDiscard(ctx).WithValues("pod", klog.KObj(args.Pod))
	verdicts := e.check(ctx, args.Pod, names)

	res := &extenderv1.ExtenderFilterResult{
		FailedNodes:                extenderv1.FailedNodesMap{},
		FailedAndUnresolvableNodes: extenderv1.FailedNodesMap{},
	}
	passed := make([]string, 0, len(names))
	counts := map[string]int{}
	for _, v := range verdicts {
		counts[v.reason]++
	}
	// A pod whose devices are held on a node that passes goes there: the
	// other candidates' reasons, all ReservedElsewhere, would only be
	// encoded here and decoded and dropped by kube-scheduler (hundreds per
	// pod on a large cluster). Only a pod that fails everywhere needs them.
	held := counts[ReasonFits] == 1 && counts[ReasonReservedElsewhere] == len(names)-1
	for i, v := range verdicts {
		switch {
		case v.reason == ReasonFits:
			passed = append(passed, names[i])
			continue
		case held:
			continue
		case v.unresolvable():
			res.FailedAndUnresolvableNodes[names[i]] = v.message
		default:
			res.FailedNodes[names[i]] = v.message
		}
		if log.V(4).Enabled() {
			log.V(4).Info("Filtered out node", "node", names[i], "reason", v.reason, "message", v.message)
		}
	}
	e.metrics.observeFilter(counts)
	log.V(3).Info("Filtered nodes", "candidates", len(names), "passed", len(passed),
		"failed", len(res.FailedNodes), "unresolvable", len(res.FailedAndUnresolvableNodes))
	if args.NodeNames != nil {
		res.NodeNames = &passed
		return res, nil
	}
	res.Nodes = &corev1.NodeList{Items: make([]corev1.Node, 0, len(passed))}
	for i := range args.Nodes.Items {
		if verdicts[i].reason == ReasonFits {
			res.Nodes.Items = append(res.Nodes.Items, args.Nodes.Items[i])
		}
	}
	return res, nil
}

// check returns the verdict for each node, in order. The pod's request is
// parsed once; each node is then checked against the ledger alone, so the
// checks can run in parallel.
func (e *Extender) check(ctx context.Context, pod *corev1.Pod, names []string) []verdict {
	out := make([]verdict, len(names))
	req, errs := gpu.ParsePod(pod)
	if len(errs) > 0 {
		v := verdict{ReasonInvalidRequest, shorten("invalid GPU request: " + errs.ToAggregate().Error())}
		for i := range out {
			out[i] = v
		}
		return out
	}
	if req == nil {
		for i := range out {
			out[i] = verdict{reason: ReasonFits}
		}
		return out
	}
	pinned := e.pinnedNode(pod)
	one := func(i int) { out[i] = e.checkNode(names[i], req, pinned) }
	if len(names) < e.parallelNodes {
		for i := range names {
			one(i)
		}
		return out
	}
	workqueue.ParallelizeUntil(ctx, runtime.GOMAXPROCS(0), len(names), one, workqueue.WithChunkSize(256))
	return out
}

// checkNode is the verdict for one node.
func (e *Extender) checkNode(node string, req *gpu.PodRequest, pinned string) verdict {
	if pinned != "" {
		if node != pinned {
			return verdict{ReasonReservedElsewhere, fmt.Sprintf("the pod's GPUs are reserved on node %s", pinned)}
		}
		if a, ok := e.ledger.Allocation(req.UID); ok && a.Node == node {
			// The devices are already held there; checking for room again
			// would count them twice.
			return verdict{reason: ReasonFits}
		}
	}
	return verdictOf(node, e.ledger.Fit(node, req))
}

// verdictOf turns gpu's answer for node into a verdict.
func verdictOf(node string, err error) verdict {
	var ie *gpu.InsufficientError
	switch {
	case err == nil:
		return verdict{reason: ReasonFits}
	case errors.As(err, &ie):
		// kube-scheduler counts identical messages across nodes ("3 largest
		// free slice..."), so the node's name is left out.
		msg := shorten(strings.TrimPrefix(ie.Error(), "node "+node+": "))
		if ie.Unresolvable {
			return verdict{ReasonNeverFits, msg}
		}
		return verdict{ReasonInsufficientGPU, msg}
	case gpu.IsAgentSilent(err):
		return verdict{ReasonAgentSilent, shorten(err.Error())}
	case gpu.IsDRAManaged(err):
		return verdict{ReasonDRAManaged, shorten(strings.TrimPrefix(err.Error(), "node "+node+": "))}
	case gpu.IsNodeNotFound(err):
		return verdict{ReasonNoGPUInventory, "no GPU inventory: the node has no GPUNode (is Partita's agent running there?)"}
	default:
		return verdict{ReasonInvalidRequest, shorten(err.Error())}
	}
}

// candidateNames reads the candidate node names of a filter or prioritize
// request.
func candidateNames(verb string, args *extenderv1.ExtenderArgs) ([]string, error) {
	switch {
	case args == nil || args.Pod == nil:
		return nil, &RequestError{Verb: verb, Reason: "no pod"}
	case args.NodeNames != nil:
		return *args.NodeNames, nil
	case args.Nodes != nil:
		names := make([]string, len(args.Nodes.Items))
		for i := range args.Nodes.Items {
			names[i] = args.Nodes.Items[i].Name
		}
		return names, nil
	default:
		return nil, &RequestError{Verb: verb, Reason: "no candidate nodes: neither NodeNames nor Nodes is set"}
	}
}

func shorten(s string) string {
	if len(s) <= maxReasonLen {
		return s
	}
	return s[:maxReasonLen-3] + "..."
}
