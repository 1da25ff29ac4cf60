package admission

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/admission/cycle"
	"github.com/partita-dev/partita/admission/usage"
	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
	"github.com/partita-dev/partita/models/prefetch"
)

// Admitter defaults.
const (
	// DefaultScheduleTimeout is how long an admitted gang may take to bind
	// fully when its PodGroup sets no scheduleTimeoutSeconds.
	DefaultScheduleTimeout = 5 * time.Minute
	// DefaultPreemptMinRuntime protects a workload admitted less than this
	// long ago from reclaim and preemption.
	DefaultPreemptMinRuntime = time.Minute
	// DefaultAdmissionInterval is the longest the loop waits between cycles
	// while something waits.
	DefaultAdmissionInterval = time.Second
	// DefaultStarvationBound is how long a queue's head of line waits
	// before the loop holds room for it.
	DefaultStarvationBound = 3 * time.Minute
	// DefaultRefusedPinTimeout is how long kube-scheduler may refuse a
	// gang member at the node the loop pinned it to before the loop gives
	// the pin up (when that comes before the gang's schedule timeout).
	DefaultRefusedPinTimeout = time.Minute
	// DefaultInflightTTL is how long a released single pod's simulated place
	// counts: as long as the extender keeps an assignment kube-scheduler
	// has not bound (its --assume-ttl default).
	DefaultInflightTTL = time.Minute
	// AdmitterName names the loop in events and logs.
	AdmitterName = "partita-admitter"
)

// ReleasedPodSink takes the pods the loop releases, as the API server
// returned them, for bind to read while its informer lags
// (extender.ReleasedPods).
type ReleasedPodSink interface {
	Put(pod *corev1.Pod)
}

// Backoff of a gang requeued after its schedule timeout: it doubles from
// backoffBase up to backoffMax.
const (
	backoffBase = 10 * time.Second
	backoffMax  = 5 * time.Minute
)

// admittedLayout is RFC 3339 with milliseconds: victims are chosen youngest
// first, and workloads admitted within one second must still be ordered.
const admittedLayout = "2006-01-02T15:04:05.000Z07:00"

// patchWorkers bounds the pod writes in flight at once.
const patchWorkers = 16

// AdmitterOptions configure an Admitter.
type AdmitterOptions struct {
	// Placement is the device placement of pods that choose none.
	Placement gpu.Placement
	// Released, when set, is given each pod the loop releases for the
	// extender to bind, as the API server returned it.
	Released ReleasedPodSink
	// ScheduleTimeout is the default of PodGroup scheduleTimeoutSeconds.
	ScheduleTimeout time.Duration
	// RefusedPinTimeout is how long kube-scheduler may refuse a gang
	// member at the node it is pinned to (PodScheduled False,
	// Unschedulable) before the loop evicts it to place it again, or
	// requeues the gang when none of it runs, if that comes before the
	// schedule timeout; 0 leaves refusals to the schedule timeout.
	RefusedPinTimeout time.Duration
	// PreemptMinRuntime protects young workloads from eviction.
	PreemptMinRuntime time.Duration
	// DisablePreemption turns reclaim and preemption off.
	DisablePreemption bool
	// StarvationBound is how long a queue's head of line may wait before
	// the loop holds room for it; 0 turns that off.
	StarvationBound time.Duration
	// Interval is the longest wait between cycles while anything waits.
	Interval time.Duration
	// InflightTTL is how long a single pod's simulated place counts after it
	// is ungated, until kube-scheduler binds it.
	InflightTTL time.Duration
	// Mapper is the workload map (package admission/workloadmap): it groups
	// the GPU pods that name no pod group; nil leaves them single pods.
	Mapper cycle.Mapper
	// DefaultQueue is the queue of workloads whose pods and PodGroup name
	// none (pods the webhook never gave a queue); empty leaves them
	// outside every queue.
	DefaultQueue string
	// Claims reads the GPUs of pods that ask for them through
	// ResourceClaims only (claims.Cache.Demand); nil leaves such pods to
	// kube-scheduler, uncharged.
	Claims cycle.ClaimReader
	// ClaimAllocator simulates the allocation of claim gangs' claims
	// (claims.Cache); nil ungates them unpinned.
	ClaimAllocator cycle.ClaimAllocator
	// ModelsHeld says which nodes hold which Models (models/locate): gangs
	// go where their models are when they fit there.
	ModelsHeld func(namespace string, models []string) map[string]float64
	// Prefetch, when set, asks the nodes a workload is admitted onto to
	// fetch its pods' Models at once (models/prefetch), before they bind.
	Prefetch func(ctx context.Context, namespace string, models, nodes []string, why string) error
	// Usage is how queues' past usage is counted and weighed in fair share
	// (time-based fair share); a zero Weight, the default, leaves it out.
	// It must be valid (usage.Config.Validate).
	Usage usage.Config
	// StatusClient writes pod conditions and Queue and PodGroup status;
	// nil means the main client. A client of its own keeps those writes
	// from queueing pins and ungating behind them at the client's QPS.
	StatusClient client.Client
}

