package console

import (
	"errors"
	"net/http"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
	"github.com/partita-dev/partita/policy"
	"github.com/partita-dev/partita/report"
)

// apiRoutes is the API: every operation the pages use, and scripts may.
func (s *Server) apiRoutes() []route {
	return []route{
		{method: http.MethodGet, path: "/api/v1/openapi.json", id: "openapi", tag: "meta", summary: "This document",
			out: new(map[string]any), handle: nil},
		{method: http.MethodGet, path: "/api/v1/whoami", id: "whoami", tag: "meta", summary: "Who the caller is and what the console offers them",
			description: "The caller's identity as the API server knows it, and the actions their RBAC allows (asked with access reviews). The pages show a button only when this says so; the API server refuses the action anyway when it is not allowed.",
			out:         new(Whoami), handle: handleWhoami},
		{method: http.MethodGet, path: "/api/v1/map", id: "map", tag: "map", summary: "The workload map: every GPU and its slices, by node",
			description: "Slices of pods in namespaces where the caller may not list pods are counted in hiddenMilli, without names. The filters keep the nodes that match (node: part of the name; model: the GPU model; queue, namespace: nodes holding such a slice).",
			in:          new(mapRequest), out: new(MapView), handle: handleMap},
		{method: http.MethodGet, path: "/api/v1/events", id: "events", tag: "map", summary: "Live changes, as Server-Sent Events",
			description: "Events: hello {version}; nodes {version, changedAt, full, nodes, removed} with the changed nodes as /api/v1/map gives them; queues and workloads {version} when those lists changed; resync when the page should read everything again. since is the version the caller last read: without it, or when it is older, the first nodes event holds every node.",
			in:          new(eventsRequest), stream: true, handle: handleEvents},
		{method: http.MethodGet, path: "/api/v1/queues", id: "listQueues", tag: "queues", summary: "The queue tree with quota, limit, allocated, fair share, requested and pending per resource",
			out: new(QueuesView), handle: handleQueues},
		{method: http.MethodPost, path: "/api/v1/queues", id: "createQueue", tag: "queues", summary: "Create a queue, as the caller",
			description: "Made as the caller: the API server checks their RBAC (create queues.partita.dev) and the Queue's schema (limit >= quota unless -1).",
			in:          new(QueueInput), out: new(QueueView), status: http.StatusCreated, handle: handleCreateQueue},
		{method: http.MethodPatch, path: "/api/v1/queues/{name}", id: "updateQueue", tag: "queues", summary: "Change a queue's quota, limit, over-quota weight, priority, parent or namespaces, as the caller",
			description: "Only the fields given change. With resourceVersion, the change is refused (409) if the queue changed since it was read.",
			in:          new(queuePatchRequest), out: new(QueueView), handle: handleUpdateQueue},
		{method: http.MethodGet, path: "/api/v1/workloads", id: "listWorkloads", tag: "workloads", summary: "Every workload the caller may see: gangs, Jobs, pods",
			description: "A waiting workload carries the verdict of `kubectl partita why` for its first waiting pod, from the same code.",
			in:          new(workloadsRequest), out: new(WorkloadsView), handle: handleWorkloads},
		{method: http.MethodPost, path: "/api/v1/workloads", id: "submitWorkload", tag: "workloads", summary: "Submit a simple workload (one pod), as the caller",
			description: "A pod with one container that asks for a fraction of a GPU, an amount of GPU memory, or whole GPUs, in a queue: a quick way to get a notebook-sized slice. Made as the caller; the webhook checks it as any pod.",
			in:          new(SubmitInput), out: new(SubmitResult), status: http.StatusCreated, handle: handleSubmit},
		{method: http.MethodGet, path: "/api/v1/workloads/{kind}/{namespace}/{name}", id: "getWorkload", tag: "workloads", summary: "One workload: its pods, their devices and events, and why it waits",
			in: new(workloadPath), out: new(WorkloadDetail), handle: handleWorkload},
		{method: http.MethodDelete, path: "/api/v1/workloads/{kind}/{namespace}/{name}", id: "deleteWorkload", tag: "workloads", summary: "Delete a workload, as the caller",
			description: "A Job is deleted with its pods (propagation Background); a gang of bare pods: its pods, then its PodGroup; a pod: the pod.",
			in:          new(workloadPath), out: new(ActionResult), handle: handleDelete},
		{method: http.MethodPost, path: "/api/v1/workloads/{kind}/{namespace}/{name}/suspend", id: "suspendWorkload", tag: "workloads", summary: "Suspend a workload (a Job: spec.suspend), as the caller",
			in: new(workloadPath), out: new(ActionResult), handle: handleSuspend(true)},
		{method: http.MethodPost, path: "/api/v1/workloads/{kind}/{namespace}/{name}/resume", id: "resumeWorkload", tag: "workloads", summary: "Resume a suspended workload, as the caller",
			in: new(workloadPath), out: new(ActionResult), handle: handleSuspend(false)},
		{method: http.MethodGet, path: "/api/v1/pods/{namespace}/{name}/why", id: "why", tag: "workloads", summary: "Why a pod waits: `kubectl partita why -o json`, from the same code",
			in: new(podPath), out: new(report.WhyReport), handle: handleWhy},
		{method: http.MethodGet, path: "/api/v1/utilization", id: "utilization", tag: "utilization", summary: "Allocated share of the GPUs, and each queue's GPUs, over time",
			description: "From Prometheus when the console is pointed at one, else from the console's own samples.",
			in:          new(utilizationRequest), out: new(Utilization), handle: handleUtilization},
		{method: http.MethodGet, path: "/api/v1/policy", id: "policy", tag: "policy", summary: "The Rego policy in force, its last reload and the webhook's denials by reason",
			out: new(PolicyView), handle: handlePolicy},
		{method: http.MethodGet, path: "/api/v1/models", id: "listModels", tag: "models", summary: "Models: where each is held or fetched, and the pods that ask for it",
			description: "The Models of the namespaces where the caller may list Models: `kubectl partita models -o json`, from the same code. Pods are named only where the caller may list pods.",
			out:         new(report.ModelsReport), handle: handleModels},
	}
}

