package console

import (
	"encoding/json"
	"hash/fnv"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/dra"
	"github.com/partita-dev/partita/gpu"
	"github.com/partita-dev/partita/policy"
	"github.com/partita-dev/partita/report"
)

// NamespaceSet is a set of namespaces, or all of them.
type NamespaceSet struct {
	// All is set for every namespace.
	All bool
	// Names are the namespaces when All is not set.
	Names map[string]bool
}

// AllNamespaces is the set of every namespace.
func AllNamespaces() NamespaceSet { return NamespaceSet{All: true} }

// Namespaces is the set of the given namespaces.
func Namespaces(names ...string) NamespaceSet {
	s := NamespaceSet{Names: map[string]bool{}}
	for _, n := range names {
		s.Names[n] = true
	}
	return s
}

// Has reports whether ns is in the set.
func (s NamespaceSet) Has(ns string) bool { return s.All || s.Names[ns] }

// Coverage says what a Source could read: a user who may not list an
// object gets no informer for it, and the views say so rather than show
// nothing as if nothing existed.
type Coverage struct {
	// GPUNodes, Nodes and Queues: the cluster-wide objects were listed.
	GPUNodes bool `json:"gpuNodes"`
	Nodes    bool `json:"nodes"`
	Queues   bool `json:"queues"`
	// Topologies: the Topologies were listed (where the API server serves
	// them).
	Topologies bool `json:"topologies"`
	// Policy: the policy ConfigMaps of Partita's namespace were listed.
	Policy bool `json:"policy"`
	// Pods, PodGroups and Jobs are the namespaces listed.
	Pods      NamespaceSet `json:"-"`
	PodGroups NamespaceSet `json:"-"`
	Jobs      NamespaceSet `json:"-"`
	// Models are the namespaces whose Models were listed.
	Models NamespaceSet `json:"-"`
	// ResourceClaims and ResourceClaimTemplates are the namespaces whose
	// claims and templates were listed, DeviceClasses whether the classes
	// were: what pods that ask for GPUs through claims ask (why). None on
	// an API server that serves no resource.k8s.io/v1.
	ResourceClaims         NamespaceSet `json:"-"`
	ResourceClaimTemplates NamespaceSet `json:"-"`
	DeviceClasses          bool         `json:"-"`
}

// Lists are the objects a snapshot is built from, as a Source read them.
type Lists struct {
	GPUNodes []v1alpha1.GPUNode
	Nodes    []corev1.Node
	Pods     []corev1.Pod
	Queues   []v1alpha1.Queue
	// Topologies group the map's nodes by their levels, as the caller
	// chooses.
	Topologies []v1alpha1.Topology
	PodGroups  []v1alpha1.PodGroup
	Jobs       []batchv1.Job
	Models     []v1alpha1.Model
	// PolicyConfigMaps are the ConfigMaps labelled partita.dev/policy=rego
	// in Partita's namespace.
	PolicyConfigMaps       []corev1.ConfigMap
	ResourceClaims         []resourceapi.ResourceClaim
	ResourceClaimTemplates []resourceapi.ResourceClaimTemplate
	DeviceClasses          []resourceapi.DeviceClass
	Coverage               Coverage
}

// BuildOptions shape a snapshot.
type BuildOptions struct {
	// TopologyKey is the node label whose value groups nodes on the map
	// (a zone, a rack); nodes without it are grouped under "".
	TopologyKey string
	// Kinds resolves pods to workloads.
	Kinds *WorkloadKinds
	// GPUClasses are the DeviceClasses whose devices are GPUs (the
	// extender's --gpu-device-classes); dra.DefaultGPUClasses when nil.
	GPUClasses dra.GPUClasses
}