// DefaultAdmitterOptions returns the defaults.
func DefaultAdmitterOptions() AdmitterOptions {
	return AdmitterOptions{
		Placement: gpu.PlacementBinpack, ScheduleTimeout: DefaultScheduleTimeout, RefusedPinTimeout: DefaultRefusedPinTimeout,
		PreemptMinRuntime: DefaultPreemptMinRuntime, Interval: DefaultAdmissionInterval, InflightTTL: DefaultInflightTTL,
		StarvationBound: DefaultStarvationBound,
		DefaultQueue:    v1alpha1.DefaultQueueName,
		Usage:           usage.DefaultConfig(),
	}
}

// Admitter is the queue and gang admission loop (DESIGN §2.2): it runs on
// the elected leader only, decides with package cycle, and carries the
// decisions out: reservations in the ledger, pins and ungating, evictions,
// timeouts, statuses, events and metrics.
type Admitter struct {
	cache    *cycle.Cache
	ledger   *gpu.Ledger
	client   client.Client
	cs       kubernetes.Interface
	recorder events.EventRecorder
	quota    cycle.QuotaChecker
	clock    clock.WithTicker
	synced   func() bool
	opts     AdmitterOptions
	metrics  *AdmitterMetrics
	trigger  chan struct{}
	regs     []toolscache.ResourceEventHandlerRegistration

	// Loop state, touched by the loop goroutine only.
	snap           *gpu.Snapshot
	lastGeneration uint64
	lastCycle      time.Time
	fairShares     cycle.FairShares
	rooms          cycle.Rooms
	domains        cycle.Domains
	// usage counts queues' past usage; nil while time-based fair share is
	// off.
	usage *usageState
	// roomHeads are the heads of line room was held for in the last cycle.
	roomHeads map[cycle.WorkloadKey]bool
	// inflight are single pods ungated and not bound yet, with the devices
	// simulated for them: later cycles count them until they bind.
	inflight map[types.UID]inflightPod
	// reserved are gang members whose devices the ledger holds for them.
	reserved map[types.UID]time.Time
	backoff  map[cycle.WorkloadKey]backoffState
	// timedOut remembers the admission (by its start) a timeout was handled
	// for, and what was said.
	timedOut map[cycle.WorkloadKey]timeout
	// refusedPins are the unbound members whose refused pin was handled
	// (evicted, or left as they are), until they bind or go; repinned
	// remembers the admission (by its start) whose refused members were
	// evicted to be placed again, which is done once an admission.
	refusedPins map[types.UID]struct{}
	repinned    map[cycle.WorkloadKey]time.Time
	// told is the last reason and message told about a waiting workload.
	told map[cycle.WorkloadKey]toldWait
	// tellSeed seeds toldWait's hashes.
	tellSeed maphash.Seed
	// toldPods are the pods told they wait (a partita.dev/Admitted=False
	// condition queued), until they are admitted or gone: only they are
	// told again when admitted (see admit). lastPrune is when the gone
	// ones were last dropped.
	toldPods  map[types.UID]struct{}
	lastPrune time.Time
	// conditions feed the writers of pod conditions, one queue each (see
	// conditionQueue).
	conditions []*conditionQueue
	// podGroups remembers the last write of each mapped gang's PodGroup
	// (admitter_mapped.go).
	podGroups map[cycle.WorkloadKey]podGroupWrite
	// refused are victims whose eviction was refused, spared until the
	// time given; finishing are victims partly evicted, whose other
	// members the loop evicts before anything else; refusedFor are the
	// preemptors that could not evict, told so until the time given (see
	// admitter_evict.go).
	refused    map[cycle.WorkloadKey]refusal
	finishing  map[cycle.WorkloadKey]finishing
	refusedFor map[cycle.WorkloadKey]time.Time
}

type inflightPod struct {
	alloc    *gpu.PodAllocation
	deadline time.Time
	// held: the ledger holds alloc for the pod (Admission.Hold) until the
	// pod binds, goes, or the deadline passes.
	held bool
}

type timeout struct {
	started time.Time
	message string
}

type backoffState struct {
	until time.Time
	delay time.Duration
}

