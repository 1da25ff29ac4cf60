// Package workloadmap is the admission loop's workload map (docs/workloads.md):
// it resolves the owners of GPU pods (a pod's Job, the Job's JobSet, the
// JobSet's TrainJob, ...) through informers of the kinds the Rego rules
// name, and asks the policy (data.partita.workload) how each pod groups
// into a gang. It answers cycle.Mapper for the loop's cache, and tells
// the cache which pods to ask about again when an owner, the rules, or the
// set of kinds the API server serves changes.
//
// Informers start only for the kinds the rules name and the API server
// serves (discovered at start, when a CRD appears or goes, and every
// minute), so a cluster without Ray or JobSet pays nothing for them; a
// kind the extender may not list is left out with a log line that says
// which permission is missing. The package imports policy and
// admission/cycle, and nothing imports it but the extender command's
// wiring.
package workloadmap

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/partita-dev/partita/admission/cycle"
	"github.com/partita-dev/partita/policy"
)

// Decider answers the workload policy (policy.Engine).
type Decider interface {
	Workload(ctx context.Context, in *policy.WorkloadInput) (*policy.WorkloadDecision, error)
	WorkloadKinds() []policy.WorkloadKind
	Version() string
}

// PodGetter finds a pod by namespace and name (the extender's pod informer):
// a pod can be a link of a chain (a LeaderWorkerSet's worker StatefulSet is
// owned by the group's leader pod).
type PodGetter func(namespace, name string) (*corev1.Pod, bool)

// maxChain bounds the owners followed from one pod.
const maxChain = 8

// objKey names an owner.
type objKey struct {
	group, kind, namespace, name string
}

func (k objKey) String() string {
	gk := schema.GroupKind{Group: k.group, Kind: k.kind}
	return gk.String() + " " + k.namespace + "/" + k.name
}

// node is one owner as the map keeps it.
type node struct {
	apiVersion string
	uid        types.UID
	controller *metav1.OwnerReference
	// m is what the rules see; obj is m converted for Rego, made on first
	// use (most Jobs never own a GPU pod).
	m   map[string]any
	obj *policy.Object
}

// memoEntry is the last answer for a pod.
type memoEntry struct {
	fp      uint64
	version string
	stale   bool
	mapping cycle.Mapping
	deps    []objKey
	// firstSeen is when the map first saw the pod (see unserved).
	firstSeen time.Time
}

// Mapper is the workload map. It is safe for concurrent use.
type Mapper struct {
	decider  Decider
	pods     PodGetter
	log      logr.Logger
	onChange func([]types.UID)
	// ctx bounds evaluations; set by Start.
	ctx context.Context

	lock sync.Mutex
	// watched are the kinds whose informers run, by group/kind.
	watched map[schema.GroupKind]*watch
	objects map[objKey]*node
	memo    map[types.UID]*memoEntry
	// waiters are the pods whose last answer read (or looked for) an
	// object.
	waiters map[objKey]map[types.UID]struct{}
	// discovered is set once the kinds were first resolved.
	discovered bool
	// denied are the kinds the policy names that the extender may not
	// list: pods are grouped without them.
	denied map[schema.GroupKind]bool
	// unserved are the kinds the policy names that the API server did not
	// serve, with when the discovery pass that found so began. A pod owned
	// by such a kind waits for a pass that began after the map first saw
	// it: the kind's CRD may have just appeared (an operator installed
	// right before its first workload), and admitting the pod alone before
	// its owners can be read would start a gang in part.
	unserved map[schema.GroupKind]time.Time
	// poke asks Start for a discovery pass now.
	poke chan struct{}
}

// Option configures a Mapper.
type Option func(*Mapper)

// WithOnChange sets what the map calls with the pods whose answer may have
// changed (the cache's Remap, then a cycle). It is called without the
// map's lock held.
func WithOnChange(f func([]types.UID)) Option { return func(m *Mapper) { m.onChange = f } }

// WithLogger sets the logger.
func WithLogger(l logr.Logger) Option { return func(m *Mapper) { m.log = l } }