// Snapshot is the console's picture of the cluster at one moment, built
// once per batch of changes and shared, read-only, by every request. The
// views are unfiltered; each response filters them for its caller.
type Snapshot struct {
	// Version counts the snapshots of one Source.
	Version uint64
	// Built is when it was built.
	Built time.Time
	// ChangedAt is when the first change it reflects reached the console:
	// the start of the pod-event-to-page latency.
	ChangedAt time.Time

	cluster  report.Cluster
	coverage Coverage
	kinds    *WorkloadKinds

	nodes      []MapNode
	nodeIndex  map[string]int
	nodeHashes map[string]uint64

	// topologies are the Topologies by name, what the map may group by;
	// topologyHash tells a page that they changed.
	topologies   []TopologyView
	topologyHash uint64

	queues    []QueueView
	queueHash uint64

	workloads     []*Workload
	workloadIndex map[WorkloadRef]*Workload
	podWorkload   map[nsName]WorkloadRef
	workloadHash  uint64
	// namespaces are those with GPU pods or PodGroups, sorted.
	namespaces []string

	// capacityMilli and allocatedMilli sum the healthy devices and the
	// slices of the whole cluster (hidden ones included).
	capacityMilli, allocatedMilli int64
	// queueHeldMilli is what the bound pods of each queue hold, a parent
	// counting its subtree.
	queueHeldMilli map[string]int64

	policy PolicyView

	// models are the Models listed, with the pods that ask for them (of
	// every listed namespace: the handler keeps what the caller may see).
	models []v1alpha1.Model
	// modelPods are the pods that ask for a model.
	modelPods []corev1.Pod

	// verdicts memoises the workload list's why summaries for this
	// snapshot, by pod and by whether events were read: why runs a fit
	// check over every candidate node, and the list asks it for every
	// waiting workload on each refresh.
	verdicts sync.Map
}

type verdictKey struct {
	pod    nsName
	events bool
}

// MapNode is one node on the workload map. GPU amounts are in milli-GPUs.
type MapNode struct {
	// Name is the node's name.
	Name string `json:"name"`
	// Topology is the value of the map's topology label on the node, "" if
	// it has none (or the caller may not read Nodes).
	Topology string `json:"topology,omitempty"`
	// Labels are the node's labels that are levels of a Topology, for the
	// page to group the nodes by the levels of the one chosen; left out
	// for a caller who may not list Topologies.
	Labels map[string]string `json:"labels,omitempty"`
	// Isolation is how the node applies slices.
	Isolation v1alpha1.IsolationMode `json:"isolation"`
	// Enforcement is how the node applies slices: the container path and
	// what caps a slice's memory (GPUNode.status.enforcement).
	Enforcement *v1alpha1.Enforcement `json:"enforcement,omitempty"`
	// GPUs are its devices, by index.
	GPUs []MapGPU `json:"gpus"`
}

// TopologyView is a Topology the map may group nodes by.
type TopologyView struct {
	Name string `json:"name"`
	// Levels are its level labels, broadest first.
	Levels []string `json:"levels"`
}

// MapGPU is one GPU cell: the device and the slices it holds.
type MapGPU struct {
	Index     int32  `json:"index"`
	UUID      string `json:"uuid"`
	Model     string `json:"model"`
	MemoryMiB int64  `json:"memoryMiB"`
	// Health is Healthy, Unhealthy (with the agent's reason), MIG or
	// Unavailable, as `kubectl partita nodes` says it.
	Health string `json:"health"`
	// Healthy is set when the device takes new work.
	Healthy bool `json:"healthy"`
	// UsedMilli sums every slice on it, hidden ones included.
	UsedMilli int64 `json:"usedMilli"`
	// FreeMilli is what is still free, 0 on a device that takes no work.
	FreeMilli int64 `json:"freeMilli"`
	// Slices are the slices the caller may see.
	Slices []MapSlice `json:"slices"`
	// HiddenMilli sums the slices of pods in namespaces the caller may not
	// list: the device is that full, but whose they are is not shown.
	HiddenMilli int64 `json:"hiddenMilli,omitempty"`
}

