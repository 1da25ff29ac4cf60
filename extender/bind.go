package extender

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/klog/v2"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
)

// Bind results, as the values of partita_extender_binds_total's result
// label.
const (
	// BindBound: devices assigned and the Binding created.
	BindBound = "Bound"
	// BindAlreadyBound: the pod already had this node and its devices (a
	// retry); nothing was written.
	BindAlreadyBound = "AlreadyBound"
	// BindNotLeader: this replica is not the leader.
	BindNotLeader = "NotLeader"
	// BindConflict: the pod no longer fits the node (another bind took the
	// room since filter ran), or its devices are reserved on another node.
	BindConflict = "Conflict"
	// BindRefused: the extender does not bind this pod, or not to this
	// node (see RefusedError); nothing was written.
	BindRefused = "Refused"
	// BindFailed: anything else, the Binding's own failure included.
	BindFailed = "Failed"
)

// ConflictError says bind could not assign devices on the node kube-scheduler
// chose: the room it saw at filter time is gone, or the pod's devices are
// reserved elsewhere. kube-scheduler tries the pod again.
type ConflictError struct {
	// Pod is namespace/name.
	Pod string
	// Node is the node kube-scheduler chose.
	Node string
	// Cause is gpu's answer: an *InsufficientError, or the reservation.
	Cause error
}

// Error implements error.
func (e *ConflictError) Error() string {
	return fmt.Sprintf("bind pod %s to node %s: %v", e.Pod, e.Node, e.Cause)
}

// Unwrap returns the cause.
func (e *ConflictError) Unwrap() error { return e.Cause }

// RefusedError says bind will not bind the pod to the node at all, whoever
// asks: the pod holds no partita.dev/gpu-milli (kube-scheduler binds such
// pods itself), it is still held by a scheduling gate, or the node is not
// one the pod may run on (no such node, the pod's nodeSelector or required
// node affinity does not match it, a taint the pod does not tolerate, a
// cordon, or the pod is pinned to another node). Trying again does not
// help; kube-scheduler, which chose the node from the same rules, never
// meets it unless the node changed since.
type RefusedError struct {
	// Pod is namespace/name.
	Pod string
	// Node is the node asked for.
	Node string
	// Reason says why, in words.
	Reason string
}

// Error implements error.
func (e *RefusedError) Error() string {
	return fmt.Sprintf("refuse to bind pod %s to node %s: %s", e.Pod, e.Node, e.Reason)
}

// IsRefused reports whether err is, or wraps, a *RefusedError.
func IsRefused(err error) bool {
	var re *RefusedError
	return errors.As(err, &re)
}

// ClientsetBinder creates Bindings with a clientset.
type ClientsetBinder struct {
	// Client is the clientset.
	Client kubernetes.Interface
}

// Bind implements Binder.
func (b ClientsetBinder) Bind(ctx context.Context, binding *corev1.Binding) error {
	return b.Client.CoreV1().Pods(binding.Namespace).Bind(ctx, binding, metav1.CreateOptions{})
}

