package extender

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
)

// Verbs are the extender's verbs, as they appear in URL paths, in the
// kube-scheduler configuration and in metric labels.
const (
	VerbFilter     = "filter"
	VerbPrioritize = "prioritize"
	VerbBind       = "bind"
	VerbPreempt    = "preempt"
)

// DefaultAssumeTTL is how long a bind decision may stay recorded in the
// ledger without the pod showing it before the extender checks the pod and
// drops the decision if the pod is still unbound. It is much longer than a
// Binding takes, so that an informer that lags behind a successful Binding
// never frees the devices early.
const DefaultAssumeTTL = time.Minute

// DefaultLeaseName is the Lease the extender's replicas elect their leader
// with (--leader-election-id).
const DefaultLeaseName = "partita-extender"

// ErrNotLeader answers bind on a replica that is not the elected leader:
// kube-scheduler retries, and only the leader assigns devices.
var ErrNotLeader = errors.New("this extender replica is not the leader; only the leader binds")

// ErrNotSynced answers every verb until the ledger has seen every GPUNode and
// pod once: answering from a partial ledger could give a device twice.
var ErrNotSynced = errors.New("the GPU ledger has not synced with the API server yet")

// Binder creates a pod's Binding; the API server copies the Binding's
// annotations onto the pod in the same write.
type Binder interface {
	Bind(ctx context.Context, binding *corev1.Binding) error
}

// Extender answers kube-scheduler's extender verbs from a gpu.Ledger. Its
// methods are safe for concurrent use.
type Extender struct {
	ledger *gpu.Ledger
	// pods reads pods from the informer cache; live reads them from the API
	// server, for bind's checks of what a failed Binding did.
	pods, live client.Reader
	// nodes reads Nodes, for bind's checks of the node it is asked for.
	nodes     client.Reader
	binder    Binder
	synced    func() bool
	isLeader  func() bool
	placement gpu.Placement
	metrics   *Metrics
	clock     clock.WithTicker
	// models, when set, says where pods' models are.
	models    ModelLocator
	assumeTTL time.Duration
	// parallelNodes is the candidate count from which filter and prioritize
	// check nodes in parallel.
	parallelNodes int
	// released are the admission loop's releases that bind reads while
	// the pod informer lags them (nil: none).
	released *ReleasedPods

	// nodeLocks serialise binds per node: a node's binds share one stripe.
	nodeLocks [nodeLockStripes]sync.Mutex

	pendingLock sync.Mutex
	// pending are bind decisions recorded in the ledger whose Binding the
	// informer has not shown yet, by pod UID.
	pending map[types.UID]pendingBind
}

// nodeLockStripes is the number of bind locks; two nodes that hash to the
// same stripe bind one after the other, which costs little.
const nodeLockStripes = 64

// pendingBind is a bind decision waiting to show on the pod.
type pendingBind struct {
	key      client.ObjectKey
	node     string
	deadline time.Time
}

// Option configures an Extender.
type Option func(*Extender)

// WithLiveReader reads pods from the API server when bind must know what a
// failed Binding did; by default the informer cache is asked.
func WithLiveReader(r client.Reader) Option { return func(e *Extender) { e.live = r } }

// WithReleasedPods gives bind the pods the admission loop released
// (AdmitterOptions.Released), which it reads while its informer still shows
// them gated instead of asking the API server.
func WithReleasedPods(r *ReleasedPods) Option { return func(e *Extender) { e.released = r } }

// WithNodeReader reads Nodes from r for bind's checks; by default the pod
// reader is asked.
func WithNodeReader(r client.Reader) Option { return func(e *Extender) { e.nodes = r } }

// WithSynced makes every verb answer ErrNotSynced while synced returns false.
func WithSynced(synced func() bool) Option { return func(e *Extender) { e.synced = synced } }

// WithLeader makes bind answer ErrNotLeader while isLeader returns false.
func WithLeader(isLeader func() bool) Option { return func(e *Extender) { e.isLeader = isLeader } }