// MapSlice is one container's slice of a GPU.
type MapSlice struct {
	Namespace string `json:"namespace"`
	Pod       string `json:"pod"`
	Container string `json:"container"`
	// Queue is the pod's queue ("" for none): the cell's colour.
	Queue     string `json:"queue,omitempty"`
	Milli     int64  `json:"milli"`
	MemoryMiB int64  `json:"memoryMiB,omitempty"`
	// ByMemory: the pod asked for an amount of memory.
	ByMemory bool `json:"byMemory,omitempty"`
	// Whole: the pod holds the whole device.
	Whole bool `json:"whole,omitempty"`
	// Workload is the workload the pod belongs to.
	Workload WorkloadRef `json:"workload"`
}

// QueueView is one queue of the tree with its numbers per resource.
type QueueView struct {
	Name   string `json:"name"`
	Parent string `json:"parent,omitempty"`
	// Depth is 0 for a top-level queue; the list is in tree order.
	Depth int  `json:"depth"`
	Leaf  bool `json:"leaf"`
	// Note says what is wrong with its place in the tree, if anything.
	Note       string   `json:"note,omitempty"`
	Priority   int32    `json:"priority"`
	Namespaces []string `json:"namespaces,omitempty"`
	// Resources are gpu (in GPUs), cpu (in cores) and memory (in bytes).
	Resources map[string]QueueResource `json:"resources"`
	// PendingWorkloads is status.pendingWorkloads.
	PendingWorkloads int32 `json:"pendingWorkloads"`
	// Running, Admitted and Gated count its pods (a parent's subtree's),
	// as `kubectl partita queues` does.
	Running  int `json:"running"`
	Admitted int `json:"admitted"`
	Gated    int `json:"gated"`
	// HeldGPUs is what its bound pods' slices hold now, from the ledger.
	HeldGPUs float64 `json:"heldGPUs"`
	// UsageWindow says what the resources' usageHours cover, "sliding 168h
	// window, half-life 24h"; left out unless the admission loop weighs
	// usage in fair share (--fair-share-usage-weight) and reported it.
	UsageWindow string `json:"usageWindow,omitempty" description:"what the resources' usageHours cover, e.g. sliding 168h window, half-life 24h; only while the admission loop weighs past usage in fair share"`
	// ResourceVersion is the Queue's, for an edit that must not overwrite
	// another.
	ResourceVersion string `json:"resourceVersion"`
}

// QueueResource is one resource of a queue. Quota -1 means the whole
// capacity, Limit -1 no limit. The status numbers are nil until the
// admission loop reports them.
type QueueResource struct {
	Quota           float64 `json:"quota"`
	Limit           float64 `json:"limit"`
	OverQuotaWeight int32   `json:"overQuotaWeight"`
	// Set reports whether the queue's spec names the resource (else the
	// defaults apply: quota 0, no limit, weight 1).
	Set       bool     `json:"set"`
	Allocated *float64 `json:"allocated"`
	FairShare *float64 `json:"fairShare"`
	Requested *float64 `json:"requested"`
	// Pending is requested − allocated: what its waiting workloads ask.
	Pending *float64 `json:"pending"`
	// Borrowed is allocated above quota: idle capacity lent to it.
	Borrowed *float64 `json:"borrowed"`
	// Reclaimable is allocated above fair share: what reclaim would take
	// back when a queue below its fair share waits.
	Reclaimable *float64 `json:"reclaimable"`
	// UsageHours is status.usage.hours: what the queue (a parent with its
	// children) used over the usage window, decayed by the half-life, in
	// GPU-hours, core-hours or byte-hours. The usage fields are left out
	// unless the admission loop weighs usage in fair share.
	UsageHours *float64 `json:"usageHours,omitempty" description:"usage over the window, decayed by the half-life: GPU-hours, core-hours or byte-hours (a parent's includes its children's)"`
	// UsageShare is that usage over what the cluster's capacity would have
	// given in the same window (0 to 1).
	UsageShare *float64 `json:"usageShare,omitempty" description:"usageHours over what the cluster's capacity gave in the window, 0 to 1"`
	// FairShareWithoutUsage is the fair share the queue would have if
	// usage did not count; where it differs from FairShare, history
	// decided.
	FairShareWithoutUsage *float64 `json:"fairShareWithoutUsage,omitempty" description:"the fair share if usage did not count; where it differs from fairShare, history decided"`
}

