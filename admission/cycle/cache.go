package cycle

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	resourcehelper "k8s.io/component-helpers/resource"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/dra"
	"github.com/partita-dev/partita/gpu"
)

// WorkloadKey names a workload: a gang by its namespace and pod group (or,
// for a gang of the workload map, the gang's name), a single pod by its
// namespace and name.
type WorkloadKey struct {
	Namespace string
	// PodGroup is the gang's name; empty for a single pod.
	PodGroup string
	// Workload is the name of a gang the workload map made (see WithMapper):
	// the name of the PodGroup the loop keeps for it.
	Workload string
	// Pod is the single pod's name; empty for a gang.
	Pod string
}

// String is namespace/name, the way logs and the reservation annotation
// name a workload; a gang of the workload map is namespace/workload/name.
func (k WorkloadKey) String() string {
	switch {
	case k.PodGroup != "":
		return k.Namespace + "/" + k.PodGroup
	case k.Workload != "":
		return k.Namespace + "/workload/" + k.Workload
	}
	return k.Namespace + "/" + k.Pod
}

// IsGang reports whether the key names a gang.
func (k WorkloadKey) IsGang() bool { return k.PodGroup != "" || k.Workload != "" }

// GangName is the name of the gang's PodGroup: its pod group, or the name
// the workload map gave it; empty for a single pod.
func (k WorkloadKey) GangName() string {
	if k.PodGroup != "" {
		return k.PodGroup
	}
	return k.Workload
}

// podInfo is what the admission loop needs of one pod, read once when the
// informer delivers it.
type podInfo struct {
	pod *corev1.Pod
	key WorkloadKey
	// req is the pod's GPU request, nil for a pod without one.
	req   *gpu.PodRequest
	queue string
	// minMember is partita.dev/min-member, 0 when absent or unreadable.
	minMember int32
	priority  int32
	// gated: the pod carries the admission gate.
	gated bool
	// node is spec.nodeName.
	node string
	// done: the pod Succeeded or Failed; it holds nothing.
	done bool
	// terminating: the pod is being deleted; it still holds what it has.
	terminating bool
	// gpuMilli is the pod's partita.dev/gpu-milli request.
	gpuMilli int64
	// cpuMilli and memory are the pod's CPU and memory requests, counted on
	// its node while it is bound and not done.
	cpuMilli, memory int64
	// admitted is when the admission loop let the pod go (annotation), zero
	// when it did not or the annotation is unreadable.
	admitted time.Time
	// mapping is the workload map's answer for a pod of a mapped gang.
	mapping Mapping
	// unready says why the workload map cannot group the pod yet, or
	// which of its claims does not exist yet.
	unready string
	// claims is what the pod asks for through ResourceClaims when it asks
	// for GPUs that way only (no Partita request); nil otherwise.
	claims *dra.Demand
}

// Cache holds what the admission loop knows of the cluster, fed by informer
// handlers (Upsert*/Delete*). It is safe for concurrent use; State copies
// what one Cycle needs under the lock.
type Cache struct {
	lock      sync.Mutex
	pods      map[types.UID]*podInfo
	workloads map[WorkloadKey]map[types.UID]*podInfo
	podGroups map[types.NamespacedName]*podGroupInfo
	queues    map[string]*queueInfo
	nodes     map[string]*nodeInfo
	// topologies are the levels of each Topology, by name.
	topologies map[string][]string
	// nodeEpoch counts changes to what places nodes in topology domains
	// and candidate sets (their labels, taints and schedulability, nodes
	// added or removed): Domains are kept across cycles while it holds.
	nodeEpoch uint64
	// generation counts changes, so that the loop can skip a cycle when
	// nothing changed.
	generation uint64
	// built are the workloads as State last built them; dirty names those
	// whose pods or PodGroup changed since. Workloads are immutable once
	// built, so a State shares the unchanged ones.
	built map[WorkloadKey]*Workload
	dirty map[WorkloadKey]bool
	// Indexes of the built workloads, kept by index.
	gangs, terminating map[WorkloadKey]*Workload
	pending, active    map[string]map[WorkloadKey]*Workload
	// pendingSlices and activeSlices cache pending and active as sorted
	// slices, dropped when a queue's set changes.
	pendingSlices, activeSlices map[string][]*Workload
	// usage is what each queue's own workloads hold and wait for (see
	// Cache.index).
	usage map[string]*[6]int64
	// mapper groups the pods that name no pod group (WithMapper).
	mapper Mapper
	// claims reads the GPUs of pods that ask through ResourceClaims
	// (WithClaims).
	claims ClaimReader
	// priorityClasses are the values of PriorityClasses by name, for
	// PodGroup.spec.priorityClassName.
	priorityClasses map[string]int32
	// defaultQueue is the queue of workloads that name none; see
	// WithDefaultQueue.
	defaultQueue string
	// deviceCharged indexes the built workloads with active members whose
	// charge depends on their devices (memory requests).
	deviceCharged map[WorkloadKey]*Workload
	// elastic indexes the built workloads with active elastic members
	// beyond their minimum.
	elastic map[WorkloadKey]*Workload
}