// NewAdmitter returns the loop. cache is fed by Watch; writes go through c
// (pods, statuses) and cs (evictions); quota may be nil (no quota policy).
func NewAdmitter(ledger *gpu.Ledger, c client.Client, cs kubernetes.Interface, recorder events.EventRecorder,
	quota cycle.QuotaChecker, synced func() bool, opts AdmitterOptions, metrics *AdmitterMetrics, clk clock.WithTicker) *Admitter {
	if clk == nil {
		clk = clock.RealClock{}
	}
	cacheOpts := []cycle.CacheOption{cycle.WithDefaultQueue(opts.DefaultQueue)}
	if opts.Mapper != nil {
		cacheOpts = append(cacheOpts, cycle.WithMapper(opts.Mapper))
	}
	if opts.Claims != nil {
		cacheOpts = append(cacheOpts, cycle.WithClaims(opts.Claims))
	}
	a := &Admitter{
		cache: cycle.NewCache(cacheOpts...), ledger: ledger, client: c, cs: cs, recorder: recorder, quota: quota,
		clock: clk, synced: synced, opts: opts, metrics: metrics, trigger: make(chan struct{}, 1),
		inflight: map[types.UID]inflightPod{}, reserved: map[types.UID]time.Time{},
		backoff: map[cycle.WorkloadKey]backoffState{}, timedOut: map[cycle.WorkloadKey]timeout{},
		refusedPins: map[types.UID]struct{}{}, repinned: map[cycle.WorkloadKey]time.Time{},
		told: map[cycle.WorkloadKey]toldWait{}, tellSeed: maphash.MakeSeed(), toldPods: map[types.UID]struct{}{}, conditions: make([]*conditionQueue, conditionWriters),
		podGroups: map[cycle.WorkloadKey]podGroupWrite{},
		refused:   map[cycle.WorkloadKey]refusal{}, finishing: map[cycle.WorkloadKey]finishing{},
		refusedFor: map[cycle.WorkloadKey]time.Time{},
	}
	for i := range a.conditions {
		a.conditions[i] = newConditionQueue()
	}
	if opts.Usage.Enabled() {
		a.usage = &usageState{tracker: usage.NewTracker(opts.Usage)}
	}
	return a
}

// Cache returns the loop's cache, for the informer feed.
func (a *Admitter) Cache() *cycle.Cache { return a.cache }

// Notify asks for a cycle soon; informer handlers call it on every change.
func (a *Admitter) Notify() {
	select {
	case a.trigger <- struct{}{}:
	default:
	}
}

// NeedLeaderElection makes the manager run the loop on the leader only.
func (a *Admitter) NeedLeaderElection() bool { return true }

// Start runs cycles until ctx ends: on changes, batched for a moment, and
// at least every Interval.
func (a *Admitter) Start(ctx context.Context) error {
	log := logr.FromContextOrDiscard(ctx).WithName("admitter")
	ctx = logr.NewContext(ctx, log)
	log.Info("Starting the admission loop")
	if a.usage != nil {
		// A new term: carry on from the history the last leader wrote.
		a.usage.restore = true
		log.Info("Time-based fair share is on", "usage", a.opts.Usage.String(), "weight", a.opts.Usage.Weight)
	}
	ticker := a.clock.NewTicker(a.opts.Interval)
	defer ticker.Stop()
	for _, q := range a.conditions {
		go a.writeConditions(ctx, q)
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-a.trigger:
			// Let a burst of changes (a Job creating its pods) land first.
			select {
			case <-ctx.Done():
				return nil
			case <-a.clock.After(50 * time.Millisecond):
			}
		case <-ticker.C():
		}
		if !a.synced() || !a.Synced() || !a.due() {
			continue
		}
		if err := a.Cycle(ctx); err != nil {
			log.Error(err, "Admission cycle failed")
		}
	}
}

// idleCycleEvery is how often a cycle runs when nothing changed and no
// timer is pending: time alone can make a workload evictable (its minimum
// runtime passes) or a gang late.
const idleCycleEvery = 5 * time.Second

// due reports whether a cycle should run now: the cache changed, a timer
// is pending, or idleCycleEvery has passed.
func (a *Admitter) due() bool {
	return a.cache.Generation() != a.lastGeneration || len(a.inflight) > 0 || len(a.reserved) > 0 || len(a.backoff) > 0 ||
		a.clock.Since(a.lastCycle) >= idleCycleEvery
}

// Cycle runs one admission cycle and carries out its decisions.
func (a *Admitter) Cycle(ctx context.Context) error {
	start := a.clock.Now()
	st := a.cache.State()
	a.lastGeneration, a.lastCycle = st.Generation, start
	now := a.clock.Now()
	a.expire(now)
	a.handleTimeouts(ctx, st, now)
	// Reservations that reached their expiry (timed-out gangs, lapsed
	// holds) leave the ledger before the snapshot is taken.
	a.ledger.ExpireReservations()
	if a.snap == nil {
		a.snap = a.ledger.Snapshot()
	} else {
		a.ledger.Refresh(a.snap)
	}
	for _, p := range a.inflight {
		_ = a.snap.Assume(p.alloc)
	}
	finished := a.finishEvictions(ctx, st, now)
	usageNow := a.countUsage(st, now)
	res := cycle.Run(ctx, st, a.snap, a.quota, cycle.Options{
		Usage: usageNow,
		Now:   now, Placement: a.opts.Placement, PreemptMinRuntime: a.opts.PreemptMinRuntime,
		DisablePreemption: a.opts.DisablePreemption,
		BackoffUntil:      func(k cycle.WorkloadKey) time.Time { return a.backoff[k].until },
		FairShares:        &a.fairShares,
		Unevictable:       a.unevictable(now, finished),
		Claims:            a.opts.ClaimAllocator,
		ModelsHeld:        a.opts.ModelsHeld,
		StarvationBound:   a.opts.StarvationBound,
		Rooms:             &a.rooms,
		Domains:           &a.domains,
	})
	decided := a.clock.Since(start)
	var errs []error
	errs = append(errs, a.admit(ctx, res.Admissions, now))
	a.prefetch(ctx, res.Admissions)
	a.logRooms(ctx, res)
	a.evictAll(ctx, res, now)
	a.noteRefusals(res, now)
	a.tell(res, now)
	errs = append(errs, a.writeQueueStatus(ctx, st, res, now), a.writePodGroupStatus(ctx, st, res, now), a.keepMappedPodGroups(ctx, st, now))
	a.metrics.observeCycle(res, decided, a.clock.Since(start))
	return errors.Join(errs...)
}