// queueResourceNames are the resources of a queue, in display order.
func queueResourceNames() []corev1.ResourceName {
	return []corev1.ResourceName{v1alpha1.ResourceGPU, v1alpha1.ResourceCPU, v1alpha1.ResourceMemory}
}

// Build makes the snapshot of l. It is pure: the same lists give the same
// views.
func Build(l Lists, o BuildOptions, version uint64, now, changedAt time.Time) *Snapshot {
	if o.Kinds == nil {
		o.Kinds = NewWorkloadKinds()
	}
	s := &Snapshot{Version: version, Built: now, ChangedAt: changedAt, coverage: l.Coverage, kinds: o.Kinds}
	s.cluster = report.Cluster{GPUNodes: l.GPUNodes, Nodes: l.Nodes, Pods: l.Pods, Queues: l.Queues, PodGroups: l.PodGroups,
		ResourceClaims: l.ResourceClaims, ResourceClaimTemplates: l.ResourceClaimTemplates, DeviceClasses: l.DeviceClasses, GPUClasses: o.GPUClasses}
	s.models = l.Models
	for i := range l.Pods {
		if _, ok := l.Pods[i].Annotations[v1alpha1.AnnotationModel]; ok {
			s.modelPods = append(s.modelPods, l.Pods[i])
		}
	}
	ledger := gpu.BuildLedger(l.GPUNodes, l.Pods)
	s.cluster.Ledger = ledger

	held := map[string]int64{}
	state := ledger.State()
	for _, ps := range state.Pods {
		for _, c := range ps.Allocation.Containers {
			held[string(ps.Allocation.UID)] += c.Milli * int64(len(c.DeviceIndexes))
		}
	}
	objs := newObjectIndex(l.Jobs, l.PodGroups)
	s.workloads, s.workloadIndex, s.podWorkload = buildWorkloads(o.Kinds, l.Pods, objs, held, ledger.MaxDeviceMemoryMiB())
	s.workloadHash = hashJSON(s.workloads)

	nsSet := map[string]bool{}
	for _, w := range s.workloads {
		nsSet[w.Namespace] = true
	}
	for i := range l.PodGroups {
		nsSet[l.PodGroups[i].Namespace] = true
	}
	for ns := range nsSet {
		s.namespaces = append(s.namespaces, ns)
	}
	sort.Strings(s.namespaces)

	s.buildMap(l, o)
	s.buildQueues(l)
	s.policy = policyFromConfigMaps(l.PolicyConfigMaps, l.Coverage.Policy)
	return s
}