// CacheOption configures a Cache.
type CacheOption func(*Cache)

// WithDefaultQueue makes name the queue of workloads whose pods and
// PodGroup name none: pods from before the webhook gave every GPU pod a
// queue, or that skipped it. Empty leaves them outside every queue,
// admitted on room alone.
func WithDefaultQueue(name string) CacheOption { return func(c *Cache) { c.defaultQueue = name } }

type podGroupInfo struct {
	minMember   int32
	queue       string
	priority    string
	timeout     int32
	topologyKey string
	// topology and subGroups are what the PodGroup asks of the topology
	// (its annotations, any dialect) and its spec.subGroups.
	topology  v1alpha1.TopologyRequest
	subGroups []v1alpha1.SubGroup
	created   time.Time
	status    v1alpha1.PodGroupStatus
	// mapped: the loop keeps the PodGroup for a gang of the workload map
	// (label partita.dev/workload-kind); owners are its ownerReferences.
	mapped bool
	owners []types.UID
	// partitaTopology is what the PodGroup's partita.dev/topology*
	// annotations say, in Partita's keys only (those the loop writes on a
	// mapped one): with subGroups, a mapped PodGroup that says other than
	// its rule is written again.
	partitaTopology v1alpha1.TopologyRequest
}

type queueInfo struct {
	spec    v1alpha1.QueueSpec
	created time.Time
	status  v1alpha1.QueueStatus
}

// nodeInfo is a node, the CPU and memory its pods request, and how many
// pods it holds: those bound to it and those the loop pinned to it.
type nodeInfo struct {
	node             *corev1.Node
	cpuMilli, memory int64
	pods             int64
}

// NewCache returns an empty cache.
func NewCache(opts ...CacheOption) *Cache {
	c := &Cache{
		priorityClasses: map[string]int32{},
		pods:            map[types.UID]*podInfo{},
		workloads:       map[WorkloadKey]map[types.UID]*podInfo{},
		podGroups:       map[types.NamespacedName]*podGroupInfo{},
		queues:          map[string]*queueInfo{},
		nodes:           map[string]*nodeInfo{},
		topologies:      map[string][]string{},
		built:           map[WorkloadKey]*Workload{},
		dirty:           map[WorkloadKey]bool{},

		gangs:         map[WorkloadKey]*Workload{},
		terminating:   map[WorkloadKey]*Workload{},
		pending:       map[string]map[WorkloadKey]*Workload{},
		active:        map[string]map[WorkloadKey]*Workload{},
		pendingSlices: map[string][]*Workload{},
		activeSlices:  map[string][]*Workload{},
		usage:         map[string]*[6]int64{},
		deviceCharged: map[WorkloadKey]*Workload{},
		elastic:       map[WorkloadKey]*Workload{},
	}
	for _, o := range opts {
		o(c)
	}
	return c
}

// UpsertPriorityClass records a PriorityClass's value; the gangs whose
// PodGroup names it take it as their priority.
func (c *Cache) UpsertPriorityClass(name string, value int32) {
	c.lock.Lock()
	defer c.lock.Unlock()
	if old, ok := c.priorityClasses[name]; ok && old == value {
		return
	}
	c.priorityClasses[name] = value
	c.dirtyPodGroupsOf(name)
}