// expire drops in-flight single pods once bound, gone or stale, and
// reservations of pods that are bound or gone.
func (a *Admitter) expire(now time.Time) {
	for uid, p := range a.inflight {
		present, bound := a.cache.PodState(uid)
		if bound || !present || now.After(p.deadline) {
			delete(a.inflight, uid)
			if p.held && !bound {
				// Unbound after the deadline, or gone: the hold lapses and
				// kube-scheduler may place the pod anywhere. (A bound pod
				// shows its devices; Forget drops only what it does not.)
				a.ledger.Forget(uid)
			}
		}
	}
	for uid := range a.reserved {
		if present, bound := a.cache.PodState(uid); bound || !present {
			delete(a.reserved, uid)
		}
	}
	for uid := range a.refusedPins {
		if present, bound := a.cache.PodState(uid); bound || !present {
			delete(a.refusedPins, uid)
		}
	}
	for k, b := range a.backoff {
		if now.After(b.until.Add(backoffMax)) {
			delete(a.backoff, k)
		}
	}
	if now.Sub(a.lastPrune) >= toldPrunePeriod {
		a.lastPrune = now
		for uid := range a.toldPods {
			if present, _ := a.cache.PodState(uid); !present {
				delete(a.toldPods, uid)
			}
		}
	}
}

// toldPrunePeriod is how often the pods told they wait that have gone are
// forgotten.
const toldPrunePeriod = time.Minute

// admit reserves the admitted gangs' devices, then pins and ungates every
// admitted member, all workloads' writes in one pool, so that a cycle that
// admits many workloads is not as slow as their sum.
func (a *Admitter) admit(ctx context.Context, adms []cycle.Admission, now time.Time) error {
	var errs []error
	ready := adms[:0:0]
	for _, adm := range adms {
		if err := a.reserve(adm); err != nil {
			errs = append(errs, err)
			continue
		}
		ready = append(ready, adm)
	}
	stamp := now.UTC().Format(admittedLayout)
	// Reservations expire when the loop would give up on them: a gang's
	// schedule timeout from the admission time the pods carry (so that the
	// ledgers drop them in the cycle that handles the timeout), a single
	// pod's hold after InflightTTL.
	at, _ := time.Parse(admittedLayout, stamp)
	var jobs []func() error
	for _, adm := range ready {
		expires := at.Add(a.opts.InflightTTL)
		if adm.Pin {
			expires = at.Add(a.scheduleTimeout(adm.Workload))
		}
		for _, m := range adm.Members {
			jobs = append(jobs, func() error { return a.release(ctx, m, adm, stamp, expires) })
		}
	}
	errs = append(errs, parallel(patchWorkers, jobs)...)
	log := logr.FromContextOrDiscard(ctx)
	for _, adm := range ready {
		w := adm.Workload
		for _, m := range adm.Members {
			uid := m.Member.Pod.UID
			if adm.Pin {
				a.reserved[uid] = now
			} else {
				a.inflight[uid] = inflightPod{alloc: m.Allocation, deadline: now.Add(a.opts.InflightTTL), held: adm.Hold}
			}
			if !a.wasTold(m.Member.Pod) {
				// Admitted in the cycle that first saw it (or before it was
				// told anything): the release wrote partita.dev/admitted,
				// and an event and a condition would be two more writes
				// per pod that say the same.
				continue
			}
			delete(a.toldPods, uid)
			note := "admitted by queue " + w.Queue
			if adm.Pin {
				note = fmt.Sprintf("admitted with its gang of %d; reserved on node %s", len(adm.Members), m.Allocation.Node)
			}
			a.event(m.Member.Pod, corev1.EventTypeNormal, v1alpha1.ReasonAdmitted, "Admit", note)
			a.setCondition(m.Member.Pod, corev1.ConditionTrue, v1alpha1.ReasonAdmitted, note, nil)
		}
		delete(a.told, w.Key)
		delete(a.timedOut, w.Key)
		a.metrics.admitted(w.Key.IsGang())
		log.V(2).Info("Admitted workload", "workload", w.Name(), "queue", w.Queue, "members", len(adm.Members), "pinned", adm.Pin)
	}
	return errors.Join(errs...)
}