// Whoami is the caller and what they may do.
type Whoami struct {
	User UserInfo `json:"user"`
	// Mode is local or shared.
	Mode Mode `json:"mode"`
	// Can are the cluster-wide actions the caller may take:
	// createQueues, updateQueues.
	Can map[string]bool `json:"can"`
	// See says what the caller may read: gpuNodes, queues, topologies,
	// policy.
	See map[string]bool `json:"see"`
	// Namespaces are the namespaces the console knows of, with what the
	// caller may do in each.
	Namespaces []NamespaceAccess `json:"namespaces"`
	// DefaultNamespace is where the forms start.
	DefaultNamespace string `json:"defaultNamespace,omitempty"`
	// AllNamespaces is set when the caller may list pods everywhere.
	AllNamespaces bool `json:"allNamespaces"`
}

// NamespaceAccess is what the caller may do in one namespace.
type NamespaceAccess struct {
	Name string `json:"name"`
	// See: list pods (its workloads show).
	See bool `json:"see"`
	// Submit: create pods.
	Submit bool `json:"submit"`
}

func handleWhoami(c *call) (any, error) {
	v, err := c.viewer()
	if err != nil {
		return nil, err
	}
	out := Whoami{User: c.user, Mode: c.s.opts.Mode, Can: map[string]bool{}, AllNamespaces: v.Pods.All,
		See: map[string]bool{"gpuNodes": v.GPUNodes, "queues": v.Queues, "topologies": v.Topologies, "policy": v.Policy}, DefaultNamespace: c.s.opts.DefaultNamespace}
	for name, a := range map[string]Attributes{
		"createQueues": {Verb: "create", Group: groupPartita, Resource: "queues"},
		"updateQueues": {Verb: "patch", Group: groupPartita, Resource: "queues"},
	} {
		if out.Can[name], err = c.allowed(a); err != nil {
			return nil, err
		}
	}
	names := slices.Clone(c.snap.namespaces)
	if ns := c.s.opts.DefaultNamespace; ns != "" && !slices.Contains(names, ns) {
		names = append(names, ns)
	}
	for _, q := range c.snap.queues {
		for _, ns := range q.Namespaces {
			if !slices.Contains(names, ns) {
				names = append(names, ns)
			}
		}
	}
	sort.Strings(names)
	out.Namespaces = []NamespaceAccess{}
	for _, ns := range names {
		na := NamespaceAccess{Name: ns, See: v.Pods.Has(ns)}
		if na.Submit, err = c.allowed(Attributes{Verb: "create", Resource: "pods", Namespace: ns}); err != nil {
			return nil, err
		}
		if na.See || na.Submit {
			out.Namespaces = append(out.Namespaces, na)
		}
	}
	return out, nil
}

