package policy

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// DefaultBatchInterval is how long StateSync and ConfigMapLoader gather
// changes before they act on them.
const DefaultBatchInterval = 200 * time.Millisecond

// StateWriter takes a new cluster state (the Engine).
type StateWriter interface {
	SetState(ctx context.Context, st State) error
}

// StateSync keeps the policy's cluster state current: queue and namespace
// events mark it stale, and at most once per batch interval it rebuilds the
// state from the informer cache and writes it in one transaction.
// Every replica runs it (it is not leader-elected).
type StateSync struct {
	reader   client.Reader
	writer   StateWriter
	batch    *coalescer
	synced   atomic.Bool
	interval time.Duration
	clock    clock.Clock
	// write serialises reading a state and writing it, so that two
	// writers never interleave.
	write sync.Mutex
	// live reads the API server itself for ReadThrough; nil turns
	// ReadThrough off. liveEvery is the least time between two live reads.
	live      client.Reader
	liveEvery time.Duration
	// liveTurn is held by the one live read in flight (a channel, so that
	// waiting for it honours a context).
	liveTurn chan struct{}
	// liveStarted is when the last successful live read started; guarded
	// by liveTurn.
	liveStarted time.Time
}

// StateSyncOption configures a StateSync.
type StateSyncOption func(*StateSync)

// WithBatchInterval sets how long changes gather before a write.
func WithBatchInterval(d time.Duration) StateSyncOption {
	return func(s *StateSync) { s.interval = d }
}

// WithLiveReader lets ReadThrough read queues and namespaces from the API
// server itself (a manager's API reader), at most once every `every`.
func WithLiveReader(r client.Reader, every time.Duration) StateSyncOption {
	return func(s *StateSync) { s.live, s.liveEvery = r, every }
}

// WithSyncClock sets the clock that paces batches.
func WithSyncClock(c clock.Clock) StateSyncOption {
	return func(s *StateSync) { s.clock = c }
}

// NewStateSync returns a StateSync that reads Queues and Namespaces
// (metadata only) from reader, normally a controller-runtime cache.
func NewStateSync(reader client.Reader, writer StateWriter, opts ...StateSyncOption) *StateSync {
	s := &StateSync{reader: reader, writer: writer, interval: DefaultBatchInterval, clock: clock.RealClock{}, liveTurn: make(chan struct{}, 1)}
	for _, o := range opts {
		o(s)
	}
	s.batch = newCoalescer(s.interval, s.clock)
	return s
}

// Trigger marks the state stale.
func (s *StateSync) Trigger() { s.batch.trigger() }

// Synced reports whether the state has been written at least once.
func (s *StateSync) Synced() bool { return s.synced.Load() }

// NeedLeaderElection is false: every webhook replica needs the state.
func (s *StateSync) NeedLeaderElection() bool { return false }

// Start writes the state, then again after each batch of changes, until
// ctx ends.
func (s *StateSync) Start(ctx context.Context) error {
	ctx = logr.NewContext(ctx, logr.FromContextOrDiscard(ctx).WithName("policy-state"))
	s.batch.run(ctx, "write policy state", s.Sync)
	return nil
}

// Sync rebuilds the state from the cache and writes it now.
func (s *StateSync) Sync(ctx context.Context) error {
	return s.syncFrom(ctx, s.reader)
}

// ReadThrough makes the state at least as new as the API server's at
// since: unless a live read that started after since has written it
// already, it rebuilds the state from the API server itself and writes it.
//
// A denial must not stand on an informer that has not caught up: a Queue
// and a PodGroup naming it, applied from one file, reach the webhook
// milliseconds apart, before the Queue's watch event and the next batch.
// The webhook decides a denial again after ReadThrough (FreshDenials).
// Live reads go one at a time, at most one per WithLiveReader interval, and every
// denial that arrived before one started shares it, so that a tenant
// sending denied requests in a loop costs the API server at most one list
// of queues and namespaces per interval.
func (s *StateSync) ReadThrough(ctx context.Context, since time.Time) error {
	if s.live == nil {
		return nil
	}
	select {
	case s.liveTurn <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("wait for a live read of the policy state: %w", ctx.Err())
	}
	defer func() { <-s.liveTurn }()
	if !s.liveStarted.Before(since) {
		return nil
	}
	if wait := s.liveEvery - s.clock.Since(s.liveStarted); wait > 0 {
		select {
		case <-s.clock.After(wait):
		case <-ctx.Done():
			return fmt.Errorf("wait for a live read of the policy state: %w", ctx.Err())
		}
	}
	start := s.clock.Now()
	if err := s.syncFrom(ctx, s.live); err != nil {
		return fmt.Errorf("read the policy state from the API server: %w", err)
	}
	s.liveStarted = start
	return nil
}

func (s *StateSync) syncFrom(ctx context.Context, reader client.Reader) error {
	s.write.Lock()
	defer s.write.Unlock()
	var queues v1alpha1.QueueList
	if err := reader.List(ctx, &queues); err != nil {
		return fmt.Errorf("list queues: %w", err)
	}
	namespaces := namespaceMetadataList()
	if err := reader.List(ctx, namespaces); err != nil {
		return fmt.Errorf("list namespaces: %w", err)
	}
	infos := make([]NamespaceInfo, 0, len(namespaces.Items))
	for _, ns := range namespaces.Items {
		infos = append(infos, NamespaceInfo{Name: ns.Name, Labels: ns.Labels})
	}
	st, err := BuildState(queues.Items, infos)
	if err != nil {
		// The state is still usable; a queue with a bad selector selects
		// no namespace.
		logr.FromContextOrDiscard(ctx).Error(err, "Built policy state with errors")
	}
	if err := s.writer.SetState(ctx, st); err != nil {
		return err
	}
	s.synced.Store(true)
	logr.FromContextOrDiscard(ctx).V(3).Info("Wrote policy state", "queues", len(st.Queues), "namespaces", len(st.Namespaces))
	return nil
}

// Watch registers on the cache's Queue and Namespace informers, so that
// any change triggers a batch.
func (s *StateSync) Watch(ctx context.Context, informers cache.Informers) error {
	handler := toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { s.Trigger() },
		UpdateFunc: func(any, any) { s.Trigger() },
		DeleteFunc: func(any) { s.Trigger() },
	}
	for _, obj := range []client.Object{&v1alpha1.Queue{}, namespaceMetadata()} {
		inf, err := informers.GetInformer(ctx, obj)
		if err != nil {
			return fmt.Errorf("get informer for %T: %w", obj, err)
		}
		if _, err := inf.AddEventHandler(handler); err != nil {
			return fmt.Errorf("watch %T: %w", obj, err)
		}
	}
	return nil
}

// namespaceMetadata is a Namespace as metadata only: the policy needs
// names and labels, and a metadata informer holds nothing else.
func namespaceMetadata() *metav1.PartialObjectMetadata {
	m := &metav1.PartialObjectMetadata{}
	m.APIVersion, m.Kind = "v1", "Namespace"
	return m
}

func namespaceMetadataList() *metav1.PartialObjectMetadataList {
	l := &metav1.PartialObjectMetadataList{}
	l.APIVersion, l.Kind = "v1", "NamespaceList"
	return l
}