// reserve records a gang's devices in the ledger, all or none, so that the
// extender's filter and bind keep them for its members; and a held single
// pod's, so that it binds where its queue was charged.
func (a *Admitter) reserve(adm cycle.Admission) error {
	if !adm.Pin && !adm.Hold {
		return nil
	}
	for i, m := range adm.Members {
		if m.Member.Claims != nil {
			// Its claims hold its devices; the ledger has none of them.
			continue
		}
		if err := a.ledger.Assume(m.Allocation); err != nil {
			for _, done := range adm.Members[:i] {
				a.ledger.Forget(done.Member.Pod.UID)
			}
			return fmt.Errorf("reserve devices for %s: %w", adm.Workload.Key, err)
		}
	}
	return nil
}

// parallel runs jobs, at most n at once, and returns their errors.
func parallel(n int, jobs []func() error) []error {
	errs := make(chan error, len(jobs))
	sem := make(chan struct{}, n)
	for _, job := range jobs {
		sem <- struct{}{}
		go func() {
			defer func() { <-sem }()
			errs <- job()
		}()
	}
	var out []error
	for range jobs {
		if err := <-errs; err != nil {
			out = append(out, err)
		}
	}
	return out
}

// release pins one member to its node (gangs) and removes the admission
// gate, in one write that also records the reservation of its devices
// (gangs and held single pods, partita.dev/reservation until expires): the
// pod is never ungated without it, so that every ledger, this one after a
// restart included, holds the devices until the pod binds.
func (a *Admitter) release(ctx context.Context, m cycle.MemberAdmission, adm cycle.Admission, stamp string, expires time.Time) error {
	pin, key := adm.Pin, adm.Workload.Key
	orig := m.Member.Pod
	pod := orig.DeepCopy()
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[v1alpha1.AnnotationAdmitted] = stamp
	for k, v := range workloadAnnotations(adm.Workload) {
		pod.Annotations[k] = v
	}
	claims := m.Member.Claims != nil
	if (pin || adm.Hold) && !claims {
		r, err := gpu.FormatReservation(gpu.ReservationOf(m.Allocation, key.String(), expires))
		if err != nil {
			a.ledger.Forget(orig.UID)
			return fmt.Errorf("release pod %s/%s: %w", orig.Namespace, orig.Name, err)
		}
		pod.Annotations[v1alpha1.AnnotationReservation] = r
	}
	switch {
	case pin && claims:
		// Pinned to the node the simulation of its claims found; the
		// ledger holds nothing for it, so it gets no reservation.
		pinToNode(pod, m.Allocation.Node)
	case pin:
		pod.Annotations[v1alpha1.AnnotationNode] = m.Allocation.Node
		pinToNode(pod, m.Allocation.Node)
	default:
		// kube-scheduler places it, inside the topology domains the cycle
		// found room in for its workload.
		keepInDomain(pod, m.Domain)
	}
	gates := pod.Spec.SchedulingGates[:0:0]
	for _, g := range pod.Spec.SchedulingGates {
		if g.Name != v1alpha1.SchedulingGateAdmission {
			gates = append(gates, g)
		}
	}
	pod.Spec.SchedulingGates = gates
	patch, err := releasePatch(orig, pod)
	if err == nil {
		err = a.client.Patch(ctx, pod, client.RawPatch(types.StrategicMergePatchType, patch))
	}
	if err != nil {
		if (pin || adm.Hold) && !claims {
			a.ledger.Forget(orig.UID)
		}
		return fmt.Errorf("release pod %s/%s: %w", orig.Namespace, orig.Name, err)
	}
	// The pod as the API server wrote it goes into the cache at once: until
	// the informer brings it, the next cycles would see the member pending
	// and place it again, and a placement that finds the pod's devices
	// already taken (by its own bind) would fail for every pod of its shape.
	pod.ManagedFields = nil
	a.cache.UpsertPod(pod)
	if !claims && a.opts.Released != nil {
		a.opts.Released.Put(pod)
	}
	return nil
}

// pinToNode adds a required node affinity to node's name to every term (or
// makes the only term): the API server allows only additions while a pod
// is gated.
func pinToNode(pod *corev1.Pod, node string) {
	req := corev1.NodeSelectorRequirement{Key: metav1.ObjectNameField, Operator: corev1.NodeSelectorOpIn, Values: []string{node}}
	if pod.Spec.Affinity == nil {
		pod.Spec.Affinity = &corev1.Affinity{}
	}
	if pod.Spec.Affinity.NodeAffinity == nil {
		pod.Spec.Affinity.NodeAffinity = &corev1.NodeAffinity{}
	}
	na := pod.Spec.Affinity.NodeAffinity
	if na.RequiredDuringSchedulingIgnoredDuringExecution == nil || len(na.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms) == 0 {
		na.RequiredDuringSchedulingIgnoredDuringExecution = &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{req}}}}
		return
	}
	terms := na.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	for i := range terms {
		terms[i].MatchFields = append(terms[i].MatchFields, req)
	}
}

