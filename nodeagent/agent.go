package nodeagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/dra"
	"github.com/partita-dev/partita/gpu"
	"github.com/partita-dev/partita/internal/clientscheme"
)

// BackendFunc returns the backend of a node the agent serves, and a key
// that changes when the node's backend must be replaced (a simulated node's
// labels changed). A nil backend means the node has no GPUs to serve.
type BackendFunc func(node *corev1.Node) (b Backend, key string, err error)

// StaticBackend serves every node with b: the single-node agent.
func StaticBackend(b Backend) BackendFunc {
	return func(*corev1.Node) (Backend, string, error) { return b, "", nil }
}

// SimulatedBackends gives each node a simulated backend whose devices come
// from its GPU Feature Discovery labels, the labels it lacks from fallback
// (nil for none). A node that has neither is not served.
func SimulatedBackends(fallback *SimSpec) BackendFunc {
	return func(node *corev1.Node) (Backend, string, error) {
		spec, ok, err := SimSpecForNode(node, fallback)
		if err != nil || !ok || spec.Count == 0 {
			return nil, "", err
		}
		return NewSimulated(node.Name, spec), spec.String(), nil
	}
}

// Options configure an Agent. Exactly one of NodeName and NodeSelector is
// set.
type Options struct {
	// NodeName is the node a single-node agent serves.
	NodeName string
	// NodeSelector selects the nodes a fleet agent serves.
	NodeSelector labels.Selector
	// Backends gives each served node its backend.
	Backends BackendFunc
	// Mode is the isolation mode to apply; empty follows each GPUNode's
	// spec.isolation (time-slicing when it has none).
	Mode v1alpha1.IsolationMode
	// Enforce is what the watchdog does about overuse.
	Enforce EnforceMode
	// SyncInterval is how often each node's GPUs are read and its slices
	// checked, without any write unless something changed.
	SyncInterval time.Duration
	// WatchdogInterval is how often a node that holds slices with a memory
	// limit is checked instead when Enforce is kill: the longest an
	// over-limit process runs before the watchdog sees it (plus up to a
	// tenth for jitter, and one sync). A check that changes nothing writes
	// nothing. 1 s when zero; SyncInterval if that is shorter.
	WatchdogInterval time.Duration
	// HeartbeatInterval is the longest a GPUNode's status goes unwritten;
	// usage figures alone are written only this often.
	HeartbeatInterval time.Duration
	// SliceWriteInterval is the shortest time between two writes of a
	// GPUNode's status that change only its slices (pods came or went):
	// a burst of pods on one node is one write, not one a pod. A change of
	// the devices, their health or the mode is written at once. 1 s when
	// zero.
	SliceWriteInterval time.Duration
	// OveruseReportInterval is how often an ongoing overuse is reported again.
	OveruseReportInterval time.Duration
	// Workers is the number of nodes synced at once.
	Workers int
	// SimulatedUsage is the share of its slice a simulated process uses
	// unless its pod says otherwise.
	SimulatedUsage float64
	// MPS configures mps mode.
	MPS MPSConfig
	// Version is the agent version written to GPUNode status.
	Version string
	// Clock is the clock; the real one when nil.
	Clock clock.WithTicker
	// Metrics receive the agent's figures; new ones when nil.
	Metrics *Metrics
	// Recorder records events; when nil the agent records to the API server.
	Recorder EventRecorder
	// Slices, when set, publishes each served node's GPUs as ResourceSlices
	// of Partita's DRA driver (dra mode, package dra) instead of the
	// node's partita.dev/gpu-milli capacity, which the agent then removes;
	// it also reads what pods hold through their claims.
	Slices SlicePublisher
	// NodeResources are, for a fleet of simulated nodes, the allocatable
	// and capacity a served node gets of each of these resources (pods,
	// cpu, memory) where its status has none: a kwok node has no kubelet to
	// report them, and kwok writes its defaults only into a status with no
	// allocatable at all, which the node's partita.dev/gpu-milli may reach
	// first. Written in the same patch as the GPU capacity. Nil leaves
	// them alone; a single-node agent may not set them.
	NodeResources corev1.ResourceList
	// Enforcement says how the node applies slices: the container path
	// and where dmem, the interposer and the device nodes are.
	Enforcement EnforcementConfig
	// GPUDrivers are the DRA drivers whose devices are GPUs: one of them
	// that publishes devices on a served node without UUIDs owns all its
	// GPUs (dra.ForeignGPUs). dra.DefaultGPUDrivers when nil.
	GPUDrivers dra.GPUDrivers
}

// SlicePublisher publishes a node's devices for kube-scheduler's DRA plugin:
// dra.Publisher for a fleet, dra.Plugin (the kubelet plugin) for one real
// node.
type SlicePublisher interface {
	Publish(ctx context.Context, node string, nd dra.NodeDevices) error
	Release(ctx context.Context, node string) error
}