// New returns a map that asks decider and reads pods through pods. It maps
// nothing until Start has resolved the kinds (Synced).
func New(decider Decider, pods PodGetter, opts ...Option) *Mapper {
	m := &Mapper{
		decider: decider, pods: pods, log: logr.Discard(), onChange: func([]types.UID) {}, ctx: context.Background(),
		watched: map[schema.GroupKind]*watch{}, objects: map[objKey]*node{},
		memo: map[types.UID]*memoEntry{}, waiters: map[objKey]map[types.UID]struct{}{},
		denied: map[schema.GroupKind]bool{}, unserved: map[schema.GroupKind]time.Time{}, poke: make(chan struct{}, 1),
	}
	for _, o := range opts {
		o(m)
	}
	return m
}

// Map answers cycle.Mapper: the pod's gang, or why it cannot be
// grouped yet. It asks the policy only when the pod, one of its owners or
// the policy changed since the last answer.
func (m *Mapper) Map(pod *corev1.Pod) cycle.Mapping {
	fp := podFingerprint(pod)
	version := m.decider.Version()
	m.lock.Lock()
	firstSeen := time.Now()
	if e := m.memo[pod.UID]; e != nil {
		if e.fp == fp && e.version == version && !e.stale {
			m.lock.Unlock()
			return e.mapping
		}
		firstSeen = e.firstSeen
	}
	in, deps, waiting := m.resolve(pod, firstSeen)
	ctx := m.ctx
	m.lock.Unlock()

	var mapping cycle.Mapping
	if waiting != "" {
		mapping.Waiting = waiting
	} else {
		mapping = m.decide(ctx, pod, in)
	}

	m.lock.Lock()
	defer m.lock.Unlock()
	if old := m.memo[pod.UID]; old != nil {
		m.dropDeps(pod.UID, old.deps)
	}
	m.memo[pod.UID] = &memoEntry{fp: fp, version: version, mapping: mapping, deps: deps, firstSeen: firstSeen}
	for _, k := range deps {
		set := m.waiters[k]
		if set == nil {
			set = map[types.UID]struct{}{}
			m.waiters[k] = set
		}
		set[pod.UID] = struct{}{}
	}
	return mapping
}

// Forget drops what the map remembers of a pod.
func (m *Mapper) Forget(uid types.UID) {
	m.lock.Lock()
	defer m.lock.Unlock()
	if e := m.memo[uid]; e != nil {
		m.dropDeps(uid, e.deps)
		delete(m.memo, uid)
	}
}

func (m *Mapper) dropDeps(uid types.UID, deps []objKey) {
	for _, k := range deps {
		if set := m.waiters[k]; set != nil {
			delete(set, uid)
			if len(set) == 0 {
				delete(m.waiters, k)
			}
		}
	}
}

// resolve builds the policy input of pod, which the map first saw at
// firstSeen: its chain of controllers, and the native PodGroup and Workload
// it names. It returns the objects it read or looked for, and, when the pod
// cannot be grouped yet, why. The lock is held.
func (m *Mapper) resolve(pod *corev1.Pod, firstSeen time.Time) (*policy.WorkloadInput, []objKey, string) {
	in := &policy.WorkloadInput{Pod: policy.WorkloadPod{
		Namespace: pod.Namespace, Name: pod.Name, UID: string(pod.UID),
		Labels: pod.Labels, Annotations: policyAnnotations(pod.Annotations),
	}}
	if !m.discovered {
		return in, nil, "waiting for the extender to discover which workload kinds the API server serves"
	}
	var deps []objKey
	ref := metav1.GetControllerOfNoCopy(pod)
	seen := map[types.UID]bool{pod.UID: true}
	for ref != nil && len(in.Chain) < maxChain && !seen[ref.UID] {
		seen[ref.UID] = true
		gv, _ := schema.ParseGroupVersion(ref.APIVersion)
		key := objKey{group: gv.Group, kind: ref.Kind, namespace: pod.Namespace, name: ref.Name}
		if key.group == "" && key.kind == "Pod" {
			// A pod in the chain: a LeaderWorkerSet's leader owns its
			// group's worker StatefulSet.
			p, ok := m.pods(pod.Namespace, ref.Name)
			if !ok || p.UID != ref.UID {
				break
			}
			in.Chain = append(in.Chain, m.podObject(p))
			ref = metav1.GetControllerOfNoCopy(p)
			continue
		}
		deps = append(deps, key)
		gk := schema.GroupKind{Group: key.group, Kind: key.kind}
		w := m.watched[gk]
		if w == nil {
			if m.mustWaitFor(gk, firstSeen) {
				return in, deps, fmt.Sprintf("waiting for the extender to watch %s, the kind of the pod's owner %s (its CRD is new)", gk, key.name)
			}
			// Not a kind the rules name (a ReplicaSet), one the API server
			// does not serve, or one the extender may not list: the chain
			// ends here.
			break
		}
		n := m.objects[key]
		if n == nil || n.uid != ref.UID {
			if !w.hasSynced() {
				return in, deps, fmt.Sprintf("waiting for the extender to read the %ss of the cluster (the pod's owner is %s)", key.kind, key)
			}
			return in, deps, fmt.Sprintf("waiting to read %s, the pod's owner", key)
		}
		in.Chain = append(in.Chain, n.policyObject())
		ref = n.controller
	}
	if sg := pod.Spec.SchedulingGroup; sg != nil && sg.PodGroupName != nil && *sg.PodGroupName != "" {
		key := objKey{group: "scheduling.k8s.io", kind: "PodGroup", namespace: pod.Namespace, name: *sg.PodGroupName}
		if w := m.watched[schema.GroupKind{Group: key.group, Kind: key.kind}]; w != nil {
			deps = append(deps, key)
			n := m.objects[key]
			if n == nil {
				return in, deps, fmt.Sprintf("waiting for %s, named by the pod's spec.schedulingGroup", key)
			}
			in.PodGroup = n.policyObject()
			if name := workloadRef(n.m); name != "" {
				wkey := objKey{group: "scheduling.k8s.io", kind: "Workload", namespace: pod.Namespace, name: name}
				if m.watched[schema.GroupKind{Group: wkey.group, Kind: wkey.kind}] != nil {
					deps = append(deps, wkey)
					if wn := m.objects[wkey]; wn != nil {
						in.Workload = wn.policyObject()
					}
				}
			}
		}
	}
	return in, deps, ""
}