// keepInDomain adds a required node affinity to each of domain's labels
// and values to every term (or makes the only term), like pinToNode.
func keepInDomain(pod *corev1.Pod, domain map[string]string) {
	if len(domain) == 0 {
		return
	}
	keys := make([]string, 0, len(domain))
	for k := range domain {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	reqs := make([]corev1.NodeSelectorRequirement, len(keys))
	for i, k := range keys {
		reqs[i] = corev1.NodeSelectorRequirement{Key: k, Operator: corev1.NodeSelectorOpIn, Values: []string{domain[k]}}
	}
	if pod.Spec.Affinity == nil {
		pod.Spec.Affinity = &corev1.Affinity{}
	}
	if pod.Spec.Affinity.NodeAffinity == nil {
		pod.Spec.Affinity.NodeAffinity = &corev1.NodeAffinity{}
	}
	na := pod.Spec.Affinity.NodeAffinity
	if na.RequiredDuringSchedulingIgnoredDuringExecution == nil || len(na.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms) == 0 {
		na.RequiredDuringSchedulingIgnoredDuringExecution = &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: reqs}}}
		return
	}
	terms := na.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	for i := range terms {
		terms[i].MatchExpressions = append(terms[i].MatchExpressions, reqs...)
	}
}

// handleTimeouts releases gangs that did not bind fully in time: members
// with a controller are evicted (their controller makes new ones, which
// wait again), reservations are dropped, the workload backs off. Bare pods
// are never deleted. A member kube-scheduler keeps refusing at the node it
// is pinned to is released sooner (releaseRefusedPins).
func (a *Admitter) handleTimeouts(ctx context.Context, st *cycle.State, now time.Time) {
	gangs := make(map[cycle.WorkloadKey]bool, len(st.Gangs))
	for _, w := range st.Gangs {
		gangs[w.Key] = true
	}
	for key := range a.timedOut {
		if !gangs[key] {
			delete(a.timedOut, key)
		}
	}
	for key := range a.repinned {
		if !gangs[key] {
			delete(a.repinned, key)
		}
	}
	for _, w := range st.Gangs {
		if len(w.Active) == 0 {
			continue
		}
		bound, admittedByLoop := int(w.Succeeded), true
		for _, m := range w.Active {
			if m.Bound {
				bound++
			}
			if m.Admitted.IsZero() {
				admittedByLoop = false
			}
		}
		if !admittedByLoop || bound-int(w.Succeeded) == len(w.Active) {
			continue
		}
		started := w.Started()
		limit := a.scheduleTimeout(w)
		if a.timedOut[w.Key].started.Equal(started) {
			continue
		}
		if bound < int(w.MinMember) && now.Sub(started) >= limit {
			a.timeOut(ctx, w, bound, v1alpha1.ReasonScheduleTimeout, fmt.Sprintf("only %d of %d members bound within %s; ", bound, w.MinMember, limit), now)
			continue
		}
		if refused := a.refusedPinned(w, limit, now); len(refused) > 0 {
			a.releaseRefusedPins(ctx, w, bound, refused, now)
		}
	}
}

// timeOut requeues w: its reservations are dropped, its members with a
// controller evicted, and it backs off. reason is the events' (the
// schedule timeout, or a pin kube-scheduler refuses), why begins the
// message.
func (a *Admitter) timeOut(ctx context.Context, w *cycle.Workload, bound int, reason, why string, now time.Time) {
	log := logr.FromContextOrDiscard(ctx)
	b := a.backoff[w.Key]
	b.delay = min(max(backoffBase, 2*b.delay), backoffMax)
	b.until = now.Add(b.delay)
	a.backoff[w.Key] = b
	msg := why
	evicted := 0
	for _, m := range w.Active {
		if !m.Bound {
			a.ledger.Forget(m.Pod.UID)
			delete(a.reserved, m.Pod.UID)
		}
		if metav1.GetControllerOf(m.Pod) == nil {
			continue
		}
		if err := a.evictPod(ctx, m.Pod, false); err != nil {
			log.Error(err, "Failed to evict pod of a timed-out gang", "pod", klog.KObj(m.Pod))
			continue
		}
		evicted++
	}
	if evicted > 0 {
		msg += fmt.Sprintf("evicted %d pods with a controller; the gang is requeued and tries again in %s", evicted, b.delay)
	} else {
		msg += "its pods have no controller, so they are left as they are"
	}
	for _, m := range w.Active {
		a.event(m.Pod, corev1.EventTypeWarning, reason, "Timeout", msg)
	}
	a.timedOut[w.Key] = timeout{started: w.Started(), message: msg}
	cause := "timeout"
	if reason == v1alpha1.ReasonPinRefused {
		cause = "refused"
	}
	a.metrics.evicted(cause)
	log.Info("Gang did not bind in time", "workload", w.Key.String(), "bound", bound, "minMember", w.MinMember)
}