func (o *Options) defaults() error {
	switch {
	case (o.NodeName == "") == (o.NodeSelector == nil):
		return errors.New("configure the agent: set exactly one of a node name and a node selector")
	case o.Backends == nil:
		return errors.New("configure the agent: no backend")
	case len(o.NodeResources) > 0 && o.NodeSelector == nil:
		return errors.New("configure the agent: node resources are filled in for a fleet of simulated nodes only, whose kubelet is missing")
	}
	if o.Enforce == "" {
		o.Enforce = EnforceReport
	}
	if o.SyncInterval <= 0 {
		o.SyncInterval = 10 * time.Second
	}
	if o.WatchdogInterval <= 0 {
		o.WatchdogInterval = time.Second
	}
	if o.HeartbeatInterval <= 0 {
		o.HeartbeatInterval = time.Minute
	}
	if o.SliceWriteInterval <= 0 {
		o.SliceWriteInterval = time.Second
	}
	if o.OveruseReportInterval <= 0 {
		o.OveruseReportInterval = 5 * time.Minute
	}
	if o.Workers <= 0 {
		o.Workers = 4
	}
	if o.MPS.Runner == nil {
		o.MPS.Runner = ExecRunner{}
	}
	if o.MPS.ControlPath == "" {
		o.MPS.ControlPath = "nvidia-cuda-mps-control"
	}
	if o.MPS.Dir == "" {
		o.MPS.Dir = "/run/partita/mps"
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.Metrics == nil {
		o.Metrics = NewMetrics()
	}
	if o.GPUDrivers == nil {
		o.GPUDrivers = dra.DefaultGPUDrivers
	}
	o.Enforcement.defaults(o.Slices != nil)
	if o.Enforcement.ContainerPath == v1alpha1.ContainerPathNRI && o.NodeSelector != nil {
		return errors.New("configure the agent: the NRI plugin serves the agent's own node, not a fleet")
	}
	return nil
}

// podNodeIndex indexes cached pods by spec.nodeName, sliceNodeIndex
// ResourceSlices.
const (
	podNodeIndex   = "spec.nodeName"
	sliceNodeIndex = "spec.nodeName"
)

// Agent publishes the GPUs of the nodes it serves and watches their slices.
// Each node is synced by one worker at a time, on every change that matters
// to it and every SyncInterval; writes happen only when the published
// state changed or a heartbeat is due.
type Agent struct {
	opts        Options
	cache       cache.Cache
	client      client.Client
	recorder    EventRecorder
	broadcaster events.EventBroadcaster
	queue       workqueue.TypedRateLimitingInterface[string]
	simRunner   *SimulatedRunner // the MPS programs of simulated nodes

	// watchSlices: the API server serves resource.k8s.io/v1, so the agent
	// reads other DRA drivers' ResourceSlices of its nodes.
	watchSlices bool

	lock    sync.Mutex
	nodes   map[string]*nodeState
	synced  bool
	pending map[string]bool // nodes not yet published once since start
	lastErr error           // the single node's last sync error
	baseCtx context.Context
	// facts are what the NRI plugin needs of each served node, from its
	// last sync.
	facts map[string]containerFacts
}

// nodeState is what the agent keeps for a node it serves. Only the worker
// that syncs the node touches it.
type nodeState struct {
	name       string
	backend    Backend
	backendKey string
	ctx        context.Context
	cancel     context.CancelFunc
	watchdog   *watchdog
	mps        *mpsManager
	// mpsChecked is set once the state directory was read for daemons
	// an earlier agent left running.
	mpsChecked bool
	// limited is set when the node's last sync found a slice with a
	// memory limit, which the watchdog may have to end (kill mode).
	limited bool
	// keeperTargets is what was last handed to the MPS keeper.
	keeperTargets *[]mpsTarget
	// exclusive are the devices (by UUID) the agent put in
	// EXCLUSIVE_PROCESS for their MPS daemons; nil until read from the
	// state directory. exclusiveErrs are the last failures, by index, and
	// mpsReason the last MPSReady reason, so that each is reported once.
	exclusive     map[string]bool
	exclusiveErrs map[int32]string
	mpsReason     string
	heartbeat     time.Duration

	// written is the GPUNode as the agent last wrote it, over writtenFrom:
	// while the cache still shows writtenFrom, written is the truth.
	written     *v1alpha1.GPUNode
	writtenFrom string
	// writtenAt is when the agent last wrote the GPUNode's status.
	writtenAt time.Time
	// capacity is the gpu-milli last patched onto the node, over capacityFrom.
	capacity     int64
	capacityFrom string
	// badPods are the allocation errors already logged, by pod.
	badPods map[types.UID]string
	// foreign is what was last logged of the GPUs other DRA drivers
	// publish.
	foreign string
	// enforcementNote is the dmem reason last logged.
	enforcementNote string
}

// New builds an agent on the cluster that cfg reaches. It caches only what
// it serves: in single-node mode its node, its GPUNode and the pods bound to
// it.
func New(cfg *rest.Config, opts Options) (*Agent, error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	scheme, err := clientscheme.New()
	if err != nil {
		return nil, err
	}

	byObject := map[client.Object]cache.ByObject{}
	if opts.NodeName != "" {
		byName := fields.OneTermEqualSelector("metadata.name", opts.NodeName)
		byObject[&corev1.Node{}] = cache.ByObject{Field: byName}
		byObject[&v1alpha1.GPUNode{}] = cache.ByObject{Field: byName}
		byObject[&corev1.Pod{}] = cache.ByObject{Field: fields.OneTermEqualSelector("spec.nodeName", opts.NodeName)}
	} else {
		byObject[&corev1.Node{}] = cache.ByObject{Label: opts.NodeSelector}
		byObject[&corev1.Pod{}] = cache.ByObject{Field: fields.OneTermNotEqualSelector("spec.nodeName", "")}
	}
	if opts.Slices != nil {
		// Claims have no node to select by; the agent reads the ones its
		// pods name.
		byObject[&resourceapi.ResourceClaim{}] = cache.ByObject{}
	}
	watchSlices, err := dra.Served(cfg, "resourceslices")
	if err != nil {
		return nil, err
	}
	if watchSlices {
		// Other drivers' slices of the nodes it serves: the GPUs they
		// publish are theirs (dra.ForeignGPUs).
		sel := cache.ByObject{}
		if opts.NodeName != "" {
			sel.Field = fields.OneTermEqualSelector("spec.nodeName", opts.NodeName)
		}
		byObject[&resourceapi.ResourceSlice{}] = sel
	}
	c, err := cache.New(cfg, cache.Options{Scheme: scheme, ByObject: byObject, DefaultTransform: cache.TransformStripManagedFields()})
	if err != nil {
		return nil, fmt.Errorf("create cache: %w", err)
	}
	if err := c.IndexField(context.Background(), &corev1.Pod{}, podNodeIndex, func(o client.Object) []string {
		return []string{o.(*corev1.Pod).Spec.NodeName}
	}); err != nil {
		return nil, fmt.Errorf("index pods by node: %w", err)
	}
	if watchSlices {
		if err := c.IndexField(context.Background(), &resourceapi.ResourceSlice{}, sliceNodeIndex, func(o client.Object) []string {
			if n := o.(*resourceapi.ResourceSlice).Spec.NodeName; n != nil {
				return []string{*n}
			}
			return nil
		}); err != nil {
			return nil, fmt.Errorf("index ResourceSlices by node: %w", err)
		}
	}
	cl, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("create client: %w", err)
	}
	a := &Agent{
		opts:   opts,
		cache:  c,
		client: cl,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](500*time.Millisecond, 5*time.Minute),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "partita-agent", Clock: opts.Clock},
		),
		nodes:       map[string]*nodeState{},
		pending:     map[string]bool{},
		facts:       map[string]containerFacts{},
		simRunner:   NewSimulatedRunner(),
		watchSlices: watchSlices,
	}
	a.recorder = opts.Recorder
	if a.recorder == nil {
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return nil, fmt.Errorf("create event client: %w", err)
		}
		a.broadcaster = events.NewBroadcaster(&events.EventSinkImpl{Interface: cs.EventsV1()})
		a.recorder = a.broadcaster.NewRecorder(scheme, "partita.dev/agent")
	}
	return a, nil
}

// fleet reports whether the agent serves nodes by selector.
func (a *Agent) fleet() bool { return a.opts.NodeSelector != nil }