// DeletePriorityClass forgets a PriorityClass.
func (c *Cache) DeletePriorityClass(name string) {
	c.lock.Lock()
	defer c.lock.Unlock()
	delete(c.priorityClasses, name)
	c.dirtyPodGroupsOf(name)
}

func (c *Cache) dirtyPodGroupsOf(class string) {
	for key, pg := range c.podGroups {
		if pg.priority == class {
			c.dirtyGang(key)
		}
	}
	for key, w := range c.built {
		if key.Workload != "" && w.priorityClass == class {
			c.dirty[key] = true
		}
	}
	c.generation++
}

// dirtyGang marks the gangs a PodGroup describes: its explicit one, and the
// workload map's of the same name.
func (c *Cache) dirtyGang(key types.NamespacedName) {
	c.dirty[WorkloadKey{Namespace: key.Namespace, PodGroup: key.Name}] = true
	c.dirty[WorkloadKey{Namespace: key.Namespace, Workload: key.Name}] = true
}

// Generation counts the changes the cache has taken in.
func (c *Cache) Generation() uint64 {
	c.lock.Lock()
	defer c.lock.Unlock()
	return c.generation
}

// UpsertPod adds or updates a pod.
func (c *Cache) UpsertPod(pod *corev1.Pod) {
	if pod.UID == "" {
		return
	}
	info := readPod(pod, c.mapper, c.claims)
	c.lock.Lock()
	defer c.lock.Unlock()
	c.insertPod(info)
}

// RereadClaims reads again the pods of namespace ("" for every namespace)
// that use ResourceClaims, after a claim, a claim template or a DeviceClass
// changed, and takes in those whose GPU demand changed.
func (c *Cache) RereadClaims(namespace string) {
	if c.claims == nil {
		return
	}
	c.lock.Lock()
	var pods []*corev1.Pod
	for _, p := range c.pods {
		if (namespace == "" || p.pod.Namespace == namespace) && !p.done && dra.HasClaims(p.pod) {
			pods = append(pods, p.pod)
		}
	}
	c.lock.Unlock()
	for _, pod := range pods {
		info := readPod(pod, c.mapper, c.claims)
		c.lock.Lock()
		if cur := c.pods[pod.UID]; cur != nil && cur.pod == pod && !sameClaims(cur, info) {
			c.insertPod(info)
		}
		c.lock.Unlock()
	}
}

// sameClaims reports whether two readings of a pod agree on what its
// claims ask.
func sameClaims(a, b *podInfo) bool {
	if (a.claims == nil) != (b.claims == nil) || a.unready != b.unready || a.gpuMilli != b.gpuMilli || (a.req == nil) != (b.req == nil) {
		return false
	}
	return a.claims == nil || a.claims.Describe() == b.claims.Describe()
}

// insertPod replaces what the cache holds of info's pod; the lock is held.
func (c *Cache) insertPod(info *podInfo) {
	pod := info.pod
	c.removePod(pod.UID)
	c.pods[pod.UID] = info
	if info.req != nil {
		c.dirty[info.key] = true
		m := c.workloads[info.key]
		if m == nil {
			m = map[types.UID]*podInfo{}
			c.workloads[info.key] = m
		}
		m[pod.UID] = info
	}
	c.chargeNode(info, 1)
	c.generation++
}

// DeletePod removes a pod.
func (c *Cache) DeletePod(uid types.UID) {
	if c.mapper != nil {
		c.mapper.Forget(uid)
	}
	c.lock.Lock()
	defer c.lock.Unlock()
	c.removePod(uid)
	c.generation++
}

// Remap asks the workload map again about the pods uids, whose owners or
// rules changed, and regroups those whose answer changed.
func (c *Cache) Remap(uids []types.UID) {
	if c.mapper == nil || len(uids) == 0 {
		return
	}
	c.lock.Lock()
	pods := make([]*corev1.Pod, 0, len(uids))
	for _, uid := range uids {
		if p := c.pods[uid]; p != nil && p.req != nil {
			pods = append(pods, p.pod)
		}
	}
	c.lock.Unlock()
	for _, pod := range pods {
		info := readPod(pod, c.mapper, c.claims)
		c.lock.Lock()
		if cur := c.pods[pod.UID]; cur != nil && cur.pod == pod && (cur.key != info.key || !cur.mapping.Equal(info.mapping) || cur.unready != info.unready) {
			// The pod is as it was when read (a newer one would have been
			// mapped by UpsertPod), and its answer changed.
			c.insertPod(info)
		}
		c.lock.Unlock()
	}
}