// Bind assigns the pod's devices on the node kube-scheduler chose and binds
// it there, the node and the devices in one write:
//
//  1. Only the leader binds; a replica that is not answers ErrNotLeader.
//  2. Only a pod that requests partita.dev/gpu-milli, is not gated, and may
//     run on the node (admits checks what kube-scheduler's own filters
//     would, as the caller chose the node) is bound; anything else is a
//     RefusedError. A pod the informer still shows gated is read from the
//     API server first: the ungating may not have reached the informer.
//  3. A pod already bound to this node with its devices is a retry whose
//     first attempt succeeded: nothing to do.
//  4. Under the node's lock, the devices the ledger already holds for the
//     pod on this node (a reservation, or an earlier attempt) are reused;
//     otherwise gpu chooses them (binpack or spread) and the ledger records
//     them at once, so a concurrent bind never gets the same slice.
//  5. The Binding carries the allocation annotations (DESIGN §4); the API
//     server copies them onto the pod with spec.nodeName.
//  6. If the Binding fails, the pod is read from the API server: bound with
//     these devices means it went through after all; otherwise the decision
//     is dropped from the ledger (rollback). If the pod cannot be read, the
//     decision stays until the pod shows it or it expires (see Start).
func (e *Extender) Bind(ctx context.Context, args *extenderv1.ExtenderBindingArgs) (err error) {
	start := e.clock.Now()
	result := BindFailed
	defer func() {
		e.metrics.observeVerb(VerbBind, e.clock.Since(start))
		e.metrics.observeBind(result)
	}()
	switch {
	case args == nil:
		return &RequestError{Verb: VerbBind, Reason: "no arguments"}
	case args.PodName == "" || args.PodNamespace == "":
		return &RequestError{Verb: VerbBind, Reason: "PodName and PodNamespace are required"}
	case args.Node == "":
		return &RequestError{Verb: VerbBind, Reason: "Node is required"}
	}
	key := client.ObjectKey{Namespace: args.PodNamespace, Name: args.PodName}
	log := logr.FromContextOrDiscard(ctx).WithValues("pod", klog.KRef(key.Namespace, key.Name), "node", args.Node)
	defer func() {
		if err != nil && result != BindNotLeader {
			log.V(2).Info("Failed to bind pod", "result", result, "err", err.Error())
		}
	}()
	if !e.isLeader() {
		result = BindNotLeader
		return ErrNotLeader
	}
	if !e.synced() {
		return ErrNotSynced
	}
	pod, err := e.getPod(ctx, key, args.PodUID)
	if err != nil {
		return fmt.Errorf("bind pod %s: %w", key, err)
	}
	if len(pod.Spec.SchedulingGates) > 0 {
		// kube-scheduler binds only a pod it saw ungated: a gate here is
		// most likely this informer not yet showing the admission loop's
		// ungating. The release's answer says, or the API server; a
		// refusal would send the pod through another scheduling cycle
		// after a backoff, with a FailedScheduling event and condition.
		if r := e.released.Take(key, pod.UID); r != nil && len(r.Spec.SchedulingGates) == 0 {
			pod = r
		} else if fresh := (&corev1.Pod{}); e.live.Get(ctx, key, fresh) == nil && (args.PodUID == "" || fresh.UID == args.PodUID) {
			pod = fresh
		}
	} else {
		e.released.Forget(key)
	}
	refuse := func(reason string) error {
		result = BindRefused
		return &RefusedError{Pod: key.String(), Node: args.Node, Reason: reason}
	}
	if !requestsGPUMilli(pod) {
		return refuse("it requests no " + string(v1alpha1.ResourceGPUMilli) + "; the extender binds only GPU pods, kube-scheduler binds the others itself")
	}
	req, errs := gpu.ParsePod(pod)
	switch {
	case len(errs) > 0:
		return fmt.Errorf("bind pod %s: invalid GPU request: %w", key, errs.ToAggregate())
	case req == nil:
		return refuse("it requests " + string(v1alpha1.ResourceGPUMilli) + " without a GPU request the extender can read")
	}
	if pod.Spec.NodeName != "" {
		if err := alreadyBound(pod, req, args.Node); err != nil {
			return err
		}
		result = BindAlreadyBound
		return nil
	}
	if reason, err := e.admits(ctx, pod, args.Node); err != nil {
		return fmt.Errorf("bind pod %s to node %s: %w", key, args.Node, err)
	} else if reason != "" {
		return refuse(reason)
	}
	binding := &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: args.Node},
	}
	a, err := e.decide(pod, req, args.Node)
	if err != nil {
		if errors.As(err, new(*ConflictError)) {
			result = BindConflict
			e.metrics.conflict()
		}
		return err
	}
	binding.Annotations = gpu.AllocationAnnotations(a)
	apiStart := e.clock.Now()
	if err := e.binder.Bind(ctx, binding); err != nil {
		if e.bindFailed(ctx, log, key, a) {
			result = BindAlreadyBound
			return nil
		}
		return fmt.Errorf("bind pod %s to node %s: %w", key, args.Node, err)
	}
	e.track(key, a)
	result = BindBound
	log.V(2).Info("Bound pod", "devices", describeAllocation(a), "took", e.clock.Since(start), "bindingTook", e.clock.Since(apiStart))
	return nil
}