// Run serves the nodes until ctx ends. The MPS control daemons it runs are
// left running for the next agent.
func (a *Agent) Run(ctx context.Context) error {
	log := logr.FromContextOrDiscard(ctx)
	a.lock.Lock()
	a.baseCtx = ctx
	a.lock.Unlock()
	if a.broadcaster != nil {
		if err := a.broadcaster.StartRecordingToSinkWithContext(ctx); err != nil {
			return fmt.Errorf("start event recording: %w", err)
		}
		defer a.broadcaster.Shutdown()
	}
	if err := a.addHandlers(ctx); err != nil {
		return err
	}
	cacheErr := make(chan error, 1)
	go func() { cacheErr <- a.cache.Start(ctx) }()
	if !a.cache.WaitForCacheSync(ctx) {
		select {
		case err := <-cacheErr:
			return fmt.Errorf("start cache: %w", err)
		default:
			return fmt.Errorf("sync caches: %w", ctx.Err())
		}
	}
	var nodes corev1.NodeList
	if err := a.cache.List(ctx, &nodes); err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	a.lock.Lock()
	for _, n := range nodes.Items {
		a.pending[n.Name] = true
		a.queue.Add(n.Name)
	}
	if !a.fleet() {
		a.pending[a.opts.NodeName] = true
		a.queue.Add(a.opts.NodeName)
	}
	a.synced = true
	a.lock.Unlock()
	log.Info("Serving GPU nodes", "nodes", len(nodes.Items), "fleet", a.fleet(), "mode", a.opts.Mode, "enforce", a.opts.Enforce)

	var wg sync.WaitGroup
	for range a.opts.Workers {
		wg.Go(func() {
			for a.processNext(ctx) {
			}
		})
	}
	<-ctx.Done()
	a.queue.ShutDown()
	wg.Wait()
	a.lock.Lock()
	states := a.nodes
	a.nodes = map[string]*nodeState{}
	a.lock.Unlock()
	for _, st := range states {
		st.stop()
	}
	return nil
}

// Ready says whether the agent has published every node it served at
// start, and, for a single node, whether the last sync worked.
func (a *Agent) Ready() error {
	a.lock.Lock()
	defer a.lock.Unlock()
	switch {
	case !a.synced:
		return errors.New("caches not synced yet")
	case a.lastErr != nil:
		return a.lastErr
	case len(a.pending) > 0:
		return fmt.Errorf("%d nodes not published yet", len(a.pending))
	}
	return nil
}

func (a *Agent) addHandlers(ctx context.Context) error {
	enqueue := func(name string) {
		if name != "" {
			a.queue.Add(name)
		}
	}
	key := func(obj any) string {
		k, _ := toolscache.DeletionHandlingMetaNamespaceKeyFunc(obj)
		return k
	}
	inf, err := a.cache.GetInformer(ctx, &corev1.Node{})
	if err != nil {
		return fmt.Errorf("watch nodes: %w", err)
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { enqueue(key(obj)) },
		UpdateFunc: func(oldObj, newObj any) {
			o, n := oldObj.(*corev1.Node), newObj.(*corev1.Node)
			oc, oa := nodeMilli(o)
			nc, na := nodeMilli(n)
			if o.UID != n.UID || oc != nc || oa != na || !labels.Equals(o.Labels, n.Labels) ||
				o.Annotations[AnnotationSimulateUnhealthy] != n.Annotations[AnnotationSimulateUnhealthy] {
				enqueue(n.Name)
			}
		},
		DeleteFunc: func(obj any) { enqueue(key(obj)) },
	}); err != nil {
		return fmt.Errorf("watch nodes: %w", err)
	}

	inf, err = a.cache.GetInformer(ctx, &v1alpha1.GPUNode{})
	if err != nil {
		return fmt.Errorf("watch GPUNodes: %w", err)
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { enqueue(key(obj)) },
		UpdateFunc: func(oldObj, newObj any) {
			// Status changes are the agent's own writes; only spec and owners
			// need a look.
			o, n := oldObj.(*v1alpha1.GPUNode), newObj.(*v1alpha1.GPUNode)
			if o.Generation != n.Generation || len(o.OwnerReferences) != len(n.OwnerReferences) ||
				o.Annotations[v1alpha1.AnnotationResetHealth] != n.Annotations[v1alpha1.AnnotationResetHealth] ||
				(len(n.OwnerReferences) > 0 && o.OwnerReferences[0].UID != n.OwnerReferences[0].UID) {
				enqueue(n.Name)
			}
		},
		DeleteFunc: func(obj any) { enqueue(key(obj)) },
	}); err != nil {
		return fmt.Errorf("watch GPUNodes: %w", err)
	}

	podNode := func(obj any) {
		if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		p, ok := obj.(*corev1.Pod)
		if !ok || !hasAllocation(p) {
			return
		}
		a.lock.Lock()
		_, served := a.nodes[p.Spec.NodeName]
		a.lock.Unlock()
		if served {
			enqueue(p.Spec.NodeName)
		}
	}
	inf, err = a.cache.GetInformer(ctx, &corev1.Pod{})
	if err != nil {
		return fmt.Errorf("watch pods: %w", err)
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    podNode,
		UpdateFunc: func(_, newObj any) { podNode(newObj) },
		DeleteFunc: podNode,
	}); err != nil {
		return fmt.Errorf("watch pods: %w", err)
	}
	if !a.watchSlices {
		return nil
	}
	sliceNode := func(obj any) {
		if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		s, ok := obj.(*resourceapi.ResourceSlice)
		if !ok || s.Spec.Driver == dra.DriverName || s.Spec.NodeName == nil {
			return
		}
		a.lock.Lock()
		_, served := a.nodes[*s.Spec.NodeName]
		a.lock.Unlock()
		if served {
			enqueue(*s.Spec.NodeName)
		}
	}
	inf, err = a.cache.GetInformer(ctx, &resourceapi.ResourceSlice{})
	if err != nil {
		return fmt.Errorf("watch ResourceSlices: %w", err)
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    sliceNode,
		UpdateFunc: func(_, newObj any) { sliceNode(newObj) },
		DeleteFunc: sliceNode,
	}); err != nil {
		return fmt.Errorf("watch ResourceSlices: %w", err)
	}
	return nil
}