func (c *Cache) removePod(uid types.UID) {
	old := c.pods[uid]
	if old == nil {
		return
	}
	delete(c.pods, uid)
	if old.req != nil {
		c.dirty[old.key] = true
	}
	if m := c.workloads[old.key]; m != nil {
		delete(m, uid)
		if len(m) == 0 {
			delete(c.workloads, old.key)
		}
	}
	c.chargeNode(old, -1)
}

// chargeNode counts (sign 1) or uncounts (sign -1) a pod on the node whose
// room it takes. Every pod counts, GPU or not: kube-scheduler's
// NodeResourcesFit weighs them all.
func (c *Cache) chargeNode(p *podInfo, sign int64) {
	name := p.chargedNode()
	if name == "" || p.done {
		return
	}
	n := c.nodes[name]
	if n == nil {
		n = &nodeInfo{}
		c.nodes[name] = n
	}
	n.cpuMilli += sign * p.cpuMilli
	n.memory += sign * p.memory
	n.pods += sign
}

// chargedNode is the node whose room the pod takes: its node once bound;
// while unbound, the node the loop pinned it to (partita.dev/node, written
// with its release), where kube-scheduler can only bind it. Counting the
// pinned member from its release keeps a later cycle from giving its room
// to another pod before it binds. "" for none.
func (p *podInfo) chargedNode() string {
	if p.node != "" || p.gated {
		return p.node
	}
	return p.pod.Annotations[v1alpha1.AnnotationNode]
}

// UpsertNode adds or updates a node.
func (c *Cache) UpsertNode(node *corev1.Node) {
	c.lock.Lock()
	defer c.lock.Unlock()
	n := c.nodes[node.Name]
	if n == nil {
		n = &nodeInfo{}
		c.nodes[node.Name] = n
	}
	if n.node == nil || placementChanged(n.node, node) {
		c.nodeEpoch++
	}
	n.node = node
	c.generation++
}

// placementChanged reports whether a node's update changes which domains
// and candidate sets it belongs to. Status updates (heartbeats, capacity)
// do not.
func placementChanged(old, updated *corev1.Node) bool {
	return old.Spec.Unschedulable != updated.Spec.Unschedulable ||
		!maps.Equal(old.Labels, updated.Labels) ||
		!slices.EqualFunc(old.Spec.Taints, updated.Spec.Taints, func(a, b corev1.Taint) bool { return a.MatchTaint(&b) && a.Value == b.Value })
}

// DeleteNode removes a node; what its pods request stays counted until they
// go.
func (c *Cache) DeleteNode(name string) {
	c.lock.Lock()
	defer c.lock.Unlock()
	if n := c.nodes[name]; n != nil {
		n.node = nil
	}
	c.nodeEpoch++
	c.generation++
}

// UpsertTopology adds or updates a Topology.
func (c *Cache) UpsertTopology(t *v1alpha1.Topology) {
	levels := make([]string, len(t.Spec.Levels))
	for i, l := range t.Spec.Levels {
		levels[i] = l.NodeLabel
	}
	c.lock.Lock()
	defer c.lock.Unlock()
	if !slices.Equal(c.topologies[t.Name], levels) {
		c.topologies[t.Name] = levels
		c.generation++
	}
}

// DeleteTopology removes a Topology.
func (c *Cache) DeleteTopology(name string) {
	c.lock.Lock()
	defer c.lock.Unlock()
	if _, ok := c.topologies[name]; ok {
		delete(c.topologies, name)
		c.generation++
	}
}