type mapRequest struct {
	Queue     string `query:"queue" json:"-" description:"keep nodes holding a slice of this queue"`
	Namespace string `query:"namespace" json:"-" description:"keep nodes holding a slice of a pod of this namespace"`
	Node      string `query:"node" json:"-" description:"keep nodes whose name contains this"`
	Model     string `query:"model" json:"-" description:"keep nodes with a GPU of this model"`
	Topology  string `query:"topology" json:"-" description:"group the nodes kept by the levels of this Topology: domains"`
}

// MapView is the workload map for one caller.
type MapView struct {
	// Version is the snapshot's: pass it as since to /api/v1/events.
	Version uint64 `json:"version"`
	// ChangedAt is when the change it shows reached the console.
	ChangedAt time.Time `json:"changedAt"`
	// TopologyKey is the node label the map groups nodes by.
	TopologyKey string    `json:"topologyKey,omitempty"`
	Nodes       []MapNode `json:"nodes"`
	// Queues, Namespaces and Models are the filters' choices.
	Queues     []string `json:"queues"`
	Namespaces []string `json:"namespaces"`
	Models     []string `json:"models"`
	// Topologies are what the nodes may be grouped by: the cluster's
	// Topologies, by name; empty for a caller who may not list them.
	Topologies []TopologyView `json:"topologies"`
	// Topology is the Topology asked for (topology=), Domains the nodes
	// grouped by its levels: each level's domains within the broader
	// level's, the nodes without a level's label in a domain of their
	// own (missing), last.
	Topology string      `json:"topology,omitempty"`
	Domains  []MapDomain `json:"domains,omitempty"`
	// Note says what the caller cannot see, if anything.
	Note string `json:"note,omitempty"`
}

// MapDomain is one domain of a Topology's level: the nodes that share the
// values of its label and of every broader level's (report.GroupByLevels,
// as kubectl partita nodes --topology groups them), with their GPUs.
type MapDomain struct {
	// Level is the level's node label.
	Level string `json:"level"`
	// Value is the label's value; "" with Missing.
	Value string `json:"value"`
	// Missing is set for the domain of the nodes without the label.
	Missing   bool `json:"missing,omitempty"`
	NodeCount int  `json:"nodeCount"`
	// GPUs counts the nodes' devices, HealthyGPUs those that take work.
	GPUs        int `json:"gpus"`
	HealthyGPUs int `json:"healthyGPUs"`
	// UsedMilli and FreeMilli sum the nodes' devices as the map shows them.
	UsedMilli int64 `json:"usedMilli"`
	FreeMilli int64 `json:"freeMilli"`
	// Domains are the next level's domains within this one.
	Domains []MapDomain `json:"domains,omitempty"`
	// Nodes name the domain's nodes at the narrowest level.
	Nodes []string `json:"nodes,omitempty"`
}

func handleMap(c *call) (any, error) {
	var in mapRequest
	if err := bind(c.r, &in); err != nil {
		return nil, err
	}
	v, err := c.viewer()
	if err != nil {
		return nil, err
	}
	if !v.GPUNodes {
		return nil, forbidden("%s may not list gpunodes.partita.dev, so the console cannot show the map", c.user.Name)
	}
	out := MapView{Version: c.snap.Version, ChangedAt: c.snap.ChangedAt, TopologyKey: c.s.opts.TopologyKey, Nodes: []MapNode{},
		Queues: []string{}, Namespaces: []string{}, Models: []string{}}
	queues, nss, models := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for i := range c.snap.nodes {
		n := filterNode(&c.snap.nodes[i], v)
		for _, g := range n.GPUs {
			models[g.Model] = true
			for _, sl := range g.Slices {
				if sl.Queue != "" {
					queues[sl.Queue] = true
				}
				nss[sl.Namespace] = true
			}
		}
		if matchNode(n, in) {
			out.Nodes = append(out.Nodes, n)
		}
	}
	out.Queues, out.Namespaces, out.Models = sortedKeys(queues), sortedKeys(nss), sortedKeys(models)
	if !v.Pods.All {
		out.Note = "slices of pods in namespaces where you may not list pods are shown as hidden, without names"
	}
	out.Topologies = []TopologyView{}
	if v.Topologies {
		out.Topologies = c.snap.topologies
	}
	if in.Topology != "" {
		if !v.Topologies {
			return nil, forbidden("%s may not list topologies.partita.dev, so the console cannot group the map by one", c.user.Name)
		}
		i := slices.IndexFunc(c.snap.topologies, func(t TopologyView) bool { return t.Name == in.Topology })
		if i < 0 {
			names := make([]string, len(c.snap.topologies))
			for j, t := range c.snap.topologies {
				names[j] = t.Name
			}
			return nil, notFound("%v", report.TopologyNotFound(in.Topology, names))
		}
		out.Topology, out.Domains = in.Topology, mapDomains(c.snap.topologies[i].Levels, out.Nodes)
	}
	return out, nil
}