func (s *Snapshot) buildMap(l Lists, o BuildOptions) {
	rep := report.Nodes(&s.cluster)
	podQueue := map[nsName]string{}
	for i := range l.Pods {
		p := &l.Pods[i]
		if q := p.Labels[v1alpha1.LabelQueue]; q != "" {
			podQueue[nsName{p.Namespace, p.Name}] = q
		}
	}
	topology := map[string]string{}
	if o.TopologyKey != "" {
		for i := range l.Nodes {
			if v, ok := l.Nodes[i].Labels[o.TopologyKey]; ok {
				topology[l.Nodes[i].Name] = v
			}
		}
	}
	s.topologies = make([]TopologyView, 0, len(l.Topologies))
	levels := map[string]bool{}
	for i := range l.Topologies {
		t := &l.Topologies[i]
		s.topologies = append(s.topologies, TopologyView{Name: t.Name, Levels: report.Levels(t)})
		for _, lv := range t.Spec.Levels {
			levels[lv.NodeLabel] = true
		}
	}
	slices.SortFunc(s.topologies, func(a, b TopologyView) int { return strings.Compare(a.Name, b.Name) })
	s.topologyHash = hashJSON(s.topologies)
	// Only the level labels: the map goes to every page, and a node has
	// many labels no view reads.
	levelLabels := map[string]map[string]string{}
	for i := range l.Nodes {
		n := &l.Nodes[i]
		for k := range levels {
			if v, ok := n.Labels[k]; ok {
				if levelLabels[n.Name] == nil {
					levelLabels[n.Name] = map[string]string{}
				}
				levelLabels[n.Name][k] = v
			}
		}
	}
	// Slices of pods the Source could not read (a user who may list pods
	// in some namespaces only) are known from the agent's report in
	// GPUNode.status.slices: counted, never named.
	unseen := map[string]map[int32]int64{}
	for i := range l.GPUNodes {
		gn := &l.GPUNodes[i]
		for _, sl := range gn.Status.Slices {
			if l.Coverage.Pods.Has(sl.Namespace) {
				continue
			}
			if unseen[gn.Name] == nil {
				unseen[gn.Name] = map[int32]int64{}
			}
			unseen[gn.Name][sl.DeviceIndex] += sl.Milli
		}
	}
	s.nodes = make([]MapNode, 0, len(rep.Nodes))
	s.nodeIndex = make(map[string]int, len(rep.Nodes))
	s.nodeHashes = make(map[string]uint64, len(rep.Nodes))
	for _, n := range rep.Nodes {
		mn := MapNode{Name: n.Name, Topology: topology[n.Name], Labels: levelLabels[n.Name], Isolation: n.Isolation, Enforcement: n.Enforcement, GPUs: make([]MapGPU, 0, len(n.Devices))}
		for _, d := range n.Devices {
			g := MapGPU{
				Index: d.Index, UUID: d.UUID, Model: d.Model, MemoryMiB: d.MemoryMiB, Health: d.Health,
				Healthy: d.Health == "Healthy", UsedMilli: d.UsedMilli, Slices: make([]MapSlice, 0, len(d.Slices)),
				HiddenMilli: unseen[n.Name][d.Index],
			}
			g.UsedMilli += g.HiddenMilli
			if g.Healthy && d.FreeMilli > 0 {
				g.FreeMilli = max(0, d.FreeMilli-g.HiddenMilli)
			}
			for _, sl := range d.Slices {
				key := nsName{sl.Namespace, sl.Pod}
				g.Slices = append(g.Slices, MapSlice{
					Namespace: sl.Namespace, Pod: sl.Pod, Container: sl.Container, Queue: podQueue[key],
					Milli: sl.Milli, MemoryMiB: sl.MemoryMiB, ByMemory: sl.ByMemory, Whole: sl.Whole,
					Workload: s.workloadOf(key),
				})
			}
			if g.Healthy {
				s.capacityMilli += gpu.MilliPerGPU
			}
			s.allocatedMilli += g.UsedMilli
			mn.GPUs = append(mn.GPUs, g)
		}
		s.nodeIndex[mn.Name] = len(s.nodes)
		s.nodeHashes[mn.Name] = hashJSON(mn)
		s.nodes = append(s.nodes, mn)
	}
}

// workloadOf is the workload of a pod, the pod itself when it is unknown.
func (s *Snapshot) workloadOf(key nsName) WorkloadRef {
	if ref, ok := s.podWorkload[key]; ok {
		return ref
	}
	return WorkloadRef{Kind: KindPod, Namespace: key.namespace, Name: key.name}
}