// UpsertPodGroup adds or updates a PodGroup.
func (c *Cache) UpsertPodGroup(pg *v1alpha1.PodGroup) {
	info := &podGroupInfo{
		minMember:   pg.Spec.MinMember,
		queue:       pg.Spec.Queue,
		priority:    pg.Spec.PriorityClassName,
		topologyKey: pg.Spec.TopologyKey,
		topology:    v1alpha1.TopologyRequestOf(pg.Annotations),
		subGroups:   slices.Clone(pg.Spec.SubGroups),
		created:     pg.CreationTimestamp.Time,
		status:      *pg.Status.DeepCopy(),
		mapped:      pg.Labels[v1alpha1.LabelWorkloadKind] != "",
		partitaTopology: v1alpha1.TopologyRequest{
			Topology:  pg.Annotations[v1alpha1.AnnotationTopology],
			Required:  pg.Annotations[v1alpha1.AnnotationTopologyRequired],
			Preferred: pg.Annotations[v1alpha1.AnnotationTopologyPreferred],
		},
	}
	for _, o := range pg.OwnerReferences {
		info.owners = append(info.owners, o.UID)
	}
	if pg.Spec.ScheduleTimeoutSeconds != nil {
		info.timeout = *pg.Spec.ScheduleTimeoutSeconds
	}
	c.lock.Lock()
	defer c.lock.Unlock()
	key := types.NamespacedName{Namespace: pg.Namespace, Name: pg.Name}
	c.podGroups[key] = info
	c.dirtyGang(key)
	c.generation++
}

// DeletePodGroup removes a PodGroup.
func (c *Cache) DeletePodGroup(key types.NamespacedName) {
	c.lock.Lock()
	defer c.lock.Unlock()
	delete(c.podGroups, key)
	c.dirtyGang(key)
	c.generation++
}

// UpsertQueue adds or updates a Queue.
func (c *Cache) UpsertQueue(q *v1alpha1.Queue) {
	c.lock.Lock()
	defer c.lock.Unlock()
	c.queues[q.Name] = &queueInfo{spec: *q.Spec.DeepCopy(), created: q.CreationTimestamp.Time, status: *q.Status.DeepCopy()}
	c.generation++
}

// DeleteQueue removes a Queue.
func (c *Cache) DeleteQueue(name string) {
	c.lock.Lock()
	defer c.lock.Unlock()
	delete(c.queues, name)
	c.generation++
}

// readPod reads what the loop needs of a pod, asks claims (nil for none)
// about a pod that may ask for GPUs through ResourceClaims, and asks mapper
// (nil for none) about a GPU pod that names no pod group.
func readPod(pod *corev1.Pod, mapper Mapper, claims ClaimReader) *podInfo {
	p := &podInfo{
		pod:         pod,
		node:        pod.Spec.NodeName,
		done:        pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed,
		terminating: pod.DeletionTimestamp != nil,
		gated:       v1alpha1.HasAdmissionGate(pod),
	}
	if pod.Spec.Priority != nil {
		p.priority = *pod.Spec.Priority
	}
	reqs := resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{})
	p.cpuMilli = reqs.Cpu().MilliValue()
	p.memory = reqs.Memory().Value()
	if q, ok := reqs[v1alpha1.ResourceGPUMilli]; ok {
		p.gpuMilli = q.Value()
	}
	req, errs := gpu.ParsePod(pod)
	if len(errs) == 0 && req == nil {
		req = readClaims(p, claims)
	}
	if len(errs) > 0 || req == nil {
		// Only pods the webhook wrote in canonical form (or that ask for
		// GPUs through claims) are the loop's; a pod it cannot read is
		// left to kube-scheduler and the extender, which report it.
		return p
	}
	p.req = req
	if p.gpuMilli == 0 {
		// Not canonicalised by the webhook (admitted before it ran, or
		// written by hand): count what the request says.
		for _, c := range req.Containers {
			q := c.MilliResource(0)
			p.gpuMilli += q.Value()
		}
	}
	p.queue = req.Queue
	p.key = WorkloadKey{Namespace: pod.Namespace, Pod: pod.Name}
	switch {
	case req.PodGroup != "":
		p.key = WorkloadKey{Namespace: pod.Namespace, PodGroup: req.PodGroup}
	case mapper != nil:
		m := mapper.Map(pod)
		switch {
		case m.Waiting != "":
			p.unready = m.Waiting
		case m.Gang != "":
			p.key = WorkloadKey{Namespace: pod.Namespace, Workload: m.Gang}
			p.mapping = m
		}
	}
	if p.claims != nil && len(p.claims.Missing) > 0 && p.unready == "" {
		p.unready = fmt.Sprintf("the pod names %s, which does not exist yet: the loop cannot tell what it asks for until it does", strings.Join(p.claims.Missing, " and "))
	}
	if v, err := strconv.ParseInt(pod.Annotations[v1alpha1.AnnotationMinMember], 10, 32); err == nil && v > 0 {
		p.minMember = int32(v)
	}
	if t, err := time.Parse(time.RFC3339, pod.Annotations[v1alpha1.AnnotationAdmitted]); err == nil {
		p.admitted = t
	}
	return p
}