// logRooms logs the rooms held for heads of line as they come and go.
func (a *Admitter) logRooms(ctx context.Context, res *cycle.Result) {
	log := logr.FromContextOrDiscard(ctx)
	now := make(map[cycle.WorkloadKey]bool, len(res.Rooms))
	for _, r := range res.Rooms {
		now[r.Head] = true
		if !a.roomHeads[r.Head] {
			log.V(2).Info("Holding room for a head of line", "workload", r.Head.String(), "devices", r.Devices)
		}
	}
	for k := range a.roomHeads {
		if !now[k] {
			log.V(2).Info("Released the room of a head of line", "workload", k.String())
		}
	}
	a.roomHeads = now
}

// scheduleTimeout is how long w may take to bind fully once admitted.
func (a *Admitter) scheduleTimeout(w *cycle.Workload) time.Duration {
	if w.TimeoutSeconds > 0 {
		return time.Duration(w.TimeoutSeconds) * time.Second
	}
	return a.opts.ScheduleTimeout
}

// tellBudget is how many waiting pods one cycle tells about (an event and
// a condition each); the rest are told in the next cycles, so that a burst
// of thousands of pods does not flood the API server.
const tellBudget = 200

// tell emits an event and sets the condition on the pending members of each
// workload whose reason to wait changed, and forgets workloads that no
// longer wait.
func (a *Admitter) tell(res *cycle.Result, now time.Time) {
	waiting := make(map[cycle.WorkloadKey]bool, len(res.Waiting))
	budget := tellBudget
	for _, wt := range res.Waiting {
		key := wt.Workload.Key
		waiting[key] = true
		msg := wt.Message
		if wt.Reason == v1alpha1.ReasonWaitingForWorkload {
			if pw := a.podGroups[key]; pw.err != "" {
				msg += "; creating the PodGroup failed: " + pw.err
			}
		}
		said := a.tellHash(wt.Reason, msg, false)
		t, ok := a.told[key]
		if ok && t.said == said {
			continue
		}
		shape := a.tellHash(wt.Reason, msg, true)
		if ok && now.Sub(t.at) < progressRefresh && (t.shape == shape || (t.evicting && wt.Terminating && t.reason == wt.Reason)) {
			// The same but for its numbers, or the victims it was told of
			// still terminating: told again only after a while.
			continue
		}
		if budget <= 0 || settling(wt, now) {
			continue
		}
		a.told[key] = toldWait{said: said, shape: shape, at: now, reason: wt.Reason, evicting: wt.Evicting}
		ann := workloadAnnotations(wt.Workload)
		for _, m := range wt.Workload.Pending {
			budget--
			a.event(m.Pod, corev1.EventTypeNormal, wt.Reason, "Wait", msg)
			a.setCondition(m.Pod, corev1.ConditionFalse, wt.Reason, msg, missing(m.Pod, ann))
			a.toldPods[m.Pod.UID] = struct{}{}
		}
	}
	for key := range a.told {
		if !waiting[key] {
			delete(a.told, key)
		}
	}
}

// toldWait is what a waiting workload was last told, and when.
// It keeps hashes, not the text: at 50,000 waiting workloads the texts
// were tens of megabytes.
type toldWait struct {
	// said hashes the reason and message told; shape the same with every
	// run of digits as one '#' (tellHash).
	said, shape uint64
	at          time.Time
	reason      string
	// evicting: the wait told was for victims evicted for it.
	evicting bool
}

// progressRefresh is how often a wait whose message changes only in its
// numbers is told again ("waiting for 12 evicted ... pods to terminate",
// then 11, 10, ...): each telling is an event and a status write per
// pending pod, and a reclaim of thousands of pods would spend most of
// its API requests on counts.
const progressRefresh = 30 * time.Second

// tellHash hashes a wait's reason and message; with shape, every run of
// digits counts as one '#', so that messages that differ only in their
// numbers hash alike. Digits are ASCII, so bytes are read: a multi-byte
// rune has no byte in '0'..'9'.
func (a *Admitter) tellHash(reason, msg string, shape bool) uint64 {
	var h maphash.Hash
	h.SetSeed(a.tellSeed)
	_, _ = h.WriteString(reason)
	_, _ = h.WriteString(": ")
	if !shape {
		_, _ = h.WriteString(msg)
		return h.Sum64()
	}
	digits := false
	for i := 0; i < len(msg); i++ {
		b := msg[i]
		if b >= '0' && b <= '9' {
			if !digits {
				_ = h.WriteByte('#')
			}
			digits = true
			continue
		}
		digits = false
		_ = h.WriteByte(b)
	}
	return h.Sum64()
}

func (a *Admitter) event(obj client.Object, eventType, reason, action, note string) {
	if a.recorder == nil {
		return
	}
	// An Event's note may be at most 1,024 bytes: the API server refuses a
	// longer one and the event is lost (a wait that lists every held GPU
	// of a large cluster is longer).
	a.recorder.Eventf(obj, nil, eventType, reason, action, "%s", truncate(note, 1024))
}