// markForeign sets draDriver on the devices of node that other DRA drivers
// publish, read from the cached ResourceSlices, and logs when that changes.
func (a *Agent) markForeign(ctx context.Context, st *nodeState, devices []v1alpha1.GPUDevice) ([]v1alpha1.GPUDevice, error) {
	if !a.watchSlices {
		return devices, nil
	}
	var list resourceapi.ResourceSliceList
	if err := a.cache.List(ctx, &list, client.MatchingFields{sliceNodeIndex: st.name}); err != nil {
		return devices, fmt.Errorf("list ResourceSlices: %w", err)
	}
	own := make([]*resourceapi.ResourceSlice, 0, len(list.Items))
	for i := range list.Items {
		own = append(own, &list.Items[i])
	}
	out, drivers := dra.MarkForeign(devices, dra.ForeignGPUs(st.name, devices, own, a.opts.GPUDrivers))
	var b strings.Builder
	for _, d := range out {
		if d.DRADriver != "" {
			fmt.Fprintf(&b, "%d=%s ", d.Index, d.DRADriver)
		}
	}
	if note := b.String(); note != st.foreign {
		st.foreign = note
		log := logr.FromContextOrDiscard(ctx)
		if note == "" {
			log.V(2).Info("No other DRA driver publishes the node's GPUs; offering them all")
		} else {
			log.Info("GPUs published by another DRA driver are left to it", "drivers", drivers, "devices", strings.TrimSpace(note))
		}
	}
	return out, nil
}

// ownDevices are the devices no other DRA driver publishes.
func ownDevices(devices []v1alpha1.GPUDevice) []v1alpha1.GPUDevice {
	return slices.DeleteFunc(slices.Clone(devices), func(d v1alpha1.GPUDevice) bool { return d.DRADriver != "" })
}

func (a *Agent) processNext(ctx context.Context) bool {
	name, shutdown := a.queue.Get()
	if shutdown {
		return false
	}
	defer a.queue.Done(name)
	log := logr.FromContextOrDiscard(ctx).WithValues("node", name)
	served, err := a.sync(logr.NewContext(ctx, log), name)
	if !a.fleet() {
		a.lock.Lock()
		a.lastErr = err
		a.lock.Unlock()
	}
	if err != nil {
		log.Error(err, "Could not sync node; retrying with backoff")
		a.queue.AddRateLimited(name)
		return true
	}
	a.queue.Forget(name)
	if served {
		every := a.nextCheck(name)
		jitter := time.Duration(rand.Int64N(int64(every)/10 + 1))
		a.queue.AddAfter(name, every+jitter)
	}
	return true
}

// nextCheck is how long a node waits for its next sync: WatchdogInterval
// while the watchdog may have to end a process on it (kill mode, slices
// with a memory limit), SyncInterval otherwise. Only the worker that
// syncs the node calls it.
func (a *Agent) nextCheck(name string) time.Duration {
	a.lock.Lock()
	st := a.nodes[name]
	a.lock.Unlock()
	return checkInterval(a.opts, st != nil && st.limited)
}

// checkInterval is nextCheck's rule.
func checkInterval(o Options, limited bool) time.Duration {
	if o.Enforce == EnforceKill && limited {
		return min(o.WatchdogInterval, o.SyncInterval)
	}
	return o.SyncInterval
}

// sync reads one node's GPUs and pods, applies and checks the slices, and
// publishes what changed. It reports whether the node is served.
func (a *Agent) sync(ctx context.Context, name string) (bool, error) {
	start := a.opts.Clock.Now()
	defer func() { a.opts.Metrics.syncDuration.Observe(a.opts.Clock.Since(start).Seconds()) }()
	log := logr.FromContextOrDiscard(ctx)

	node := &corev1.Node{}
	if err := a.cache.Get(ctx, client.ObjectKey{Name: name}, node); err != nil {
		if !apierrors.IsNotFound(err) {
			return true, fmt.Errorf("read node: %w", err)
		}
		if !a.fleet() {
			log.V(2).Info("Waiting for the node to exist")
			return true, nil
		}
		return false, a.release(ctx, name)
	}
	st, err := a.state(ctx, node)
	if err != nil || st == nil {
		a.donePending(name)
		if err != nil {
			log.Error(err, "Not serving node")
		}
		return false, a.release(ctx, name)
	}

	gn := &v1alpha1.GPUNode{}
	if err := a.cache.Get(ctx, client.ObjectKey{Name: name}, gn); err != nil {
		if !apierrors.IsNotFound(err) {
			return true, fmt.Errorf("read GPUNode: %w", err)
		}
		gn = nil
	}
	gn = st.current(gn)
	if gn, err = a.resetHealth(ctx, st, gn); err != nil {
		return true, err
	}
	mode := a.effectiveMode(ctx, gn)

	var podList corev1.PodList
	if err := a.cache.List(ctx, &podList, client.MatchingFields{podNodeIndex: name}); err != nil {
		return true, fmt.Errorf("list pods: %w", err)
	}
	pods := make([]*corev1.Pod, len(podList.Items))
	for i := range podList.Items {
		pods[i] = &podList.Items[i]
	}
	if sim, ok := st.backend.(*Simulated); ok {
		sim.Simulate(node, pods, a.opts.SimulatedUsage)
	}

	var devices []v1alpha1.GPUDevice
	var held []boundPod
	var inv *gpu.NodeInventory
	snap, snapErr := st.backend.Snapshot(ctx)
	switch {
	case snapErr != nil && !IsUnavailable(snapErr):
		return true, fmt.Errorf("read GPUs: %w", snapErr)
	case snapErr != nil:
		// Nothing new may land on GPUs the agent cannot see.
		if gn != nil {
			devices = unavailableDevices(gn.Status.Devices, snapErr.Error())
		}
		held, _ = allocationsOn(inventoryOf(name, mode, toStates(devices)), pods)
		a.opts.Metrics.reportDevices(name, &Snapshot{Devices: toStates(devices)}, allocatedMilli(held), nil)
	default:
		var published []v1alpha1.GPUDevice
		if gn != nil {
			published = gn.Status.Devices
		}
		identifyDevices(snap.Devices, published)
		devices = make([]v1alpha1.GPUDevice, len(snap.Devices))
		for i, d := range snap.Devices {
			devices[i] = d.GPUDevice
		}
		var bad map[types.UID]error
		inv = inventoryOf(name, mode, snap.Devices)
		held, bad = allocationsOn(inv, pods)
		st.logBadPods(log, pods, bad)
		if a.opts.Slices != nil {
			held = append(held, a.claimAllocationsOn(ctx, inv, pods, held)...)
		}
	}

	devices, err = a.markForeign(ctx, st, devices)
	if err != nil {
		return true, err
	}
	used := map[sliceKey]int64{}
	var prevConds []metav1.Condition
	var mpsCond *metav1.Condition
	if gn != nil {
		prevConds = gn.Status.Conditions
		mpsCond = apimeta.FindStatusCondition(prevConds, v1alpha1.ConditionMPSReady)
	}
	if snap != nil {
		var unattributed map[int32]int64
		used, unattributed = st.watchdog.check(ctx, held, snap.Processes)
		st.limited = hasLimit(held)
		a.opts.Metrics.reportDevices(name, snap, allocatedMilli(held), unattributed)
		mpsCond = a.applyMode(ctx, st, mode, devices, held)
	}
	if mode != v1alpha1.IsolationMPS {
		mpsCond = nil
	}
	status := buildStatus(devices, slicesOf(held, used), mode, a.opts.Version, metav1.NewTime(a.opts.Clock.Now()))
	status.Enforcement = a.enforcement(ctx, st, mode, inv)
	status.Conditions = a.statusConditions(st, prevConds, mpsCond)
	var offer error
	if a.opts.Slices != nil {
		// Another driver's GPUs are its own to publish: offering them
		// twice would let two drivers' claims book one GPU.
		nd := dra.NodeDevices{Devices: ownDevices(devices), Mode: mode, ExtenderHeld: extenderHeld(held)}
		offer = errors.Join(a.opts.Slices.Publish(ctx, name, nd), a.withdrawCapacity(ctx, node, st))
	} else {
		offer = a.publishCapacity(ctx, node, st, capacityMilli(devices))
	}
	err = errors.Join(a.publish(ctx, node, gn, st, status), offer)
	if err == nil && snapErr == nil {
		a.donePending(name)
	}
	return true, errors.Join(snapErr, err)
}