func (s *Snapshot) buildQueues(l Lists) {
	rep := report.Queues(&s.cluster)
	byName := map[string]*v1alpha1.Queue{}
	for i := range l.Queues {
		byName[l.Queues[i].Name] = &l.Queues[i]
	}
	// What each leaf's bound pods hold, summed up the tree.
	leafHeld := map[string]int64{}
	for _, w := range s.workloads {
		if w.Queue != "" {
			leafHeld[w.Queue] += w.HeldMilli
		}
	}
	s.queueHeldMilli = map[string]int64{}
	for leaf, m := range leafHeld {
		seen := map[string]bool{}
		for q := leaf; q != "" && !seen[q]; {
			seen[q] = true
			s.queueHeldMilli[q] += m
			if byName[q] == nil {
				break
			}
			q = byName[q].Spec.Parent
		}
	}
	s.queues = make([]QueueView, 0, len(rep.Queues))
	for _, r := range rep.Queues {
		q := byName[r.Name]
		v := QueueView{
			Name: r.Name, Parent: r.Parent, Depth: r.Depth, Leaf: r.Leaf, Note: r.Note, Priority: r.Priority,
			Namespaces: q.Spec.Namespaces, PendingWorkloads: r.PendingWorkloads,
			Running: r.Running, Admitted: r.Admitted, Gated: r.Gated,
			HeldGPUs:        milliToGPUs(s.queueHeldMilli[r.Name]),
			UsageWindow:     r.UsageWindow,
			ResourceVersion: q.ResourceVersion,
			Resources:       map[string]QueueResource{},
		}
		for _, name := range queueResourceNames() {
			v.Resources[string(name)] = queueResource(q, name)
		}
		s.queues = append(s.queues, v)
	}
	s.queueHash = hashJSON(s.queues)
}

// queueResource reads one resource of a queue, with fairshare's defaults
// (quota 0, limit -1, weight 1) where the spec says nothing.
func queueResource(q *v1alpha1.Queue, name corev1.ResourceName) QueueResource {
	r := QueueResource{Limit: -1, OverQuotaWeight: 1}
	var spec *v1alpha1.ResourceQuota
	switch name {
	case v1alpha1.ResourceGPU:
		spec = q.Spec.Resources.GPU
	case v1alpha1.ResourceCPU:
		spec = q.Spec.Resources.CPU
	case v1alpha1.ResourceMemory:
		spec = q.Spec.Resources.Memory
	}
	if spec != nil {
		r.Set = true
		if spec.Quota != nil {
			r.Quota = amount(*spec.Quota)
		}
		if spec.Limit != nil {
			r.Limit = amount(*spec.Limit)
		}
		if spec.OverQuotaWeight != nil {
			r.OverQuotaWeight = *spec.OverQuotaWeight
		}
	}
	status := func(l corev1.ResourceList) *float64 {
		v, ok := l[name]
		if !ok {
			return nil
		}
		f := amount(v)
		return &f
	}
	r.Allocated, r.FairShare, r.Requested = status(q.Status.Allocated), status(q.Status.FairShare), status(q.Status.Requested)
	if u := q.Status.Usage; u != nil {
		// Usage is written to the micro-unit: a share of 0.0004 is not 0.
		exact := func(l corev1.ResourceList) *float64 {
			v, ok := l[name]
			if !ok {
				return nil
			}
			f := report.QuantityFloat(v)
			return &f
		}
		r.UsageHours, r.UsageShare, r.FairShareWithoutUsage = exact(u.Hours), exact(u.Share), status(u.FairShareWithoutUsage)
	}
	if r.Allocated != nil {
		if r.Requested != nil {
			r.Pending = new(max(0, *r.Requested-*r.Allocated))
		}
		if r.Quota >= 0 {
			r.Borrowed = new(max(0, *r.Allocated-r.Quota))
		}
		if r.FairShare != nil {
			r.Reclaimable = new(max(0, *r.Allocated-*r.FairShare))
		}
	}
	return r
}

// amount is a quantity as a number in its base unit (GPUs, cores, bytes),
// exact to the milli.
func amount(q resource.Quantity) float64 {
	if q.CmpInt64(-1) == 0 {
		return -1
	}
	return float64(q.MilliValue()) / 1000
}