// membersGrace is how long a gang that is still getting members is not
// told it waits for them: a Job creates its pods one by one, and telling
// each count ("3 exist", "4 exist", ...) to every member costs writes that
// grow with the square of the gang.
const membersGrace = 3 * time.Second

// settling reports whether a wait is a gang still getting its members.
func settling(wt cycle.Wait, now time.Time) bool {
	ms := wt.Workload.Pending
	return wt.Reason == v1alpha1.ReasonWaitingForMembers && len(ms) > 0 &&
		now.Sub(ms[len(ms)-1].Pod.CreationTimestamp.Time) < membersGrace
}

// wasTold reports whether the pod has been told anything by the loop: a
// partita.dev/Admitted condition it carries (written by this process or an
// earlier leader) or one queued for it. Such a pod is told it was admitted,
// so that its condition does not keep saying it waits.
func (a *Admitter) wasTold(pod *corev1.Pod) bool {
	if _, ok := a.toldPods[pod.UID]; ok {
		return true
	}
	return slices.ContainsFunc(pod.Status.Conditions, func(c corev1.PodCondition) bool { return c.Type == v1alpha1.PodConditionAdmitted })
}

// conditionWriters is how many goroutines write pod conditions.
const conditionWriters = 4

// setCondition queues a write of the pod's partita.dev/Admitted condition,
// and of annotations the pod lacks (nil for none).
func (a *Admitter) setCondition(pod *corev1.Pod, status corev1.ConditionStatus, reason, message string, annotations map[string]string) {
	c := podCondition{pod: pod, annotations: annotations, cond: corev1.PodCondition{
		Type: v1alpha1.PodConditionAdmitted, Status: status, Reason: reason, Message: truncate(message, 1024),
		LastTransitionTime: metav1.NewTime(a.clock.Now()),
	}}
	conditionQueueFor(a.conditions, pod.UID).put(c)
}

// writeConditions patches pod conditions until ctx ends. The strategic
// merge patch merges by condition type, so other conditions stay.
func (a *Admitter) writeConditions(ctx context.Context, q *conditionQueue) {
	log := logr.FromContextOrDiscard(ctx)
	for {
		c, ok := q.take()
		if !ok {
			select {
			case <-ctx.Done():
				return
			case <-q.wake:
			}
			continue
		}
		patch, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.PodCondition{c.cond}}})
		if err != nil {
			continue
		}
		obj := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: c.pod.Namespace, Name: c.pod.Name, UID: c.pod.UID}}
		if len(c.annotations) > 0 {
			// Which workload the pod belongs to (admitter_mapped.go), for
			// people and consoles.
			meta, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": c.annotations}})
			if err == nil {
				if err := a.statusClient().Patch(ctx, obj.DeepCopy(), client.RawPatch(types.MergePatchType, meta)); err != nil && !apierrors.IsNotFound(err) {
					log.V(2).Info("Failed to write the workload annotations", "pod", klog.KObj(c.pod), "err", err.Error())
				}
			}
		}
		if err := a.statusClient().Status().Patch(ctx, obj, client.RawPatch(types.StrategicMergePatchType, patch)); err != nil && !apierrors.IsNotFound(err) {
			log.V(2).Info("Failed to write the admission condition", "pod", klog.KObj(c.pod), "err", err.Error())
		}
	}
}

func (a *Admitter) statusClient() client.Client {
	if a.opts.StatusClient != nil {
		return a.opts.StatusClient
	}
	return a.client
}

// prefetch asks the nodes of each admitted member that asks for Models to
// fetch them now, out of the cycle's way (one apply per model and node the
// model is not on yet).
func (a *Admitter) prefetch(ctx context.Context, admissions []cycle.Admission) {
	if a.opts.Prefetch == nil {
		return
	}
	type ask struct {
		namespace, why string
		models         []string
		nodes          []string
	}
	var asks []ask
	for _, adm := range admissions {
		byModels := map[string]*ask{}
		for _, m := range adm.Members {
			models := v1alpha1.ModelNamesOf(m.Member.Pod.Annotations)
			if len(models) == 0 || m.Allocation == nil || m.Allocation.Node == "" {
				continue
			}
			k := strings.Join(models, ",")
			q, ok := byModels[k]
			if !ok {
				q = &ask{namespace: m.Member.Pod.Namespace, models: models, why: prefetch.WhyAdmitted(adm.Workload.Key.String())}
				byModels[k] = q
			}
			if !slices.Contains(q.nodes, m.Allocation.Node) {
				q.nodes = append(q.nodes, m.Allocation.Node)
			}
		}
		for _, q := range byModels {
			asks = append(asks, *q)
		}
	}
	if len(asks) == 0 {
		return
	}
	log := logr.FromContextOrDiscard(ctx)
	go func() {
		for _, q := range asks {
			if err := a.opts.Prefetch(ctx, q.namespace, q.models, q.nodes, q.why); err != nil {
				log.Error(err, "Could not ask nodes to prefetch models", "models", q.models, "nodes", q.nodes)
			}
		}
	}()
}