func toStates(devices []v1alpha1.GPUDevice) []DeviceState {
	out := make([]DeviceState, len(devices))
	for i, d := range devices {
		out[i] = DeviceState{GPUDevice: d, UtilizationPercent: -1}
	}
	return out
}

// donePending records that a node was published once since start.
func (a *Agent) donePending(name string) {
	a.lock.Lock()
	defer a.lock.Unlock()
	delete(a.pending, name)
}

// effectiveMode is the isolation mode to apply: the flag's, else the
// GPUNode's spec, else time-slicing. mig is not supported yet.
func (a *Agent) effectiveMode(ctx context.Context, gn *v1alpha1.GPUNode) v1alpha1.IsolationMode {
	m := a.opts.Mode
	if m == "" && gn != nil {
		m = gn.Spec.Isolation
	}
	switch m {
	case "":
		return v1alpha1.IsolationTimeSlicing
	case v1alpha1.IsolationMIG:
		logr.FromContextOrDiscard(ctx).V(2).Info("Isolation mode mig is not supported yet; using time-slicing")
		return v1alpha1.IsolationTimeSlicing
	}
	return m
}

// applyMode prepares the node for its isolation mode: in mps mode one
// control daemon per device that can be shared, in EXCLUSIVE_PROCESS
// compute mode, holding each client to the device's largest slice. It
// returns the MPSReady condition in mps mode. time-slicing and hami-core
// need nothing on the node: the pod's environment carries its limits, and
// daemons an earlier agent left running are ended, their devices put back
// to DEFAULT.
func (a *Agent) applyMode(ctx context.Context, st *nodeState, mode v1alpha1.IsolationMode, devices []v1alpha1.GPUDevice, held []boundPod) *metav1.Condition {
	var plan mpsPlan
	if mode == v1alpha1.IsolationMPS {
		plan = planMPS(devices, held)
	}
	targets := plan.targets
	_, sim := st.backend.(*Simulated)
	cfg := a.opts.MPS
	if sim {
		// Simulated daemons live in this process: nothing to record, hand
		// over or adopt.
		cfg.Runner, cfg.StateDir, cfg.Keeper = a.simRunner, "", false
	}
	name := st.name
	cfg.OnDrift = func(device int32, drift []string) {
		a.recorder.Eventf(gpuNodeRef(name), nil, corev1.EventTypeWarning, ReasonMPSLimitsRepaired, "RepairMPS",
			"device %d: a client of its MPS daemon changed its limits through the control pipe (%s); the agent set them again", device, truncate(strings.Join(drift, "; "), 512))
	}
	// EXCLUSIVE_PROCESS before a daemon starts, DEFAULT after it stopped.
	notExclusive := a.holdExclusive(ctx, st, cfg.StateDir, targets)
	a.runDaemons(ctx, st, mode, cfg, targets)
	a.releaseExclusive(ctx, st, cfg.StateDir, devices, targets)
	if mode != v1alpha1.IsolationMPS {
		return nil
	}
	ec := a.opts.Enforcement
	interposer := interposerInstalled(ec.InterposerDir) && ec.ContainerPath != v1alpha1.ContainerPathPodSpec
	c := mpsCondition(plan, a.runningDaemons(ctx, st, cfg), notExclusive, cfg.Keeper, interposer)
	return &c
}

// runDaemons starts, hands over or ends the node's MPS control daemons so
// that targets have one each.
func (a *Agent) runDaemons(ctx context.Context, st *nodeState, mode v1alpha1.IsolationMode, cfg MPSConfig, targets []mpsTarget) {
	if cfg.Keeper {
		a.handToKeeper(ctx, st, cfg, targets)
		return
	}
	if st.mps == nil {
		if mode != v1alpha1.IsolationMPS && st.mpsChecked {
			return
		}
		st.mpsChecked = true
		st.mps = newMPSManager(ctx, st.name, cfg, a.opts.Clock, a.opts.Metrics)
	}
	if mode != v1alpha1.IsolationMPS {
		// Ends the daemons this agent ran, and those a previous one left.
		st.mps.stopAll(ctx)
		st.mps = nil
		return
	}
	st.mps.ensure(st.ctx, targets)
}

// handToKeeper writes the devices that need an MPS control daemon for the
// MPS keeper (`partita mps-keeper`), when they changed. The keeper's
// process outlives the agent's container, and so do its daemons.
func (a *Agent) handToKeeper(ctx context.Context, st *nodeState, cfg MPSConfig, targets []mpsTarget) {
	if targets == nil {
		targets = []mpsTarget{}
	}
	slices.SortFunc(targets, func(x, y mpsTarget) int { return int(x.Index) - int(y.Index) })
	if st.keeperTargets != nil && slices.Equal(*st.keeperTargets, targets) {
		return
	}
	if len(targets) == 0 && st.keeperTargets == nil {
		// Nothing to hand over and nothing handed over before: a node that
		// was never in mps mode needs no file.
		if _, ok, err := readMPSTargets(cfg.StateDir); err == nil && !ok {
			st.keeperTargets = &targets
			return
		}
	}
	if err := writeMPSTargets(cfg.StateDir, st.name, targets); err != nil {
		logr.FromContextOrDiscard(ctx).Error(err, "Could not hand the MPS daemons to the keeper; retrying at the next sync")
		return
	}
	logr.FromContextOrDiscard(ctx).V(2).Info("Handed the MPS daemons to the keeper", "devices", len(targets))
	st.keeperTargets = &targets
}