// requestsGPUMilli reports whether any container of the pod requests or
// limits partita.dev/gpu-milli: the pods kube-scheduler sends to the
// extender (managedResources), and the only ones it binds.
func requestsGPUMilli(pod *corev1.Pod) bool {
	for _, cs := range [][]corev1.Container{pod.Spec.Containers, pod.Spec.InitContainers} {
		for i := range cs {
			if _, ok := cs[i].Resources.Requests[v1alpha1.ResourceGPUMilli]; ok {
				return true
			}
			if _, ok := cs[i].Resources.Limits[v1alpha1.ResourceGPUMilli]; ok {
				return true
			}
		}
	}
	return false
}

// admits returns why the pod may not be bound to node, "" when it may: the
// checks of kube-scheduler's own filters that decide where a pod may run
// (NodeName existence, NodeAffinity, TaintToleration, NodeUnschedulable),
// the scheduling gates, and the pin of the admission loop. kube-scheduler
// made the same checks when it chose the node; they are made again
// because bind acts on the node the request names, and a Binding is
// accepted by the API server for any node name. err is for a node that
// could not be read.
func (e *Extender) admits(ctx context.Context, pod *corev1.Pod, node string) (string, error) {
	if len(pod.Spec.SchedulingGates) > 0 {
		gates := make([]string, len(pod.Spec.SchedulingGates))
		for i, g := range pod.Spec.SchedulingGates {
			gates[i] = g.Name
		}
		return "it is still held by the scheduling gates " + strings.Join(gates, ", "), nil
	}
	if pin := pod.Annotations[v1alpha1.AnnotationNode]; pin != "" && pin != node {
		return "it is pinned to node " + pin + " (" + v1alpha1.AnnotationNode + ")", nil
	}
	n := &corev1.Node{}
	if err := e.nodes.Get(ctx, client.ObjectKey{Name: node}, n); err != nil {
		if apierrors.IsNotFound(err) {
			return "there is no such node", nil
		}
		return "", fmt.Errorf("read node: %w", err)
	}
	if ok, err := nodeaffinity.GetRequiredNodeAffinity(pod).Match(n); err != nil || !ok {
		return "the pod's nodeSelector or required node affinity does not match the node", nil
	}
	if t, untolerated := corev1helpers.FindMatchingUntoleratedTaint(logr.Discard(), n.Spec.Taints, pod.Spec.Tolerations, schedulingTaint, false); untolerated {
		return fmt.Sprintf("the node has the taint %s that the pod does not tolerate", t.ToString()), nil
	}
	// A cordoned node counts as tainted for pods that tolerate that
	// (kube-scheduler's NodeUnschedulable).
	cordon := corev1.Taint{Key: corev1.TaintNodeUnschedulable, Effect: corev1.TaintEffectNoSchedule}
	if n.Spec.Unschedulable && !corev1helpers.TolerationsTolerateTaint(logr.Discard(), pod.Spec.Tolerations, &cordon, false) {
		return "the node is cordoned (spec.unschedulable)", nil
	}
	return "", nil
}

// schedulingTaint selects the taints that keep pods off a node at
// scheduling, as kube-scheduler's TaintToleration filter does.
func schedulingTaint(t *corev1.Taint) bool {
	return t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute
}