// ModelLocator says which nodes hold a pod's models (models/locate).
type ModelLocator interface {
	Held(ctx context.Context, namespace string, models []string) map[string]float64
}

// WithModels makes prioritize prefer nodes that hold a pod's models
// (partita.dev/model).
func WithModels(l ModelLocator) Option { return func(e *Extender) { e.models = l } }

// WithPlacement sets the placement for pods that do not choose one
// (partita.dev/placement); binpack by default.
func WithPlacement(p gpu.Placement) Option { return func(e *Extender) { e.placement = p } }

// WithMetrics records metrics in m.
func WithMetrics(m *Metrics) Option { return func(e *Extender) { e.metrics = m } }

// WithClock sets the clock for latencies and bind decisions' expiry.
func WithClock(c clock.WithTicker) Option { return func(e *Extender) { e.clock = c } }

// WithAssumeTTL sets how long a bind decision may wait to show on its pod
// (DefaultAssumeTTL).
func WithAssumeTTL(d time.Duration) Option { return func(e *Extender) { e.assumeTTL = d } }

// WithParallelNodes sets the candidate count from which filter and
// prioritize check nodes in parallel (2,048 by default: a check costs well
// under a microsecond, so fewer nodes are faster checked in one goroutine).
func WithParallelNodes(n int) Option { return func(e *Extender) { e.parallelNodes = n } }

// New returns an Extender over ledger, which informers keep current (see
// package gpu/ledgerfeed). pods reads pods, normally from the same informer cache;
// binder creates Bindings.
func New(ledger *gpu.Ledger, pods client.Reader, binder Binder, opts ...Option) *Extender {
	e := &Extender{
		ledger:        ledger,
		pods:          pods,
		live:          pods,
		nodes:         pods,
		binder:        binder,
		synced:        func() bool { return true },
		isLeader:      func() bool { return true },
		placement:     gpu.PlacementBinpack,
		clock:         clock.RealClock{},
		assumeTTL:     DefaultAssumeTTL,
		parallelNodes: 2048,
		pending:       map[types.UID]pendingBind{},
	}
	for _, o := range opts {
		o(e)
	}
	return e
}

// Ledger returns the extender's ledger.
func (e *Extender) Ledger() *gpu.Ledger { return e.ledger }

// placementFor is the pod's own placement, else the extender's.
func (e *Extender) placementFor(req *gpu.PodRequest) gpu.Placement {
	if req.Placement != "" {
		return req.Placement
	}
	return e.placement
}

// nodeLock returns the lock of node's stripe.
func (e *Extender) nodeLock(node string) *sync.Mutex {
	h := fnv.New32a()
	_, _ = h.Write([]byte(node))
	return &e.nodeLocks[h.Sum32()%nodeLockStripes]
}

// pinnedNode is the node a pod must go to, "" when it may go anywhere: the
// node of devices the ledger already holds for it (the admission loop's
// reservation, or a bind whose Binding has not shown yet), else the node
// partita.dev/node names on a pod that is not bound yet.
func (e *Extender) pinnedNode(pod *corev1.Pod) string {
	if pod.UID != "" {
		if a, ok := e.ledger.Allocation(pod.UID); ok {
			return a.Node
		}
	}
	if pod.Spec.NodeName == "" {
		return pod.Annotations[v1alpha1.AnnotationNode]
	}
	return ""
}

// RequestError is a request the extender cannot read: the server answers
// 400 with it.
type RequestError struct {
	// Verb is the verb asked.
	Verb string
	// Reason says what is wrong, in words.
	Reason string
}

// Error implements error.
func (e *RequestError) Error() string {
	return fmt.Sprintf("read %s request: %s", e.Verb, e.Reason)
}

// IsRequestError reports whether err is, or wraps, a *RequestError.
func IsRequestError(err error) bool {
	var re *RequestError
	return errors.As(err, &re)
}