// state returns the agent's state for a node, creating it (and starting its
// health watch) on first sight, and replacing it when the node's backend
// changed. It returns nil when the node has no GPUs to serve.
func (a *Agent) state(ctx context.Context, node *corev1.Node) (*nodeState, error) {
	b, key, err := a.opts.Backends(node)
	if err != nil || b == nil {
		return nil, err
	}
	a.lock.Lock()
	defer a.lock.Unlock()
	if st := a.nodes[node.Name]; st != nil {
		if st.backendKey == key && st.ctx.Err() == nil {
			return st, nil
		}
		logr.FromContextOrDiscard(ctx).V(2).Info("Node's GPUs changed; replacing its backend", "from", st.backendKey, "to", key)
		st.stop()
	}
	nctx, cancel := context.WithCancel(logr.NewContext(a.baseCtx, logr.FromContextOrDiscard(ctx)))
	killer, _ := b.(ProcessKiller)
	h := fnv.New32a()
	_, _ = h.Write([]byte(node.Name))
	// Spread heartbeats over the last fifth of the interval so that a fleet
	// started at once does not write at once forever after.
	spread := time.Duration(float64(a.opts.HeartbeatInterval/5) * float64(h.Sum32()) / float64(1<<32))
	st := &nodeState{
		name:       node.Name,
		backend:    b,
		backendKey: key,
		ctx:        nctx,
		cancel:     cancel,
		watchdog:   newWatchdog(node.Name, a.opts.Enforce, a.opts.OveruseReportInterval, a.opts.Clock, a.recorder, killer, a.opts.Metrics),
		heartbeat:  a.opts.HeartbeatInterval - spread,
		badPods:    map[types.UID]string{},
	}
	if w, ok := b.(HealthWatcher); ok {
		name := node.Name
		go func() {
			if err := w.WatchHealth(nctx, func() { a.queue.Add(name) }); err != nil {
				logr.FromContextOrDiscard(nctx).Error(err, "Stopped watching GPU health")
			}
		}()
	}
	a.nodes[node.Name] = st
	a.opts.Metrics.nodes.Set(float64(len(a.nodes)))
	return st, nil
}

// stop ends what the agent runs for the node, but leaves its MPS control
// daemons running, recorded for the next agent: their clients must not
// notice an agent restart or upgrade.
func (st *nodeState) stop() {
	st.cancel()
	if st.mps != nil {
		st.mps.detach()
	}
}

// current returns the freshest view of the node's GPUNode: the cache's,
// unless the cache still shows the version the agent last wrote over.
func (st *nodeState) current(cached *v1alpha1.GPUNode) *v1alpha1.GPUNode {
	if cached != nil && st.written != nil && cached.ResourceVersion == st.writtenFrom && cached.UID == st.written.UID {
		return st.written.DeepCopy()
	}
	return cached
}

// logBadPods logs, once per pod and reason, the pods whose allocation
// could not be read.
func (st *nodeState) logBadPods(log logr.Logger, pods []*corev1.Pod, bad map[types.UID]error) {
	for _, p := range pods {
		err, ok := bad[p.UID]
		if !ok {
			delete(st.badPods, p.UID)
			continue
		}
		if st.badPods[p.UID] != err.Error() {
			st.badPods[p.UID] = err.Error()
			log.Error(err, "Ignored a pod whose GPU allocation does not read", "pod", klog.KObj(p))
		}
	}
}

// ownerRef makes a GPUNode belong to its Node, so that deleting the node
// deletes it too.
func ownerRef(node *corev1.Node) metav1.OwnerReference {
	return metav1.OwnerReference{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID}
}

// publish writes the node's GPUNode when its inventory changed or its
// heartbeat is due, creating it when missing and pointing its owner at the
// current Node (a node deleted and created again has a new UID).
func (a *Agent) publish(ctx context.Context, node *corev1.Node, gn *v1alpha1.GPUNode, st *nodeState, want v1alpha1.GPUNodeStatus) error {
	log := logr.FromContextOrDiscard(ctx)
	if gn == nil {
		gn = &v1alpha1.GPUNode{
			ObjectMeta: metav1.ObjectMeta{Name: node.Name, OwnerReferences: []metav1.OwnerReference{ownerRef(node)}},
			Spec:       v1alpha1.GPUNodeSpec{Isolation: a.opts.Mode},
		}
		err := a.client.Create(ctx, gn)
		a.countWrite(writeGPUNode, err)
		switch {
		case apierrors.IsAlreadyExists(err):
			// The cache has not seen it yet: read it.
			if err := a.client.Get(ctx, client.ObjectKey{Name: node.Name}, gn); err != nil {
				return fmt.Errorf("read GPUNode: %w", err)
			}
		case err != nil:
			return fmt.Errorf("create GPUNode: %w", err)
		default:
			log.V(2).Info("Created GPUNode")
		}
	}
	if len(gn.OwnerReferences) != 1 || gn.OwnerReferences[0].UID != node.UID {
		gn = gn.DeepCopy()
		gn.OwnerReferences = []metav1.OwnerReference{ownerRef(node)}
		err := a.client.Update(ctx, gn)
		a.countWrite(writeGPUNode, err)
		if err != nil {
			return fmt.Errorf("set owner of GPUNode: %w", err)
		}
		log.V(2).Info("Pointed GPUNode at the current node", "uid", node.UID)
	}
	hb := gn.Status.Heartbeat
	due := hb == nil || a.opts.Clock.Since(hb.Time) >= st.heartbeat
	if !due && sameInventory(&gn.Status, &want) {
		return nil
	}
	if !due && sameDevices(&gn.Status, &want) {
		// Only pods came or went: wait out the interval since the last
		// write, so that the pods that follow share the write.
		if wait := st.writtenAt.Add(a.opts.SliceWriteInterval).Sub(a.opts.Clock.Now()); wait > 0 {
			a.queue.AddAfter(node.Name, wait)
			return nil
		}
	}
	out := gn.DeepCopy()
	out.Status = want
	err := a.client.Status().Update(ctx, out)
	a.countWrite(writeGPUNode, err)
	if err != nil {
		return fmt.Errorf("update GPUNode status: %w", err)
	}
	if !sameInventory(&gn.Status, &want) {
		log.V(2).Info("Published GPUs", "devices", want.DeviceCount, "healthy", want.HealthyDevices, "slices", len(want.Slices), "allocatedMilli", want.AllocatedMilli, "mode", want.Isolation)
	}
	st.written, st.writtenFrom, st.writtenAt = out, gn.ResourceVersion, a.opts.Clock.Now()
	return nil
}