// getPod reads the pod from the cache, or from the API server when the
// cache does not have it yet (or has an older pod of the same name).
func (e *Extender) getPod(ctx context.Context, key client.ObjectKey, uid types.UID) (*corev1.Pod, error) {
	pod := &corev1.Pod{}
	err := e.pods.Get(ctx, key, pod)
	if err == nil && (uid == "" || pod.UID == uid) {
		return pod, nil
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, err
	}
	if r := e.released.Take(key, uid); r != nil {
		return r, nil
	}
	if err := e.live.Get(ctx, key, pod); err != nil {
		return nil, err
	}
	if uid != "" && pod.UID != uid {
		return nil, fmt.Errorf("pod has UID %s, not %s: it was deleted and created again", pod.UID, uid)
	}
	return pod, nil
}

// alreadyBound answers bind for a pod that is bound already: success when it
// is on node with devices for every GPU container (kube-scheduler retrying a
// bind that went through), an error otherwise.
func alreadyBound(pod *corev1.Pod, req *gpu.PodRequest, node string) error {
	if pod.Spec.NodeName != node {
		return fmt.Errorf("bind pod %s/%s to node %s: it is already bound to node %s", pod.Namespace, pod.Name, node, pod.Spec.NodeName)
	}
	if req != nil {
		for _, c := range req.Containers {
			if _, ok := pod.Annotations[v1alpha1.AnnotationDevicesPrefix+c.Name]; !ok {
				return fmt.Errorf("bind pod %s/%s to node %s: it is bound without devices for container %s", pod.Namespace, pod.Name, node, c.Name)
			}
		}
	}
	return nil
}

// decide returns the pod's devices on node, recorded in the ledger. The
// node's lock makes the choice and the record one step for every bind on
// the node.
func (e *Extender) decide(pod *corev1.Pod, req *gpu.PodRequest, node string) (*gpu.PodAllocation, error) {
	key := pod.Namespace + "/" + pod.Name
	lock := e.nodeLock(node)
	lock.Lock()
	defer lock.Unlock()
	if held, ok := e.ledger.Allocation(pod.UID); ok {
		if held.Node != node {
			return nil, &ConflictError{Pod: key, Node: node, Cause: fmt.Errorf("the pod's GPUs are reserved on node %s", held.Node)}
		}
		return held, nil
	}
	a, err := e.ledger.Choose(node, req, e.placementFor(req))
	if err == nil {
		err = e.ledger.Assume(a)
	}
	switch {
	case err == nil:
		return a, nil
	case gpu.IsInsufficient(err) || errors.Is(err, gpu.ErrAlreadyAllocated):
		return nil, &ConflictError{Pod: key, Node: node, Cause: err}
	default:
		return nil, fmt.Errorf("bind pod %s to node %s: %w", key, node, err)
	}
}

// bindFailed decides what a failed Binding leaves behind, and reports
// whether the pod is bound with a after all.
func (e *Extender) bindFailed(ctx context.Context, log logr.Logger, key client.ObjectKey, a *gpu.PodAllocation) bool {
	live := &corev1.Pod{}
	err := e.live.Get(ctx, key, live)
	switch {
	case err == nil && live.UID == a.UID && live.Spec.NodeName == a.Node && holds(live, a):
		e.track(key, a)
		return true
	case err == nil, apierrors.IsNotFound(err):
		// Unbound, bound elsewhere by someone else, or gone: the decision
		// did not reach the pod.
		e.ledger.Forget(a.UID)
		e.metrics.rollback()
		log.V(2).Info("Rolled back GPU assignment", "devices", describeAllocation(a))
	default:
		// The Binding may have gone through: keep the devices until the pod
		// shows them or the decision expires.
		e.track(key, a)
		log.Error(err, "Could not read pod after a failed Binding; keeping its GPUs until it shows them or the decision expires")
	}
	return false
}