// mapDomains groups nodes by levels, each domain with its nodes' GPUs as
// the map shows them.
func mapDomains(levels []string, nodes []MapNode) []MapDomain {
	byName := make(map[string]*MapNode, len(nodes))
	names := make([]string, 0, len(nodes))
	for i := range nodes {
		byName[nodes[i].Name] = &nodes[i]
		names = append(names, nodes[i].Name)
	}
	var convert func(ds []report.Domain) []MapDomain
	convert = func(ds []report.Domain) []MapDomain {
		if ds == nil {
			return nil
		}
		out := make([]MapDomain, 0, len(ds))
		for _, d := range ds {
			md := MapDomain{Level: d.Level, Value: d.Value, Missing: d.Missing, NodeCount: len(d.Nodes), Domains: convert(d.Domains)}
			for _, name := range d.Nodes {
				for _, g := range byName[name].GPUs {
					md.GPUs++
					if g.Healthy {
						md.HealthyGPUs++
					}
					md.UsedMilli += g.UsedMilli
					md.FreeMilli += g.FreeMilli
				}
			}
			if d.Domains == nil {
				md.Nodes = d.Nodes
			}
			out = append(out, md)
		}
		return out
	}
	out := convert(report.GroupByLevels(levels, names, func(n string) map[string]string { return byName[n].Labels }))
	if out == nil {
		out = []MapDomain{}
	}
	return out
}

// filterNode is n as v may see it: the slices of namespaces v may not see
// become hidden milli, and the level labels go unless v may list
// Topologies.
func filterNode(n *MapNode, v Viewer) MapNode {
	out := *n
	if !v.Topologies {
		out.Labels = nil
	}
	if v.Pods.All {
		return out
	}
	out.GPUs = make([]MapGPU, len(n.GPUs))
	for i, g := range n.GPUs {
		fg := g
		fg.Slices = make([]MapSlice, 0, len(g.Slices))
		for _, sl := range g.Slices {
			if v.Pods.Has(sl.Namespace) {
				fg.Slices = append(fg.Slices, sl)
			} else {
				fg.HiddenMilli += sl.Milli
			}
		}
		out.GPUs[i] = fg
	}
	return out
}