// mustWaitFor reports whether a pod first seen at firstSeen, owned by an
// object of kind gk that is not watched, must wait for a discovery pass:
// the policy names gk, the extender may list it, and no pass that began
// after firstSeen has found the API server does not serve it. It asks for
// such a pass. The lock is held.
func (m *Mapper) mustWaitFor(gk schema.GroupKind, firstSeen time.Time) bool {
	if m.denied[gk] || !slices.ContainsFunc(m.decider.WorkloadKinds(), func(k policy.WorkloadKind) bool { return k.Group == gk.Group && k.Kind == gk.Kind }) {
		return false
	}
	if at, ok := m.unserved[gk]; ok && at.After(firstSeen) {
		return false
	}
	select {
	case m.poke <- struct{}{}:
	default:
	}
	return true
}

// workloadRef is spec.workloadRef.workloadName of a native PodGroup.
func workloadRef(pg map[string]any) string {
	spec, _ := pg["spec"].(map[string]any)
	ref, _ := spec["workloadRef"].(map[string]any)
	name, _ := ref["workloadName"].(string)
	return name
}

func (m *Mapper) podObject(p *corev1.Pod) *policy.Object {
	o, err := policy.NewObject(policyMap("v1", "Pod", p, nil))
	if err != nil {
		// Strings only: a conversion cannot fail.
		panic(err)
	}
	return o
}

func (n *node) policyObject() *policy.Object {
	if n.obj == nil {
		o, err := policy.NewObject(n.m)
		if err != nil {
			// Values from an unstructured object always convert.
			panic(err)
		}
		n.obj = o
	}
	return n.obj
}

// decide asks the policy and reads its answer.
func (m *Mapper) decide(ctx context.Context, pod *corev1.Pod, in *policy.WorkloadInput) cycle.Mapping {
	d, err := m.decider.Workload(ctx, in)
	if err != nil {
		m.log.V(2).Info("Workload policy failed", "pod", klogRef(pod), "err", err.Error())
		return cycle.Mapping{Waiting: fmt.Sprintf("the workload policy (data.partita.workload) failed, so the pod waits: %v; check the policy ConfigMaps labelled partita.dev/policy=rego and the extender's log", err)}
	}
	if len(d.Errors) > 0 {
		return cycle.Mapping{Waiting: "the workload policy (data.partita.workload) reports: " + strings.Join(d.Errors, "; ")}
	}
	g := d.Gang
	if g == nil {
		return cycle.Mapping{}
	}
	out := cycle.Mapping{
		Gang: g.Name, MinMember: g.MinMember, Elastic: g.Elastic,
		Queue: g.Queue, PriorityClassName: g.PriorityClassName, Kind: g.Kind, Name: g.OwnerName,
		Topology: g.Topology, SubGroups: g.SubGroups, SubGroup: g.SubGroup,
	}
	top := topOwner(in)
	if top != nil {
		tm := top.Map()
		out.Owner = cycle.Owner{APIVersion: str(tm["apiVersion"]), Kind: str(tm["kind"]), Name: str(tm["name"]), UID: types.UID(str(tm["uid"]))}
	}
	if out.Kind == "" {
		out.Kind = cmpOr(out.Owner.Kind, "Workload")
	}
	if out.Name == "" {
		out.Name = cmpOr(out.Owner.Name, g.Name)
	}
	return out
}