// holds reports whether the pod's annotations carry exactly allocation a.
func holds(pod *corev1.Pod, a *gpu.PodAllocation) bool {
	for k, v := range gpu.AllocationAnnotations(a) {
		if pod.Annotations[k] != v {
			return false
		}
	}
	return true
}

// track remembers a bind decision until the pod shows it.
func (e *Extender) track(key client.ObjectKey, a *gpu.PodAllocation) {
	e.pendingLock.Lock()
	defer e.pendingLock.Unlock()
	e.pending[a.UID] = pendingBind{key: key, node: a.Node, deadline: e.clock.Now().Add(e.assumeTTL)}
	e.metrics.setPending(len(e.pending))
}

// NeedLeaderElection is false: every replica runs the expiry loop, though
// only the leader has bind decisions to expire, and every replica's ledger
// holds the admission loop's reservations.
func (e *Extender) NeedLeaderElection() bool { return false }

// reservationSweep is how often the ledger drops reservations that expired
// while their pods did not change.
const reservationSweep = time.Second

// Start expires bind decisions until ctx ends: a decision whose pod shows
// it (bound, in the informer cache) is done; one that the pod still does not
// show after the TTL is checked against the API server and dropped from the
// ledger if the pod is unbound or gone. Without this a Binding whose outcome
// was unknown could hold its devices forever. Every second it also drops
// the reservations (partita.dev/reservation) that have expired.
func (e *Extender) Start(ctx context.Context) error {
	period := max(time.Second, e.assumeTTL/4)
	t := e.clock.NewTicker(period)
	defer t.Stop()
	sweep := e.clock.NewTicker(reservationSweep)
	defer sweep.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C():
			e.expire(ctx)
		case <-sweep.C():
			e.ledger.ExpireReservations()
		}
	}
}

// expire runs one pass of Start.
func (e *Extender) expire(ctx context.Context) {
	log := logr.FromContextOrDiscard(ctx)
	e.pendingLock.Lock()
	pending := make(map[types.UID]pendingBind, len(e.pending))
	for uid, p := range e.pending {
		pending[uid] = p
	}
	e.pendingLock.Unlock()
	now := e.clock.Now()
	for uid, p := range pending {
		pod := &corev1.Pod{}
		if err := e.pods.Get(ctx, p.key, pod); err == nil && pod.UID == uid && pod.Spec.NodeName != "" {
			e.done(uid)
			continue
		}
		if now.Before(p.deadline) {
			continue
		}
		err := e.live.Get(ctx, p.key, pod)
		switch {
		case err == nil && pod.UID == uid && pod.Spec.NodeName != "":
			// The informer lags; it will show the pod soon.
			e.done(uid)
		case err == nil, apierrors.IsNotFound(err):
			e.ledger.Forget(uid)
			e.metrics.rollback()
			e.done(uid)
			log.V(2).Info("Dropped an expired GPU assignment", "pod", klog.KRef(p.key.Namespace, p.key.Name), "node", p.node)
		default:
			log.Error(err, "Could not check an expired GPU assignment; trying again", "pod", klog.KRef(p.key.Namespace, p.key.Name))
		}
	}
}

func (e *Extender) done(uid types.UID) {
	e.pendingLock.Lock()
	defer e.pendingLock.Unlock()
	delete(e.pending, uid)
	e.metrics.setPending(len(e.pending))
}

// describeAllocation reads like "main=GPU 0 (0.5)".
func describeAllocation(a *gpu.PodAllocation) string {
	parts := make([]string, 0, len(a.Containers))
	for _, c := range a.Containers {
		idx := make([]string, len(c.DeviceIndexes))
		for i, d := range c.DeviceIndexes {
			idx[i] = fmt.Sprint(d)
		}
		parts = append(parts, fmt.Sprintf("%s=GPU %s (%s)", c.Container, strings.Join(idx, ","), gpu.FormatMilli(c.Milli)))
	}
	return strings.Join(parts, "; ")
}