// publishCapacity sets the node's partita.dev/gpu-milli capacity and
// allocatable to milli, when they differ, with the node resources it lacks
// (Options.NodeResources). The kubelet copies capacity to allocatable for
// extended resources; kwok does not, so the agent sets both.
func (a *Agent) publishCapacity(ctx context.Context, node *corev1.Node, st *nodeState, milli int64) error {
	a.opts.Metrics.capacityMilli.WithLabelValues(node.Name).Set(float64(milli))
	if node.ResourceVersion == st.capacityFrom && milli == st.capacity {
		return nil // the cache has not caught up with our last patch
	}
	fill := missingResources(node, a.opts.NodeResources)
	if c, al := nodeMilli(node); c == milli && al == milli && fill.empty() {
		return nil
	}
	if err := a.patchCapacity(ctx, node, &milli, fill); err != nil {
		return err
	}
	logr.FromContextOrDiscard(ctx).V(2).Info("Set node GPU capacity", "gpuMilli", milli, "filledIn", fill.String())
	st.capacity, st.capacityFrom = milli, node.ResourceVersion
	return nil
}

// withdrawCapacity removes the node's partita.dev/gpu-milli capacity in dra
// mode: the devices are offered as ResourceSlices, and offering them twice
// would let the extender's pods and the claims book them twice. It fills in
// the node resources the node lacks as publishCapacity does.
func (a *Agent) withdrawCapacity(ctx context.Context, node *corev1.Node, st *nodeState) error {
	a.opts.Metrics.capacityMilli.WithLabelValues(node.Name).Set(0)
	if node.ResourceVersion == st.capacityFrom && st.capacity == -1 {
		return nil // the cache has not caught up with our last patch
	}
	fill := missingResources(node, a.opts.NodeResources)
	if c, al := nodeMilli(node); c < 0 && al < 0 && fill.empty() {
		return nil
	}
	if err := a.patchCapacity(ctx, node, nil, fill); err != nil {
		return err
	}
	logr.FromContextOrDiscard(ctx).V(2).Info("Removed node GPU capacity: its GPUs are DRA devices", "filledIn", fill.String())
	st.capacity, st.capacityFrom = -1, node.ResourceVersion
	return nil
}

// extenderHeld are the indexes of the devices that pods placed by the
// extender (allocation annotations, not claims) hold.
func extenderHeld(held []boundPod) []int32 {
	var out []int32
	for _, h := range held {
		if len(h.pod.Spec.ResourceClaims) > 0 && !hasAllocation(h.pod) {
			continue
		}
		for _, c := range h.alloc.Containers {
			for _, i := range c.DeviceIndexes {
				if !slices.Contains(out, i) {
					out = append(out, i)
				}
			}
		}
	}
	slices.Sort(out)
	return out
}

// claimAllocationsOn reads what the pods on inv's node hold through
// Partita's claims (dra mode), for the pods that hold nothing through
// allocation annotations.
func (a *Agent) claimAllocationsOn(ctx context.Context, inv *gpu.NodeInventory, pods []*corev1.Pod, annotated []boundPod) []boundPod {
	get := func(ns, name string) (*resourceapi.ResourceClaim, bool) {
		c := &resourceapi.ResourceClaim{}
		if err := a.cache.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, c); err != nil {
			return nil, false
		}
		return c, true
	}
	var out []boundPod
	for _, p := range pods {
		if p.Spec.NodeName != inv.Name || !holdsGPUs(p) || len(p.Spec.ResourceClaims) == 0 ||
			slices.ContainsFunc(annotated, func(b boundPod) bool { return b.pod.UID == p.UID }) {
			continue
		}
		if alloc, ok := dra.AllocationFromClaims(p, inv, get); ok {
			out = append(out, boundPod{pod: p, alloc: alloc})
		}
	}
	return out
}

// patchCapacity sets (or, with nil, removes) the node's gpu-milli capacity
// and allocatable, and fills in what fill says the node lacks.
func (a *Agent) patchCapacity(ctx context.Context, node *corev1.Node, milli *int64, fill resourceFill) error {
	data, err := capacityPatch(milli, fill)
	if err != nil {
		return err
	}
	err = a.client.Status().Patch(ctx, node.DeepCopy(), client.RawPatch(types.MergePatchType, data))
	a.countWrite(writeCapacity, err)
	if err != nil {
		return fmt.Errorf("patch node capacity: %w", err)
	}
	return nil
}

// capacityPatch is the merge patch of a node's status that sets milli as
// its gpu-milli capacity and allocatable (nil removes them) and adds fill.
// A merge patch names only its keys: what the kubelet, kwok or a person
// wrote of other resources stays.
func capacityPatch(milli *int64, fill resourceFill) ([]byte, error) {
	var v any
	if milli != nil {
		q := milliQuantity(*milli)
		v = q.String()
	}
	side := func(l corev1.ResourceList) map[string]any {
		r := map[string]any{string(v1alpha1.ResourceGPUMilli): v}
		for name, q := range l {
			r[string(name)] = q.String()
		}
		return r
	}
	data, err := json.Marshal(map[string]any{"status": map[string]any{"capacity": side(fill.capacity), "allocatable": side(fill.allocatable)}})
	if err != nil {
		return nil, fmt.Errorf("encode capacity patch: %w", err)
	}
	return data, nil
}

// resourceFill is what a node's status lacks of Options.NodeResources, on
// each side.
type resourceFill struct {
	capacity, allocatable corev1.ResourceList
}

func (f resourceFill) empty() bool { return len(f.capacity) == 0 && len(f.allocatable) == 0 }

// String names the resources filled in, for logs: "allocatable pods, cpu".
func (f resourceFill) String() string {
	var parts []string
	for _, side := range []struct {
		name string
		l    corev1.ResourceList
	}{{"capacity", f.capacity}, {"allocatable", f.allocatable}} {
		if len(side.l) == 0 {
			continue
		}
		names := make([]string, 0, len(side.l))
		for n := range side.l {
			names = append(names, string(n))
		}
		slices.Sort(names)
		parts = append(parts, side.name+" "+strings.Join(names, ", "))
	}
	return strings.Join(parts, "; ")
}