// ClaimReader reads what a pod asks for, or holds, of GPUs through
// ResourceClaims of any driver (dra.PodDemand over the extender's caches).
type ClaimReader func(pod *corev1.Pod) dra.Demand

// WithClaims makes pods that ask for GPUs through ResourceClaims only (no
// Partita request: their own claims, claim templates, or an extended
// resource a GPU DeviceClass backs) GPU pods of their queue, charged what
// read says. A pod that names a claim that does not exist yet waits.
func WithClaims(read ClaimReader) CacheOption { return func(c *Cache) { c.claims = read } }

// readClaims is the request of a pod that asks for GPUs through
// ResourceClaims only: no containers, its queue and pod group; nil when it
// asks for none (or its queue and group do not read).
func readClaims(p *podInfo, claims ClaimReader) *gpu.PodRequest {
	if claims == nil || !dra.HasClaims(p.pod) {
		return nil
	}
	d := claims(p.pod)
	if !d.GPU() && !p.gated {
		return nil
	}
	// A gated pod whose claims turned out to ask for no GPU (the webhook
	// gated it while a claim it names did not exist yet) is still the
	// loop's to let go: it is admitted, charged nothing.
	queue, group, errs := gpu.QueueAndGroup(p.pod)
	if len(errs) > 0 {
		return nil
	}
	p.claims = &d
	p.gpuMilli = d.Milli
	return &gpu.PodRequest{Namespace: p.pod.Namespace, Name: p.pod.Name, UID: p.pod.UID, Queue: queue, PodGroup: group}
}

// ClaimAllocator simulates how kube-scheduler's DRA plugin would allocate
// pods' ResourceClaims (claims.Cache, over the structured
// allocator); see Options.Claims.
type ClaimAllocator interface {
	// Session starts one cycle's simulation over the cluster as it is now.
	Session(ctx context.Context) (ClaimSession, error)
}

// ClaimSession is one cycle's simulation: the gangs it places take their
// devices for the rest of the cycle.
type ClaimSession interface {
	// Place finds, for each pod in turn, one of its candidate nodes where
	// all its claims can be allocated at once with the pods before it, and
	// keeps them allocated for the session; all or none. It returns a
	// *ClaimsUnplaceableError when some pod's claims fit none of its
	// candidates.
	Place(ctx context.Context, pods []*corev1.Pod, candidates [][]*corev1.Node) ([]string, error)
	// Forget gives back what Place allocated for pod (a trial placement).
	Forget(pod *corev1.Pod)
	// Release frees, for the simulation, the devices pod's claims hold
	// (allocated, or placed this session), as its eviction would: a claim
	// shared with other pods is freed once every pod holding it is
	// released. Restore takes a released pod's devices back.
	Release(pod *corev1.Pod)
	Restore(pod *corev1.Pod)
}

// ClaimsUnplaceableError says the claims of a gang's member could not be
// allocated on any of its candidate nodes with the members before it.
type ClaimsUnplaceableError struct {
	// Member is the position of the first member that did not fit; Total
	// the number of members.
	Member, Total int
}

// Error implements error.
func (e *ClaimsUnplaceableError) Error() string {
	if e.Total == 1 {
		return "its claims cannot be allocated now: kube-scheduler's structured allocator finds no node with the devices free"
	}
	return fmt.Sprintf("the claims of member %d of %d cannot be allocated with the members before it: kube-scheduler's structured allocator finds no node with the devices free", e.Member+1, e.Total)
}