// topOwner is the object the gang's PodGroup is owned by: the top of the
// chain, else the native PodGroup the pod names.
func topOwner(in *policy.WorkloadInput) *policy.Object {
	if len(in.Chain) > 0 {
		top := in.Chain[len(in.Chain)-1]
		if str(top.Map()["kind"]) != "Pod" {
			return top
		}
	}
	if in.Workload != nil {
		return in.Workload
	}
	return in.PodGroup
}

func str(v any) string {
	s, _ := v.(string)
	return s
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func klogRef(p *corev1.Pod) string { return p.Namespace + "/" + p.Name }

// objectChanged records an owner's new state (nil when it is gone) and
// tells the pods that read it.
func (m *Mapper) objectChanged(key objKey, n *node) {
	m.lock.Lock()
	old := m.objects[key]
	if n == nil {
		delete(m.objects, key)
	} else {
		if old != nil && old.uid == n.uid && equalNodes(old, n) {
			m.lock.Unlock()
			return
		}
		m.objects[key] = n
	}
	uids := m.staleLocked(m.waiters[key])
	m.lock.Unlock()
	m.notify(uids)
}

// staleLocked marks the answers of uids stale and returns them.
func (m *Mapper) staleLocked(set map[types.UID]struct{}) []types.UID {
	uids := make([]types.UID, 0, len(set))
	for uid := range set {
		if e := m.memo[uid]; e != nil {
			e.stale = true
		}
		uids = append(uids, uid)
	}
	return uids
}

// remapAll asks again about every pod the map answered for: the rules or
// the watched kinds changed.
func (m *Mapper) remapAll() {
	m.lock.Lock()
	uids := make([]types.UID, 0, len(m.memo))
	for uid, e := range m.memo {
		e.stale = true
		uids = append(uids, uid)
	}
	m.lock.Unlock()
	m.notify(uids)
}

func (m *Mapper) notify(uids []types.UID) {
	if len(uids) > 0 {
		slices.Sort(uids)
		m.onChange(uids)
	}
}

// equalNodes reports whether two states of an owner read the same.
func equalNodes(a, b *node) bool {
	if (a.controller == nil) != (b.controller == nil) || a.controller != nil && a.controller.UID != b.controller.UID {
		return false
	}
	return deepEqualJSON(a.m, b.m)
}

func deepEqualJSON(a, b any) bool {
	switch x := a.(type) {
	case map[string]any:
		y, ok := b.(map[string]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for k, v := range x {
			w, ok := y[k]
			if !ok || !deepEqualJSON(v, w) {
				return false
			}
		}
		return true
	case []any:
		y, ok := b.([]any)
		return ok && slices.EqualFunc(x, y, deepEqualJSON)
	}
	return a == b
}

// Kinds returns the kinds whose informers run, sorted: for logs, status
// and tests.
func (m *Mapper) Kinds() []string {
	m.lock.Lock()
	defer m.lock.Unlock()
	out := make([]string, 0, len(m.watched))
	for gk, w := range m.watched {
		out = append(out, fmt.Sprintf("%s (%s, %s)", gk, w.gvr.Version, w.mode()))
	}
	slices.Sort(out)
	return out
}

// Synced reports whether the kinds were discovered and every informer has
// delivered its first list: until then the map's answers may lack owners.
func (m *Mapper) Synced() bool {
	m.lock.Lock()
	defer m.lock.Unlock()
	if !m.discovered {
		return false
	}
	for _, w := range m.watched {
		if !w.hasSynced() {
			return false
		}
	}
	return true
}

// rediscoverEvery is how often the kinds are discovered again without a
// CRD event (a kind the API server starts or stops serving, an RBAC grant).
const rediscoverEvery = time.Minute