// missingResources is what node's status lacks of want: each resource of
// want absent from its capacity or its allocatable, on that side. A
// resource present, whatever its value, is left as it is.
func missingResources(node *corev1.Node, want corev1.ResourceList) resourceFill {
	var f resourceFill
	for name, q := range want {
		if _, ok := node.Status.Capacity[name]; !ok {
			if f.capacity == nil {
				f.capacity = corev1.ResourceList{}
			}
			f.capacity[name] = q
		}
		if _, ok := node.Status.Allocatable[name]; !ok {
			if f.allocatable == nil {
				f.allocatable = corev1.ResourceList{}
			}
			f.allocatable[name] = q
		}
	}
	return f
}

// ParseNodeResources reads a --simulate-node-resources value:
// "pods=110,cpu=64,memory=512Gi", quantities as Kubernetes writes them.
// Only pods, cpu and memory may be named: the GPUs are the agent's to
// count.
func ParseNodeResources(s string) (corev1.ResourceList, error) {
	out := corev1.ResourceList{}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, value, ok := strings.Cut(part, "=")
		if !ok {
			return nil, fmt.Errorf("read node resource %q: want name=quantity, e.g. pods=110", part)
		}
		rn := corev1.ResourceName(strings.TrimSpace(name))
		switch rn {
		case corev1.ResourcePods, corev1.ResourceCPU, corev1.ResourceMemory:
		default:
			return nil, fmt.Errorf("read node resource %q: want pods, cpu or memory", part)
		}
		q, err := resource.ParseQuantity(strings.TrimSpace(value))
		if err != nil {
			return nil, fmt.Errorf("read node resource %q: %w", part, err)
		}
		if q.Sign() <= 0 {
			return nil, fmt.Errorf("read node resource %q: want a positive amount", part)
		}
		if _, dup := out[rn]; dup {
			return nil, fmt.Errorf("read node resources %q: %s named twice", s, rn)
		}
		out[rn] = q
	}
	return out, nil
}

func (a *Agent) countWrite(kind string, err error) {
	result := resultOK
	if err != nil {
		result = resultError
	}
	a.opts.Metrics.apiWrites.WithLabelValues(kind, result).Inc()
}

// release stops serving a node that is gone or no longer selected. In fleet
// mode it removes the node's GPUNode and, when the node still exists, its
// gpu-milli capacity, so that nothing stale is left behind. On error the
// node stays known and the next sync tries again.
func (a *Agent) release(ctx context.Context, name string) error {
	a.lock.Lock()
	st := a.nodes[name]
	delete(a.pending, name)
	a.lock.Unlock()
	if st == nil {
		return nil
	}
	st.stop()
	if st.mps != nil {
		// The node left: its daemons have no clients to serve any more.
		st.mps.stopAll(ctx)
	}
	a.opts.Metrics.clearNode(name)
	if a.opts.Slices != nil {
		if err := a.opts.Slices.Release(ctx, name); err != nil {
			return err
		}
	}
	if a.fleet() {
		live := &corev1.Node{}
		err := a.client.Get(ctx, client.ObjectKey{Name: name}, live)
		switch {
		case err == nil:
			if c, al := nodeMilli(live); c >= 0 || al >= 0 {
				if err := a.patchCapacity(ctx, live, nil, resourceFill{}); err != nil && !apierrors.IsNotFound(err) {
					return err
				}
			}
		case !apierrors.IsNotFound(err):
			return fmt.Errorf("read node: %w", err)
		}
		gn := &v1alpha1.GPUNode{ObjectMeta: metav1.ObjectMeta{Name: name}}
		err = a.client.Delete(ctx, gn)
		a.countWrite(writeGPUNode, err)
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete GPUNode: %w", err)
		}
	}
	a.lock.Lock()
	delete(a.nodes, name)
	a.opts.Metrics.nodes.Set(float64(len(a.nodes)))
	a.lock.Unlock()
	logr.FromContextOrDiscard(ctx).V(2).Info("Stopped serving node")
	return nil
}

// Event reasons of the agent on GPUNodes.
const (
	// ReasonHealthReset: the agent forgot the faults of devices an operator
	// reset (partita.dev/reset-health).
	ReasonHealthReset = "HealthReset"
	// ReasonHealthResetRefused: the annotation did not read.
	ReasonHealthResetRefused = "HealthResetRefused"
)

// resetHealth acts on the GPUNode's partita.dev/reset-health annotation: it
// tells the backend to forget the faults of the devices it names, then
// removes the annotation (only if it still says the same, so that a newer
// request is never lost). It returns the GPUNode as it is now.
func (a *Agent) resetHealth(ctx context.Context, st *nodeState, gn *v1alpha1.GPUNode) (*v1alpha1.GPUNode, error) {
	if gn == nil {
		return nil, nil
	}
	value, ok := gn.Annotations[v1alpha1.AnnotationResetHealth]
	if !ok {
		return gn, nil
	}
	log := logr.FromContextOrDiscard(ctx)
	sel, err := ParseDeviceSelector(value)
	switch r, resets := st.backend.(HealthResetter); {
	case err != nil:
		log.Error(err, "Ignored a health reset that does not read")
		a.recorder.Eventf(gn, nil, corev1.EventTypeWarning, ReasonHealthResetRefused, "ResetHealth", "%s; the annotation was removed", err.Error())
	case !resets:
		log.Info("Health reset asked of a backend that keeps no faults; nothing to forget", "value", value)
	default:
		cleared, err := r.ResetHealth(sel)
		if err != nil {
			return gn, err
		}
		log.Info("Forgot the faults of reset GPUs", "value", value, "cleared", cleared)
		note := fmt.Sprintf("%s=%s: no device had a fault to forget", v1alpha1.AnnotationResetHealth, value)
		if len(cleared) > 0 {
			note = fmt.Sprintf("%s=%s: forgot the faults of %s; they take work again unless they fail again", v1alpha1.AnnotationResetHealth, value, strings.Join(cleared, ", "))
		}
		a.recorder.Eventf(gn, nil, corev1.EventTypeNormal, ReasonHealthReset, "ResetHealth", "%s", note)
	}
	// Remove the annotation with the resourceVersion it was read at, so that
	// a newer request is never lost: on a conflict the informer brings the
	// newer object and the next sync acts on it.
	out := gn.DeepCopy()
	delete(out.Annotations, v1alpha1.AnnotationResetHealth)
	err = a.client.Update(ctx, out)
	a.countWrite(writeGPUNode, err)
	switch {
	case err == nil:
		st.written, st.writtenFrom = out, gn.ResourceVersion
		return out.DeepCopy(), nil
	case apierrors.IsConflict(err) || apierrors.IsNotFound(err):
		// The next sync, woken by the newer object, tries again.
		return gn, nil
	default:
		return gn, fmt.Errorf("remove %s from GPUNode: %w", v1alpha1.AnnotationResetHealth, err)
	}
}