func matchNode(n MapNode, in mapRequest) bool {
	if in.Node != "" && !strings.Contains(n.Name, in.Node) {
		return false
	}
	match := func(f func(g MapGPU) bool) bool {
		return slices.ContainsFunc(n.GPUs, f)
	}
	if in.Model != "" && !match(func(g MapGPU) bool { return g.Model == in.Model }) {
		return false
	}
	if in.Queue != "" && !match(func(g MapGPU) bool {
		return slices.ContainsFunc(g.Slices, func(s MapSlice) bool { return s.Queue == in.Queue })
	}) {
		return false
	}
	if in.Namespace != "" && !match(func(g MapGPU) bool {
		return slices.ContainsFunc(g.Slices, func(s MapSlice) bool { return s.Namespace == in.Namespace })
	}) {
		return false
	}
	return true
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// QueuesView is the queue tree.
type QueuesView struct {
	Version uint64      `json:"version"`
	Queues  []QueueView `json:"queues"`
	// CapacityGPUs is the cluster's healthy GPUs, the bars' scale.
	CapacityGPUs float64 `json:"capacityGPUs"`
}

func handleQueues(c *call) (any, error) {
	v, err := c.viewer()
	if err != nil {
		return nil, err
	}
	if !v.Queues {
		return nil, forbidden("%s may not list queues.partita.dev", c.user.Name)
	}
	return QueuesView{Version: c.snap.Version, Queues: c.snap.queues, CapacityGPUs: milliToGPUs(c.snap.capacityMilli)}, nil
}

type workloadsRequest struct {
	Namespace string `query:"namespace" json:"-" description:"only this namespace"`
	Queue     string `query:"queue" json:"-" description:"only this queue"`
	Phase     string `query:"phase" json:"-" description:"only this phase: Waiting, Running, Succeeded, Failed, Suspended"`
}

// WorkloadsView is the list of workloads.
type WorkloadsView struct {
	Version   uint64     `json:"version"`
	Workloads []Workload `json:"workloads"`
	// Note says what the caller cannot see, if anything.
	Note string `json:"note,omitempty"`
}

func handleWorkloads(c *call) (any, error) {
	var in workloadsRequest
	if err := bind(c.r, &in); err != nil {
		return nil, err
	}
	v, err := c.viewer()
	if err != nil {
		return nil, err
	}
	out := WorkloadsView{Version: c.snap.Version, Workloads: []Workload{}}
	if !v.Pods.All {
		out.Note = "only the namespaces where you may list pods"
	}
	for _, w := range c.snap.workloads {
		if !v.Pods.Has(w.Namespace) || in.Namespace != "" && w.Namespace != in.Namespace ||
			in.Queue != "" && w.Queue != in.Queue || in.Phase != "" && string(w.Phase) != in.Phase {
			continue
		}
		cw, err := c.workloadFor(w, false)
		if err != nil {
			return nil, err
		}
		out.Workloads = append(out.Workloads, cw)
	}
	return out, nil
}

// workloadFor is w as the caller sees it: with the actions they may take
// and, when it waits, the verdict of why.
func (c *call) workloadFor(w *Workload, fresh bool) (Workload, error) {
	out := *w
	out.members = nil
	out.Actions = []string{}
	spec, ok := c.s.kind.spec(w.Kind)
	if ok {
		gr := spec.resource
		if spec.deletable {
			may := true
			for _, r := range append([]schema.GroupResource{gr}, spec.alsoDeletes...) {
				ok, err := c.allowed(Attributes{Verb: "delete", Group: r.Group, Resource: r.Resource, Namespace: w.Namespace})
				if err != nil {
					return Workload{}, err
				}
				may = may && ok
			}
			if may {
				out.Actions = append(out.Actions, ActionDelete)
			}
		}
		if spec.suspendable {
			if ok, err := c.allowed(Attributes{Verb: "patch", Group: gr.Group, Resource: gr.Resource, Namespace: w.Namespace}); err != nil {
				return Workload{}, err
			} else if ok {
				if w.Suspended {
					out.Actions = append(out.Actions, ActionResume)
				} else {
					out.Actions = append(out.Actions, ActionSuspend)
				}
			}
		}
	}
	if p := w.waitingMember(); p != nil {
		if summary, ok := c.verdict(p, fresh); ok {
			out.Verdict, out.WaitingPod = summary, p.Name
		}
	}
	return out, nil
}

// verdict is why's summary for a waiting pod, memoised in the snapshot
// unless fresh.
func (c *call) verdict(p *corev1.Pod, fresh bool) (string, bool) {
	events, err := c.allowed(Attributes{Verb: "list", Resource: "events", Namespace: p.Namespace})
	if err != nil {
		return "", false
	}
	k := verdictKey{pod: nsName{p.Namespace, p.Name}, events: events}
	if !fresh {
		if v, ok := c.snap.verdicts.Load(k); ok {
			return v.(string), true
		}
	}
	rep, err := c.why(p.Namespace, p.Name, fresh)
	if err != nil {
		return "", false
	}
	c.snap.verdicts.Store(k, rep.Summary)
	return rep.Summary, true
}

// why runs `kubectl partita why` on the snapshot, with the events of the
// pod's namespace when the caller may list them.
func (c *call) why(namespace, name string, fresh bool) (report.WhyReport, error) {
	cl := c.snap.cluster
	if ok, err := c.allowed(Attributes{Verb: "list", Resource: "events", Namespace: namespace}); err != nil {
		return report.WhyReport{}, err
	} else if ok && c.s.deps.Events != nil {
		evs, err := c.s.deps.Events.Events(c.ctx(), namespace, fresh)
		if err != nil {
			return report.WhyReport{}, err
		}
		cl.Events = evs
	}
	cl.PodGroups = podGroupsIn(cl.PodGroups, namespace)
	if ok, err := c.allowed(Attributes{Verb: "list", Group: groupPartita, Resource: "models", Namespace: namespace}); err != nil {
		return report.WhyReport{}, err
	} else if ok {
		for _, m := range c.snap.models {
			if m.Namespace == namespace {
				cl.Models = append(cl.Models, m)
			}
		}
	}
	return report.Why(&cl, namespace, name, c.s.opts.Clock.Now())
}

// podGroupsIn are the PodGroups of one namespace, which is what
// `kubectl partita why` reads.
func podGroupsIn(pgs []v1alpha1.PodGroup, ns string) []v1alpha1.PodGroup {
	var out []v1alpha1.PodGroup
	for _, pg := range pgs {
		if pg.Namespace == ns {
			out = append(out, pg)
		}
	}
	return out
}

type workloadPath struct {
	Kind      string `path:"kind" json:"-" description:"Pod, PodGroup, Job, or the kind of another controller"`
	Namespace string `path:"namespace" json:"-"`
	Name      string `path:"name" json:"-"`
}

func (p workloadPath) ref() WorkloadRef {
	return WorkloadRef{Kind: WorkloadKind(p.Kind), Namespace: p.Namespace, Name: p.Name}
}

// WorkloadDetail is one workload's page.
type WorkloadDetail struct {
	Workload Workload `json:"workload"`
	// Members are its GPU pods, in creation order.
	Members []Member `json:"members"`
	// Events are the latest events about its pods, its PodGroup and its
	// object, newest first.
	Events []EventView `json:"events"`
	// Why explains its first waiting pod, when one waits.
	Why *report.WhyReport `json:"why,omitempty"`
}

// Member is one pod of a workload.
type Member struct {
	Name  string `json:"name"`
	Phase string `json:"phase"`
	Node  string `json:"node,omitempty"`
	// Gated: the admission gate still holds it.
	Gated bool `json:"gated"`
	// Admitted is the partita.dev/Admitted condition's message, if any;
	// for a pod admitted without ever waiting (which gets no condition),
	// when it was admitted (partita.dev/admitted).
	Admitted string `json:"admitted,omitempty"`
	// RequestedMilli is what it asks for.
	RequestedMilli int64 `json:"requestedMilli"`
	// Devices are what it holds, per container.
	Devices []MemberDevices `json:"devices"`
	Created time.Time       `json:"created"`
}

// MemberDevices are one container's devices.
type MemberDevices struct {
	Container string `json:"container"`
	// Indexes are the device indexes on the pod's node.
	Indexes []int32 `json:"indexes"`
	// Milli is the share of each.
	Milli int64 `json:"milli"`
}

// EventView is one event, in brief.
type EventView struct {
	Object  string    `json:"object"`
	Type    string    `json:"type"`
	Reason  string    `json:"reason"`
	Message string    `json:"message"`
	Source  string    `json:"source"`
	Count   int32     `json:"count"`
	Time    time.Time `json:"time"`
}

// maxEvents bounds a workload page's events.
const maxEvents = 50

func handleWorkload(c *call) (any, error) {
	var in workloadPath
	if err := bind(c.r, &in); err != nil {
		return nil, err
	}
	w, err := c.visibleWorkload(in.ref())
	if err != nil {
		return nil, err
	}
	cw, err := c.workloadFor(w, true)
	if err != nil {
		return nil, err
	}
	out := WorkloadDetail{Workload: cw, Members: []Member{}, Events: []EventView{}}
	ledger := c.snap.cluster.Ledger
	maxMiB := ledger.MaxDeviceMemoryMiB()
	objects := map[string]bool{}
	for _, p := range w.members {
		m := Member{Name: p.Name, Phase: string(orPending(p.Status.Phase)), Node: p.Spec.NodeName, Gated: hasAdmissionGate(p),
			Created: p.CreationTimestamp.Time, Devices: []MemberDevices{}}
		for _, cond := range p.Status.Conditions {
			if cond.Type == v1alpha1.PodConditionAdmitted {
				m.Admitted = cond.Message
			}
		}
		if at := p.Annotations[v1alpha1.AnnotationAdmitted]; m.Admitted == "" && at != "" {
			m.Admitted = "admitted at " + at
		}
		if req, _ := gpu.ParsePod(p); req != nil {
			for _, ct := range req.Containers {
				q := ct.MilliResource(maxMiB)
				m.RequestedMilli += q.Value()
			}
		}
		if a, ok := ledger.Allocation(p.UID); ok {
			for _, ca := range a.Containers {
				m.Devices = append(m.Devices, MemberDevices{Container: ca.Container, Indexes: ca.DeviceIndexes, Milli: ca.Milli})
			}
		}
		out.Members = append(out.Members, m)
		objects["Pod/"+p.Name] = true
	}
	if w.Gang != "" {
		objects["PodGroup/"+w.Gang] = true
	}
	objects[string(w.Kind)+"/"+w.Name] = true
	if p := w.waitingMember(); p != nil {
		rep, err := c.why(p.Namespace, p.Name, false)
		if err == nil {
			out.Why = &rep
		}
	}
	if ok, err := c.allowed(Attributes{Verb: "list", Resource: "events", Namespace: w.Namespace}); err != nil {
		return nil, err
	} else if ok && c.s.deps.Events != nil {
		evs, err := c.s.deps.Events.Events(c.ctx(), w.Namespace, false)
		if err != nil {
			return nil, err
		}
		for i := range evs {
			e := &evs[i]
			if !objects[e.InvolvedObject.Kind+"/"+e.InvolvedObject.Name] {
				continue
			}
			out.Events = append(out.Events, eventView(e))
		}
		slices.SortFunc(out.Events, func(a, b EventView) int { return b.Time.Compare(a.Time) })
		if len(out.Events) > maxEvents {
			out.Events = out.Events[:maxEvents]
		}
	}
	return out, nil
}

func eventView(e *corev1.Event) EventView {
	src := e.ReportingController
	if src == "" {
		src = e.Source.Component
	}
	t := e.LastTimestamp.Time
	switch {
	case e.Series != nil && !e.Series.LastObservedTime.IsZero():
		t = e.Series.LastObservedTime.Time
	case t.IsZero() && !e.EventTime.IsZero():
		t = e.EventTime.Time
	case t.IsZero():
		t = e.CreationTimestamp.Time
	}
	n := max(e.Count, 1)
	if e.Series != nil && e.Series.Count > 0 {
		n = e.Series.Count
	}
	return EventView{Object: e.InvolvedObject.Kind + "/" + e.InvolvedObject.Name, Type: e.Type, Reason: e.Reason,
		Message: strings.TrimSpace(e.Message), Source: src, Count: n, Time: t}
}

// visibleWorkload finds a workload the caller may see; one they may not
// is not found, as if it did not exist.
func (c *call) visibleWorkload(ref WorkloadRef) (*Workload, error) {
	v, err := c.viewer()
	if err != nil {
		return nil, err
	}
	w := c.snap.workloadIndex[ref]
	if w == nil || !v.Pods.Has(ref.Namespace) {
		return nil, notFound("no workload %s (or you may not list pods in %s)", ref, ref.Namespace)
	}
	return w, nil
}

type podPath struct {
	Namespace string `path:"namespace" json:"-"`
	Name      string `path:"name" json:"-"`
}

func handleWhy(c *call) (any, error) {
	var in podPath
	if err := bind(c.r, &in); err != nil {
		return nil, err
	}
	v, err := c.viewer()
	if err != nil {
		return nil, err
	}
	if !v.Pods.Has(in.Namespace) {
		if ok, err := c.allowed(Attributes{Verb: "get", Resource: "pods", Namespace: in.Namespace, Name: in.Name}); err != nil || !ok {
			return nil, notFound("pod %s/%s: pod not found (or you may not read pods in %s)", in.Namespace, in.Name, in.Namespace)
		}
	}
	rep, err := c.why(in.Namespace, in.Name, true)
	switch {
	case errors.Is(err, report.ErrPodNotFound):
		return nil, notFound("%v", err)
	case errors.Is(err, report.ErrNotGPUPod):
		return nil, errorf(http.StatusUnprocessableEntity, "NotGPUPod", "%v", err)
	case err != nil:
		return nil, err
	}
	return rep, nil
}

type utilizationRequest struct {
	Range string `query:"range" json:"-" description:"how far back: a duration such as 1h (default), 6h, 24h, 7d"`
}

func handleUtilization(c *call) (any, error) {
	var in utilizationRequest
	if err := bind(c.r, &in); err != nil {
		return nil, err
	}
	d := time.Hour
	if in.Range != "" {
		var err error
		if d, err = parseRange(in.Range); err != nil {
			return nil, badRequest("range=%q: %v", in.Range, err)
		}
	}
	v, err := c.viewer()
	if err != nil {
		return nil, err
	}
	if !v.GPUNodes {
		return nil, forbidden("%s may not list gpunodes.partita.dev", c.user.Name)
	}
	keep := func(string) bool { return v.Queues }
	now := c.s.opts.Clock.Now()
	if p := c.s.deps.Prometheus; p != nil {
		step := max(d/240, 15*time.Second).Truncate(time.Second)
		return p.Utilization(c.ctx(), now.Add(-d), now, step, keep)
	}
	if c.s.deps.History == nil {
		return nil, errorf(http.StatusNotImplemented, "NotImplemented", "no history: the console keeps none and knows no Prometheus (--prometheus-url)")
	}
	return c.s.deps.History.Series(now.Add(-d), now, keep), nil
}

// parseRange reads a duration, with d for days.
func parseRange(s string) (time.Duration, error) {
	if n, ok := strings.CutSuffix(s, "d"); ok {
		d, err := time.ParseDuration(n + "h")
		return d * 24, err
	}
	d, err := time.ParseDuration(s)
	if err == nil && (d <= 0 || d > 31*24*time.Hour) {
		return 0, errors.New("want more than 0 and at most 31d")
	}
	return d, err
}

func handlePolicy(c *call) (any, error) {
	v, err := c.viewer()
	if err != nil {
		return nil, err
	}
	if !v.Policy {
		return nil, forbidden("%s may not list configmaps in %s, where the policy lives", c.user.Name, c.s.opts.PartitaNamespace)
	}
	out := c.snap.policy
	out.ConfigMaps = slices.Clone(out.ConfigMaps)
	if r := c.s.deps.Reader; r != nil {
		if last, err := lastReload(c.ctx(), r, c.s.opts.PartitaNamespace); err == nil {
			out.LastReload = last
		}
	}
	now := c.s.opts.Clock.Now()
	switch {
	case c.s.deps.Prometheus != nil:
		out.DenialsSource = "prometheus, last 24h"
		if out.Denials, err = c.s.deps.Prometheus.Denials(c.ctx(), now); err != nil {
			out.Denials, out.DenialsError = []DenialCount{}, err.Error()
		}
	case c.s.deps.Webhook != nil:
		out.DenialsSource = "the webhook's metrics, since each replica started"
		counts, err := c.s.deps.Webhook.Denials(c.ctx())
		out.Denials = counts
		if out.Denials == nil {
			out.Denials = []DenialCount{}
		}
		if err != nil {
			out.DenialsError = err.Error() + "; point the console at Prometheus (--prometheus-url) for the counts"
		}
	default:
		out.DenialsError = "no source for the counts: point the console at Prometheus (--prometheus-url)"
	}
	return out, nil
}

func orPending(p corev1.PodPhase) corev1.PodPhase {
	if p == "" {
		return corev1.PodPending
	}
	return p
}

func hasAdmissionGate(p *corev1.Pod) bool {
	return slices.ContainsFunc(p.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == v1alpha1.SchedulingGateAdmission })
}

// policyReasons are the events the webhook writes on policy ConfigMaps.
func policyReasons() []string { return []string{policy.ReasonPolicyLoaded, policy.ReasonPolicyRefused} }

// handleModels lists the Models the caller may list, with the pods that
// ask for them where the caller may list pods.
func handleModels(c *call) (any, error) {
	v, err := c.viewer()
	if err != nil {
		return nil, err
	}
	var models []v1alpha1.Model
	may := map[string]bool{}
	for _, m := range c.snap.models {
		ok, seen := may[m.Namespace]
		if !seen {
			if ok, err = c.allowed(Attributes{Verb: "list", Group: groupPartita, Resource: "models", Namespace: m.Namespace}); err != nil {
				return nil, err
			}
			may[m.Namespace] = ok
		}
		if ok {
			models = append(models, m)
		}
	}
	var pods []corev1.Pod
	for _, p := range c.snap.modelPods {
		if may[p.Namespace] && v.Pods.Has(p.Namespace) {
			pods = append(pods, p)
		}
	}
	return report.Models(models, pods), nil
}