func milliToGPUs(m int64) float64 { return float64(m) / 1000 }

// hashJSON is a digest of v's JSON, to tell whether a view changed between
// snapshots.
func hashJSON(v any) uint64 {
	h := fnv.New64a()
	_ = json.NewEncoder(h).Encode(v)
	return h.Sum64()
}

// PolicyView is the policy in force, as the webhook reported it on the
// policy ConfigMaps.
type PolicyView struct {
	// Readable is false when the caller (or the console) may not list the
	// policy ConfigMaps; the other fields are then empty.
	Readable bool `json:"readable"`
	// Version is the digest of the policy in force (partita_policy_info's
	// version).
	Version string `json:"version"`
	// Source is default or configmap:<names>, as partita_policy_info says.
	Source string `json:"source"`
	// ConfigMaps are the policy ConfigMaps with the webhook's status.
	ConfigMaps []PolicyConfigMap `json:"configMaps"`
	// LastReload is the latest load or refusal, from the webhook's events.
	LastReload *PolicyReload `json:"lastReload,omitempty"`
	// Denials are the webhook's refusals by reason.
	Denials []DenialCount `json:"denials"`
	// DenialsSource says where the counts come from: prometheus, or the
	// webhook's metrics endpoints.
	DenialsSource string `json:"denialsSource,omitempty"`
	// DenialsError says why there are no counts, when there are none.
	DenialsError string `json:"denialsError,omitempty"`
}

// PolicyConfigMap is one policy ConfigMap and the webhook's word on it.
type PolicyConfigMap struct {
	Name string `json:"name"`
	// Status is partita.dev/policy-status: Loaded: ... or Refused: ...
	Status string `json:"status"`
}

// PolicyReload is one load of a policy, from its event.
type PolicyReload struct {
	// Outcome is Loaded or Refused.
	Outcome   string    `json:"outcome"`
	Message   string    `json:"message"`
	ConfigMap string    `json:"configMap"`
	Time      time.Time `json:"time"`
}

// DenialCount is how many requests the webhook refused for one reason.
type DenialCount struct {
	Reason string  `json:"reason"`
	Count  float64 `json:"count"`
}

// policyFromConfigMaps reads the version in force from the ConfigMaps'
// status annotations; without ConfigMaps the default bundle is in force.
func policyFromConfigMaps(cms []corev1.ConfigMap, readable bool) PolicyView {
	v := PolicyView{Readable: readable, ConfigMaps: []PolicyConfigMap{}, Denials: []DenialCount{}}
	if !readable {
		return v
	}
	if len(cms) == 0 {
		v.Version, v.Source = policy.DefaultBundle().Version(), policy.SourceDefault
		return v
	}
	names := make([]string, 0, len(cms))
	for i := range cms {
		cm := &cms[i]
		st := cm.Annotations[policy.AnnotationPolicyStatus]
		names = append(names, cm.Namespace+"/"+cm.Name)
		v.ConfigMaps = append(v.ConfigMaps, PolicyConfigMap{Name: cm.Name, Status: st})
		if ver := versionInStatus(st); ver != "" && v.Version == "" {
			v.Version = ver
		}
	}
	slices.Sort(names)
	slices.SortFunc(v.ConfigMaps, func(a, b PolicyConfigMap) int { return strings.Compare(a.Name, b.Name) })
	v.Source = "configmap:" + strings.Join(names, ",")
	return v
}

// versionInStatus reads the version in force from a status annotation:
// "Loaded: policy V" or "Refused: ...; policy V stays in force".
func versionInStatus(st string) string {
	if v, ok := strings.CutPrefix(st, "Loaded: policy "); ok {
		return strings.TrimSpace(v)
	}
	if i := strings.LastIndex(st, "; policy "); i >= 0 && strings.HasSuffix(st, " stays in force") {
		return strings.TrimSuffix(st[i+len("; policy "):], " stays in force")
	}
	return ""
}
