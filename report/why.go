package report

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/apimachinery/pkg/util/validation/field"
	resourcehelper "k8s.io/component-helpers/resource"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/dra"
	"github.com/partita-dev/partita/gpu"
)

// AdmitterComponent is the name the admission loop reports its events
// under (events.k8s.io reportingController, core/v1 source.component). It
// must match the admitter's event recorder.
const AdmitterComponent = "partita-admitter"

// reasonFailedScheduling is kube-scheduler's event reason for a pod it
// could not place.
const reasonFailedScheduling = "FailedScheduling"

// Status says how a finding bears on the pod's wait.
type Status string

// Statuses.
const (
	// StatusOK: this check does not hold the pod.
	StatusOK Status = "ok"
	// StatusBlocking: this holds the pod.
	StatusBlocking Status = "blocking"
	// StatusInfo: context that neither holds nor frees it.
	StatusInfo Status = "info"
)

// Checks, in the order Why runs them.
const (
	CheckRequest   = "request"
	CheckBound     = "bound"
	CheckGates     = "gates"
	CheckGang      = "gang"
	CheckQueue     = "queue"
	CheckFairShare = "fair-share"
	CheckEvents    = "events"
	CheckFit       = "fit"
	// CheckModels: a bound pod that asks for models waits for its node's
	// cache to hold them (partita.dev/model).
	CheckModels = "models"
)

// Finding is what one check found, in words and in numbers.
type Finding struct {
	// Check is one of the Check constants.
	Check string `json:"check"`
	// Status is ok, blocking or info.
	Status Status `json:"status"`
	// Message says what was found, with the numbers, in words.
	Message string `json:"message"`
	// Numbers are the message's numbers, by name; GPU amounts are in GPUs.
	Numbers map[string]float64 `json:"numbers,omitempty"`
}

// WhyReport explains why a pod waits.
type WhyReport struct {
	// Namespace is the pod's namespace.
	Namespace string `json:"namespace"`
	// Pod is the pod's name.
	Pod string `json:"pod"`
	// Workload names the workload the pod belongs to, "JobSet
	// team-a/llama-ft" or "PodGroup team-a/train-1"; empty for a single
	// pod (v1alpha1.WorkloadOf).
	Workload string `json:"workload,omitempty"`
	// Waiting is false for a pod that is bound or has finished.
	Waiting bool `json:"waiting"`
	// Summary is the answer in one sentence: the first blocking finding.
	Summary string `json:"summary"`
	// Findings are the checks' results, in order.
	Findings []Finding `json:"findings"`
}

// ErrPodNotFound says the pod does not exist.
var ErrPodNotFound = errors.New("pod not found")

// ErrNotGPUPod says the pod asks for no GPU, so Partita has nothing to say.
var ErrNotGPUPod = errors.New("pod asks for no GPU")

// WhyOptions tune Why.
type WhyOptions struct {
	// AgentHeartbeatTimeout is how old a GPUNode's heartbeat may be before
	// the fit check calls its agent silent and its node closed to new pods,
	// as the extender's --agent-heartbeat-timeout does;
	// gpu.DefaultAgentHeartbeatTimeout when zero. Unlike the extender, which
	// times the silence on its own clock, ctl compares the heartbeat with
	// now.
	AgentHeartbeatTimeout time.Duration
	// GPUClasses are the DeviceClasses whose devices are GPUs (the
	// extender's --gpu-device-classes); the Cluster's when nil.
	GPUClasses dra.GPUClasses
}

// Why explains why the pod namespace/name waits, from c (which must hold
// the GPUNodes, Nodes, Queues, pods, and the PodGroups and Events of the
// pod's namespace). now dates the events.
func Why(c *Cluster, namespace, name string, now time.Time) (WhyReport, error) {
	return WhyWithOptions(c, namespace, name, now, WhyOptions{})
}

// WhyWithOptions is Why with options.
func WhyWithOptions(c *Cluster, namespace, name string, now time.Time, opts WhyOptions) (WhyReport, error) {
	if opts.AgentHeartbeatTimeout <= 0 {
		opts.AgentHeartbeatTimeout = gpu.DefaultAgentHeartbeatTimeout
	}
	if opts.GPUClasses != nil {
		// A copy: callers share c between questions.
		cc := *c
		cc.GPUClasses = opts.GPUClasses
		c = &cc
	}
	i := slices.IndexFunc(c.Pods, func(p corev1.Pod) bool { return p.Namespace == namespace && p.Name == name })
	if i < 0 {
		return WhyReport{}, fmt.Errorf("pod %s/%s: %w", namespace, name, ErrPodNotFound)
	}
	pod := &c.Pods[i]
	req, claims, errs := readPod(c, pod)
	if req == nil && len(errs) == 0 && len(v1alpha1.ModelNamesOf(pod.Annotations)) > 0 {
		return whyModelsOnly(c, pod), nil
	}
	if req == nil && len(errs) == 0 {
		return WhyReport{}, fmt.Errorf("pod %s/%s: %w (no partita.dev/gpu-* annotation, Run:ai, HAMi or nvidia.com/gpu request, no ResourceClaim of a GPU DeviceClass): Partita does not schedule it; 'kubectl describe pod' shows why it waits", namespace, name, ErrNotGPUPod)
	}
	w := &why{c: c, pod: pod, req: req, claims: claims, now: now, ledger: c.ledger(), heartbeatTimeout: opts.AgentHeartbeatTimeout}
	r := WhyReport{Namespace: namespace, Pod: name, Waiting: true}
	subject := fmt.Sprintf("pod %s/%s", namespace, name)
	if kind, wname, _ := v1alpha1.WorkloadOf(pod); kind != "" {
		r.Workload = kind + " " + namespace + "/" + wname
		subject = fmt.Sprintf("%s (pod %s)", r.Workload, name)
	}
	if len(errs) > 0 {
		w.add(CheckRequest, StatusBlocking, nil, "the GPU request is invalid (the webhook should have refused it): %v", errs.ToAggregate())
	} else {
		what := describeRequest(req)
		if claims != nil {
			unit := "GPUs"
			if claims.Milli <= gpu.MilliPerGPU {
				unit = "GPU"
			}
			what = fmt.Sprintf("%s %s through ResourceClaims (%s)", gpu.FormatMilli(claims.Milli), unit, claims.Describe())
		}
		w.add(CheckRequest, StatusOK, map[string]float64{"gpus": gpus(w.demand(pod, req))}, "asks for %s", what)
	}
	if done := w.bound(); done != "" {
		if f, waiting := w.models(); waiting {
			r.Summary = fmt.Sprintf("%s waits: %s", subject, f)
			r.Findings = w.findings
			return r, nil
		}
		r.Waiting = false
		r.Summary = fmt.Sprintf("%s is not waiting: %s", subject, done)
		r.Findings = w.findings
		return r, nil
	}
	w.gates()
	w.gang()
	w.queue()
	w.events()
	switch {
	case claims != nil:
		w.otherClaimsFit()
	case req != nil && usesPartitaClaims(pod):
		w.claimFit()
	case req != nil:
		w.fit()
	}
	r.Findings = w.findings
	r.Summary = fmt.Sprintf("%s waits, but no check here holds it: kube-scheduler should place it soon ('kubectl describe pod' shows its own reasons)", subject)
	if f, ok := headline(w.findings); ok {
		r.Summary = fmt.Sprintf("%s waits: %s", subject, f.Message)
	}
	return r, nil
}

// headline is the finding that answers "why" in one line: the first
// blocking one of ctl's own checks, which read the cluster now, else the
// first blocking event, which is a component's word from some time ago.
//
// The admission gate itself is only the symptom: a check that says why the
// loop holds the pod comes before it.
func headline(fs []Finding) (Finding, bool) {
	var event, gate *Finding
	for i, f := range fs {
		if f.Status != StatusBlocking {
			continue
		}
		switch {
		case f.Check == CheckEvents:
			if event == nil {
				event = &fs[i]
			}
		case f.Check == CheckGates && strings.HasPrefix(f.Message, admissionGateFinding):
			if gate == nil {
				gate = &fs[i]
			}
		default:
			return f, true
		}
	}
	for _, f := range []*Finding{event, gate} {
		if f != nil {
			return *f, true
		}
	}
	return Finding{}, false
}

// admissionGateFinding starts the finding of a pod the admission loop still
// holds.
const admissionGateFinding = "waiting for the admission loop"

// why holds one explanation in progress.
type why struct {
	c        *Cluster
	pod      *corev1.Pod
	req      *gpu.PodRequest
	now      time.Time
	ledger   *gpu.Ledger
	group    *v1alpha1.PodGroup
	members  []*corev1.Pod // the gang's unfinished pods, this one included
	findings []Finding
	// heartbeatTimeout is the age from which a GPUNode's agent counts as
	// silent.
	heartbeatTimeout time.Duration
	// claims is what the pod asks for through ResourceClaims when it asks
	// for GPUs that way only; nil otherwise.
	claims *dra.Demand
}

// readPod is gpu.ParsePod, or for a pod that asks for GPUs through
// ResourceClaims of the GPU classes only, a request with its queue
// and gang and no containers, and its claims' demand.
func readPod(c *Cluster, pod *corev1.Pod) (*gpu.PodRequest, *dra.Demand, field.ErrorList) {
	req, errs := gpu.ParsePod(pod)
	if req != nil || len(errs) > 0 || !dra.HasClaims(pod) {
		return req, nil, errs
	}
	d := dra.PodDemand(pod, c, c.gpuClasses(), nil)
	if !d.GPU() {
		return nil, nil, nil
	}
	q, g, errs := gpu.QueueAndGroup(pod)
	if len(errs) > 0 {
		return nil, nil, errs
	}
	return &gpu.PodRequest{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID, Dialect: gpu.DialectClaims, Queue: q, PodGroup: g}, &d, nil
}

// silentAgent is the silence of node's agent now, nil while it reports.
func (w *why) silentAgent(node string) *gpu.AgentSilentError {
	hb, ok := w.ledger.Heartbeats()[node]
	if !ok || w.now.Sub(hb) <= w.heartbeatTimeout {
		return nil
	}
	return &gpu.AgentSilentError{Node: node, LastHeartbeat: hb, For: w.now.Sub(hb)}
}

func (w *why) add(check string, s Status, numbers map[string]float64, format string, args ...any) {
	w.findings = append(w.findings, Finding{Check: check, Status: s, Message: fmt.Sprintf(format, args...), Numbers: numbers})
}

// demand is what the pod adds to its queue's allocation, in milli-GPUs:
// partita.dev/gpu-milli as the webhook writes it, with a memory request
// estimated against the largest device, as kube-scheduler sees it.
func (w *why) demand(pod *corev1.Pod, req *gpu.PodRequest) int64 {
	if req == nil {
		return 0
	}
	if req.Dialect == gpu.DialectClaims {
		d := dra.PodDemand(pod, w.c, w.c.gpuClasses(), nil)
		return d.Milli
	}
	var m int64
	for _, c := range req.Containers {
		q := c.MilliResource(w.ledger.MaxDeviceMemoryMiB())
		m += q.Value()
	}
	return m
}

// bound reports a pod that is bound or finished and returns the reason it
// is not waiting, or "".
func (w *why) bound() string {
	p := w.pod
	if finished(p) {
		w.add(CheckBound, StatusOK, nil, "the pod has finished (%s)", p.Status.Phase)
		return fmt.Sprintf("it has finished (%s)", p.Status.Phase)
	}
	if p.Spec.NodeName == "" {
		return ""
	}
	if usesPartitaClaims(p) {
		where := fmt.Sprintf("bound to %s, its claims hold %s (phase %s)", p.Spec.NodeName, describeShares(w.claimsOf()), orPending(p.Status.Phase))
		w.add(CheckBound, StatusOK, nil, "%s", where)
		return "it is " + where
	}
	var inv *gpu.NodeInventory
	if n, ok := w.ledger.Node(p.Spec.NodeName); ok {
		inv = n
	}
	a, err := gpu.AllocationFromPod(p, inv)
	if err != nil {
		w.add(CheckBound, StatusBlocking, nil, "bound to %s, but its devices cannot be read: %v", p.Spec.NodeName, err)
		return fmt.Sprintf("it is bound to %s, but its devices cannot be read", p.Spec.NodeName)
	}
	where := fmt.Sprintf("bound to %s, %s (phase %s)", p.Spec.NodeName, describeAllocation(a), orPending(p.Status.Phase))
	w.add(CheckBound, StatusOK, nil, "%s", where)
	return "it is " + where
}

func orPending(p corev1.PodPhase) corev1.PodPhase {
	if p == "" {
		return corev1.PodPending
	}
	return p
}

func (w *why) gates() {
	var others []string
	admission := false
	for _, g := range w.pod.Spec.SchedulingGates {
		if g.Name == v1alpha1.SchedulingGateAdmission {
			admission = true
		} else {
			others = append(others, g.Name)
		}
	}
	switch {
	case admission:
		w.add(CheckGates, StatusBlocking, nil, "%s: the scheduling gate %s is still on (the checks below say why it is not admitted)", admissionGateFinding, v1alpha1.SchedulingGateAdmission)
	case len(others) == 0:
		msg := "no scheduling gates: kube-scheduler may place it"
		if at := w.pod.Annotations[v1alpha1.AnnotationAdmitted]; at != "" {
			msg += " (the admission loop admitted it at " + at + ")"
		}
		w.add(CheckGates, StatusOK, nil, "%s", msg)
	}
	if len(others) > 0 {
		w.add(CheckGates, StatusBlocking, nil, "held by scheduling gates that are not Partita's: %s (whoever added them must remove them)", strings.Join(others, ", "))
	}
}

func (w *why) gang() {
	group := ""
	if w.req != nil {
		group = w.req.PodGroup
	}
	kind, wname, mapped := v1alpha1.WorkloadOf(w.pod)
	if group == "" && mapped == "" {
		w.add(CheckGang, StatusOK, nil, "not in a gang: it is admitted on its own")
		return
	}
	if group == "" {
		group = mapped
	} else {
		mapped = ""
	}
	ns := w.pod.Namespace
	for i := range w.c.PodGroups {
		pg := &w.c.PodGroups[i]
		// The PodGroup the loop keeps for a mapped workload is that
		// workload's alone, and an explicit gang's never is.
		if pg.Namespace == ns && pg.Name == group && (mapped != "") == (pg.Labels[v1alpha1.LabelWorkloadKind] != "") {
			w.group = pg
		}
	}
	for i := range w.c.Pods {
		p := &w.c.Pods[i]
		if p.Namespace != ns || finished(p) {
			continue
		}
		if mapped != "" {
			if _, _, g := v1alpha1.WorkloadOf(p); g == mapped && p.Annotations[v1alpha1.AnnotationWorkloadPodGroup] == mapped {
				w.members = append(w.members, p)
			}
			continue
		}
		if r, _, _ := readPod(w.c, p); r != nil && r.PodGroup == group {
			w.members = append(w.members, p)
		}
	}
	n := len(w.members)
	minMember, source := int32(0), ""
	switch {
	case mapped != "" && w.group != nil:
		minMember, source = w.group.Spec.MinMember, fmt.Sprintf("%s %s/%s, grouped by the workload map; status in PodGroup %s", kind, ns, wname, group)
	case mapped != "":
		w.add(CheckGang, StatusInfo, map[string]float64{"members": float64(n)},
			"member of %s %s/%s, grouped by the workload map; its PodGroup %s/%s does not exist yet (the admission loop creates it)", kind, ns, wname, ns, group)
		return
	case w.group != nil:
		minMember, source = w.group.Spec.MinMember, "PodGroup "+group
	case w.pod.Annotations[v1alpha1.AnnotationMinMember] != "":
		if _, err := fmt.Sscan(w.pod.Annotations[v1alpha1.AnnotationMinMember], &minMember); err != nil {
			w.add(CheckGang, StatusBlocking, nil, "gang %s has no PodGroup and its %s %q is not a number", group, v1alpha1.AnnotationMinMember, w.pod.Annotations[v1alpha1.AnnotationMinMember])
			return
		}
		source = "gang " + group + ", " + v1alpha1.AnnotationMinMember
	default:
		w.add(CheckGang, StatusInfo, map[string]float64{"members": float64(n)},
			"gang %s: %d pods name it, but there is no PodGroup %s/%s and no %s annotation, so its size is unknown", group, n, ns, group, v1alpha1.AnnotationMinMember)
		return
	}
	nums := map[string]float64{"members": float64(n), "minMember": float64(minMember)}
	if int32(n) < minMember {
		w.add(CheckGang, StatusBlocking, nums, "gang incomplete: %d of %d pods exist (%s, minMember %d); the gang starts only when all exist", n, minMember, source, minMember)
	} else {
		w.add(CheckGang, StatusOK, nums, "gang complete: %d of %d pods exist (%s)", n, minMember, source)
	}
	if pg := w.group; pg != nil && pg.Status.Phase != "" {
		s := StatusInfo
		if pg.Status.Phase == v1alpha1.PodGroupFailed {
			s = StatusBlocking
		}
		msg := fmt.Sprintf("PodGroup %s is %s", group, pg.Status.Phase)
		if pg.Status.Reason != "" {
			msg += ": " + pg.Status.Reason
		}
		w.add(CheckGang, s, map[string]float64{"admitted": float64(pg.Status.Admitted), "running": float64(pg.Status.Running)},
			"%s (admitted %d, running %d)", msg, pg.Status.Admitted, pg.Status.Running)
	}
}

// gangDemand is what the pod's workload still asks of its queue: the
// pod's own, or for a gang, the sum of its members the admission loop has
// not admitted yet (an admitted member already counts in the queue's
// allocation).
func (w *why) gangDemand() (milli int64, pods int) {
	if len(w.members) == 0 {
		if !hasAdmissionGate(w.pod) {
			return 0, 0
		}
		return w.demand(w.pod, w.req), 1
	}
	for _, p := range w.members {
		if !hasAdmissionGate(p) {
			continue
		}
		r, _, _ := readPod(w.c, p)
		milli += w.demand(p, r)
		pods++
	}
	return milli, pods
}

// resourceDemand is the CPU (milli) and memory (bytes) the pod, or its
// gang's gated members, request: what the queue's CPU and memory limits
// are checked against.
func (w *why) resourceDemand() (cpuMilli, memory int64) {
	pods := []*corev1.Pod{w.pod}
	if len(w.members) > 0 {
		pods = w.members
	}
	for _, p := range pods {
		if !hasAdmissionGate(p) {
			continue
		}
		reqs := resourcehelper.PodRequests(p, resourcehelper.PodResourcesOptions{})
		cpuMilli += reqs.Cpu().MilliValue()
		memory += reqs.Memory().Value()
	}
	return cpuMilli, memory
}

func (w *why) queue() {
	name := ""
	if w.req != nil {
		name = w.req.Queue
	}
	if name == "" && w.group != nil {
		name = w.group.Spec.Queue
	}
	if g := w.group; g != nil && g.Labels[v1alpha1.LabelWorkloadKind] != "" && g.Spec.Queue != "" && (name == "" || name == v1alpha1.DefaultQueueName) {
		// The workload map's rule named the queue, through the PodGroup.
		name = g.Spec.Queue
	}
	if name == "" {
		w.add(CheckQueue, StatusInfo, nil, "names no queue (label %s), and neither does its PodGroup", v1alpha1.LabelQueue)
		return
	}
	byName := map[string]*v1alpha1.Queue{}
	var children []string
	for i := range w.c.Queues {
		q := &w.c.Queues[i]
		byName[q.Name] = q
		if q.Spec.Parent == name {
			children = append(children, q.Name)
		}
	}
	q := byName[name]
	if q == nil {
		w.add(CheckQueue, StatusBlocking, nil, "queue %s does not exist", name)
		return
	}
	if len(children) > 0 {
		sort.Strings(children)
		w.add(CheckQueue, StatusBlocking, nil, "queue %s is not a leaf (children: %s): only leaf queues take work", name, strings.Join(children, ", "))
		return
	}
	need, pods := w.gangDemand()
	if pods == 0 {
		// Let go by the admission loop (or never gated): its GPUs are in
		// the queue's allocation already, and no limit holds it any more.
		w.add(CheckQueue, StatusOK, nil, "queue %s counts it already: it is past the admission gate, so its GPUs are in the queue's allocation", name)
		return
	}
	what := "the pod needs"
	if pods > 1 || len(w.members) > 0 {
		what = fmt.Sprintf("its gang needs (%d pods not bound)", pods)
	}
	// The queue and every ancestor cap it; the first one at its limit holds it.
	blocked, limited := false, false
	seen := map[string]bool{}
	for cur := q; cur != nil && !seen[cur.Name]; cur = byName[cur.Spec.Parent] {
		seen[cur.Name] = true
		r := queueReport(cur, 0, false)
		if r.LimitMilli == Unlimited {
			continue
		}
		limited = true
		nums := map[string]float64{"limitGPUs": gpus(r.LimitMilli), "neededGPUs": gpus(need)}
		if r.AllocatedMilli == nil {
			w.add(CheckQueue, StatusInfo, nums, "queue %s has a limit of %s GPUs, but the admission loop has not reported its allocation yet; %s %s",
				cur.Name, gpu.FormatMilli(r.LimitMilli), what, gpu.FormatMilli(need))
			continue
		}
		alloc := *r.AllocatedMilli
		nums["allocatedGPUs"] = gpus(alloc)
		switch {
		case alloc >= r.LimitMilli:
			w.add(CheckQueue, StatusBlocking, nums, "queue %s is at its limit: %s of %s GPUs allocated; %s %s more",
				cur.Name, gpu.FormatMilli(alloc), gpu.FormatMilli(r.LimitMilli), what, gpu.FormatMilli(need))
			blocked = true
		case alloc+need > r.LimitMilli:
			w.add(CheckQueue, StatusBlocking, nums, "queue %s would pass its limit: %s of %s GPUs allocated; %s %s",
				cur.Name, gpu.FormatMilli(alloc), gpu.FormatMilli(r.LimitMilli), what, gpu.FormatMilli(need))
			blocked = true
		}
	}
	// CPU and memory limits hold the same way, on what the pods request.
	cpuNeed, memNeed := w.resourceDemand()
	seen = map[string]bool{}
	for cur := q; cur != nil && !seen[cur.Name]; cur = byName[cur.Spec.Parent] {
		seen[cur.Name] = true
		r := queueReport(cur, 0, false)
		for _, res := range []struct {
			name   string
			rr     ResourceReport
			need   int64
			format func(int64) string
		}{
			{"CPU", r.CPU, cpuNeed, func(m int64) string {
				if m == 1000 {
					return "1 CPU"
				}
				return gpu.FormatMilli(m) + " CPUs"
			}},
			{"memory", r.Memory, memNeed, func(b int64) string { return resource.NewQuantity(b, resource.BinarySI).String() }},
		} {
			if res.rr.Limit == Unlimited || res.rr.Allocated == nil || res.need == 0 || *res.rr.Allocated+res.need <= res.rr.Limit {
				continue
			}
			w.add(CheckQueue, StatusBlocking, nil, "queue %s would pass its %s limit: %s of %s allocated; %s %s",
				cur.Name, res.name, res.format(*res.rr.Allocated), res.format(res.rr.Limit), what, res.format(res.need))
			blocked = true
		}
	}
	leaf := queueReport(q, 0, true)
	if !blocked {
		nums := map[string]float64{"neededGPUs": gpus(need), "pendingWorkloads": float64(leaf.PendingWorkloads)}
		limit := "no limit"
		if leaf.LimitMilli != Unlimited {
			limit = "limit " + gpu.FormatMilli(leaf.LimitMilli)
			nums["limitGPUs"] = gpus(leaf.LimitMilli)
		}
		if limited {
			limit += " (and its parents' limits)"
		}
		alloc := "allocation not reported yet"
		if leaf.AllocatedMilli != nil {
			alloc = gpu.FormatMilli(*leaf.AllocatedMilli) + " GPUs allocated"
			nums["allocatedGPUs"] = gpus(*leaf.AllocatedMilli)
		}
		w.add(CheckQueue, StatusOK, nums, "queue %s has room: %s, %s; %s %s; %d workloads pending in it",
			name, alloc, limit, what, gpu.FormatMilli(need), leaf.PendingWorkloads)
	}
	w.fairShare(leaf, need, what)
}

func (w *why) fairShare(q QueueReport, need int64, what string) {
	quota := "all"
	if q.QuotaMilli != Unlimited {
		quota = gpu.FormatMilli(q.QuotaMilli)
	}
	if q.FairShareMilli == nil || q.AllocatedMilli == nil {
		w.add(CheckFairShare, StatusInfo, nil, "queue %s (quota %s): the admission loop has not reported its fair share and allocation yet", q.Name, quota)
		return
	}
	fs, alloc := *q.FairShareMilli, *q.AllocatedMilli
	nums := map[string]float64{"fairShareGPUs": gpus(fs), "allocatedGPUs": gpus(alloc), "neededGPUs": gpus(need)}
	history := w.historyNote(q, nums)
	if alloc+need <= fs {
		w.add(CheckFairShare, StatusOK, nums, "queue %s stays within its fair share: %s allocated + %s needed <= fair share %s GPUs (quota %s)%s",
			q.Name, gpu.FormatMilli(alloc), gpu.FormatMilli(need), gpu.FormatMilli(fs), quota, history)
		return
	}
	w.add(CheckFairShare, StatusInfo, nums, "queue %s would go over its fair share: %s allocated + %s needed > fair share %s GPUs (quota %s); it gets only GPUs other queues leave idle, and they may be reclaimed%s",
		q.Name, gpu.FormatMilli(alloc), gpu.FormatMilli(need), gpu.FormatMilli(fs), quota, history)
}

// historyNote says, when the queue's past usage changed its fair share
// (time-based fair share), what the share would be without it and what the
// queue used, against the sibling that used least: "; history decided:
// without usage its fair share would be 5 GPUs; it used 410 GPU-hours
// (sliding 168h window, half-life 24h) against 12 for queue team-b". It
// adds the numbers to nums. "" when usage is not reported or changed
// nothing.
func (w *why) historyNote(q QueueReport, nums map[string]float64) string {
	if !q.HistoryDecided() {
		return ""
	}
	without := *q.FairShareWithoutUsageMilli
	nums["fairShareWithoutUsageGPUs"] = gpus(without)
	note := fmt.Sprintf("; history decided: without usage its fair share would be %s GPUs", gpu.FormatMilli(without))
	if q.UsageGPUHours == nil {
		return note
	}
	used := *q.UsageGPUHours
	nums["usageGPUHours"] = used
	note += fmt.Sprintf("; it used %s GPU-hours (%s)", gpu.FormatHours(used), q.UsageWindow)
	// Fair share divides among siblings: the one that used least is the
	// one history favours most.
	var least *QueueReport
	for i := range w.c.Queues {
		s := &w.c.Queues[i]
		if s.Name == q.Name || s.Spec.Parent != q.Parent {
			continue
		}
		r := queueReport(s, 0, false)
		if r.UsageGPUHours == nil {
			continue
		}
		if least == nil || *r.UsageGPUHours < *least.UsageGPUHours || *r.UsageGPUHours == *least.UsageGPUHours && r.Name < least.Name {
			least = &r
		}
	}
	if least != nil {
		nums["siblingUsageGPUHours"] = *least.UsageGPUHours
		note += fmt.Sprintf(" against %s for queue %s", gpu.FormatHours(*least.UsageGPUHours), least.Name)
	}
	return note
}

// events reports the latest event from the admission loop on the pod and
// on its PodGroup, and kube-scheduler's latest FailedScheduling: the
// components' own word on why the pod waits.
func (w *why) events() {
	type key struct{ kind, source string }
	latest := map[key]*corev1.Event{}
	for i := range w.c.Events {
		e := &w.c.Events[i]
		if e.Namespace != w.pod.Namespace && e.InvolvedObject.Namespace != w.pod.Namespace {
			continue
		}
		var kind string
		switch {
		case e.InvolvedObject.Kind == "Pod" && e.InvolvedObject.Name == w.pod.Name &&
			(e.InvolvedObject.UID == "" || e.InvolvedObject.UID == w.pod.UID):
			kind = "pod"
		case e.InvolvedObject.Kind == "PodGroup" && w.req != nil && w.req.PodGroup != "" && e.InvolvedObject.Name == w.req.PodGroup:
			kind = "PodGroup " + w.req.PodGroup
		default:
			continue
		}
		var source string
		switch {
		case reporter(e) == AdmitterComponent:
			source = AdmitterComponent
		case e.Reason == reasonFailedScheduling:
			source = "kube-scheduler"
		default:
			continue
		}
		k := key{kind, source}
		if old := latest[k]; old == nil || eventTime(e).After(eventTime(old)) {
			latest[k] = e
		}
	}
	if len(latest) == 0 {
		w.add(CheckEvents, StatusInfo, nil, "no events from %s or kube-scheduler about the pod%s", AdmitterComponent, map[bool]string{true: " or its PodGroup", false: ""}[w.req != nil && w.req.PodGroup != ""])
		return
	}
	keys := make([]key, 0, len(latest))
	for k := range latest {
		keys = append(keys, k)
	}
	// The admission loop's word first, the pod's before the PodGroup's.
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].source != keys[j].source {
			return keys[i].source == AdmitterComponent
		}
		return keys[i].kind < keys[j].kind
	})
	for _, k := range keys {
		e := latest[k]
		s := StatusInfo
		switch e.Reason {
		case v1alpha1.ReasonWaitingForQuota, v1alpha1.ReasonWaitingForMembers, v1alpha1.ReasonWaitingForCapacity,
			v1alpha1.ReasonScheduleTimeout, v1alpha1.ReasonPreempted, v1alpha1.ReasonQueueConflict, reasonFailedScheduling:
			s = StatusBlocking
		case v1alpha1.ReasonAdmitted:
			s = StatusOK
		}
		times := ""
		if n := eventCount(e); n > 1 {
			times = fmt.Sprintf(", %d times", n)
		}
		ago := duration.HumanDuration(w.now.Sub(eventTime(e)))
		w.add(CheckEvents, s, map[string]float64{"count": float64(eventCount(e)), "ageSeconds": float64(int64(w.now.Sub(eventTime(e)).Seconds()))},
			"%s on the %s, %s ago%s: %s: %s", k.source, k.kind, ago, times, e.Reason, strings.TrimSpace(e.Message))
	}
}

func reporter(e *corev1.Event) string {
	if e.ReportingController != "" {
		return e.ReportingController
	}
	return e.Source.Component
}

// eventTime is when the event last happened, whichever API wrote it.
func eventTime(e *corev1.Event) time.Time {
	switch {
	case e.Series != nil && !e.Series.LastObservedTime.IsZero():
		return e.Series.LastObservedTime.Time
	case !e.LastTimestamp.IsZero():
		return e.LastTimestamp.Time
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	}
	return e.CreationTimestamp.Time
}

func eventCount(e *corev1.Event) int32 {
	if e.Series != nil && e.Series.Count > 0 {
		return e.Series.Count
	}
	return max(e.Count, 1)
}

// fit asks the ledger whether the pod fits a node now, on the nodes
// kube-scheduler would consider for it (node selector, required affinity,
// taints, cordons). It cannot see the admission loop's reservations, which
// live only in its memory.
func (w *why) fit() {
	all := w.ledger.Nodes()
	candidates := w.candidateNodes(all)
	nums := map[string]float64{"gpuNodes": float64(len(all)), "candidates": float64(len(candidates))}
	if len(candidates) == 0 {
		w.add(CheckFit, StatusBlocking, nums, "no node can take it: none of the %d GPU nodes matches its node selector, affinity and tolerations, or they are cordoned", len(all))
		return
	}
	var fitting, live []string
	var silent []*gpu.AgentSilentError
	silentFits := false
	var closest *gpu.InsufficientError
	var other error
	for _, n := range candidates {
		err := w.ledger.Fit(n, w.req)
		var ie *gpu.InsufficientError
		if s := w.silentAgent(n); s != nil {
			silent = append(silent, s)
			silentFits = silentFits || err == nil
			continue
		}
		live = append(live, n)
		switch {
		case err == nil:
			fitting = append(fitting, n)
		case errors.As(err, &ie):
			if closest == nil || ie.CloserThan(closest) {
				closest = ie
			}
		default:
			other = err
		}
	}
	nums["fitting"] = float64(len(fitting))
	if len(silent) > 0 {
		nums["silentAgents"] = float64(len(silent))
	}
	switch {
	case len(fitting) == 0 && len(silent) > 0 && (silentFits || closest == nil):
		// Only nodes whose agent is silent could take it.
		w.add(CheckFit, StatusBlocking, nums, "%s", describeSilent(silent, len(candidates)))
		return
	case len(silent) > 0:
		w.add(CheckFit, StatusInfo, nums, "%s", describeSilent(silent, len(candidates)))
	}
	switch {
	case len(fitting) > 0:
		where := fitting[0]
		if a, err := w.ledger.Choose(fitting[0], w.req, ""); err == nil {
			where = describeAllocation(a)
			where = fitting[0] + ", " + where
		}
		w.add(CheckFit, StatusOK, nums, "a device has room now: it fits %d of %d candidate nodes, e.g. %s", len(fitting), len(candidates), where)
		w.gangFit(live)
	case closest != nil && closest.Unresolvable:
		nums["bestFreeGPUs"] = gpus(closest.BestFreeMilli)
		w.add(CheckFit, StatusBlocking, nums, "it can never fit any of the %d candidate nodes, even empty; closest: %v", len(candidates), closest)
	case closest != nil:
		nums["bestFreeGPUs"] = gpus(closest.BestFreeMilli)
		w.add(CheckFit, StatusBlocking, nums, "no device has room now on any of the %d candidate nodes; closest: %v", len(candidates), closest)
	default:
		w.add(CheckFit, StatusBlocking, nums, "no candidate node fits: %v", other)
	}
}

// describeSilent says which candidate nodes take no new pods because their
// agent is silent.
func describeSilent(silent []*gpu.AgentSilentError, candidates int) string {
	if len(silent) == 1 {
		return silent[0].Error()
	}
	parts := make([]string, len(silent))
	for i, s := range silent {
		parts[i] = fmt.Sprintf("%s (for %s, last heartbeat %s)", s.Node, s.For.Round(time.Second), s.LastHeartbeat.UTC().Format(time.RFC3339))
	}
	return fmt.Sprintf("the agents on %d of the %d candidate nodes have not reported: %s; those nodes take no new GPU pods until they do", len(silent), candidates, strings.Join(parts, ", "))
}

// gangFit places the gang's unbound members together on a snapshot, as the
// admission loop does: each may fit alone while the gang does not.
func (w *why) gangFit(candidates []string) {
	var reqs []*gpu.PodRequest
	for _, p := range w.members {
		if p.Spec.NodeName != "" {
			continue
		}
		if r, errs := gpu.ParsePod(p); r != nil && len(errs) == 0 {
			reqs = append(reqs, r)
		}
	}
	if len(reqs) < 2 {
		return
	}
	nums := map[string]float64{"pods": float64(len(reqs))}
	if _, err := w.ledger.Snapshot().PlaceGang(reqs, candidates, ""); err != nil {
		w.add(CheckFit, StatusBlocking, nums, "the gang's %d unbound pods do not fit together now: %v", len(reqs), err)
		return
	}
	w.add(CheckFit, StatusOK, nums, "the gang's %d unbound pods fit together now", len(reqs))
}

// candidateNodes are the GPU nodes kube-scheduler would consider: those
// whose Node matches the pod's required node affinity and node selector,
// is not cordoned, and has no NoSchedule or NoExecute taint the pod does
// not tolerate. Without Node objects (a user who may not list them) every
// GPU node counts.
func (w *why) candidateNodes(gpuNodes []string) []string {
	if len(w.c.Nodes) == 0 {
		return gpuNodes
	}
	nodes := map[string]*corev1.Node{}
	for i := range w.c.Nodes {
		nodes[w.c.Nodes[i].Name] = &w.c.Nodes[i]
	}
	affinity := nodeaffinity.GetRequiredNodeAffinity(w.pod)
	hard := func(t *corev1.Taint) bool {
		return t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute
	}
	var out []string
	for _, name := range gpuNodes {
		n := nodes[name]
		if n == nil || n.Spec.Unschedulable {
			continue
		}
		if ok, err := affinity.Match(n); err != nil || !ok {
			continue
		}
		if _, bad := corev1helpers.FindMatchingUntoleratedTaint(logr.Discard(), n.Spec.Taints, w.pod.Spec.Tolerations, hard, false); bad {
			continue
		}
		out = append(out, name)
	}
	return out
}

// describeRequest says what a pod asks for, in words.
func describeRequest(r *gpu.PodRequest) string {
	if len(r.Containers) == 0 {
		return "GPUs through ResourceClaims"
	}
	c := r.Containers[0]
	var s string
	switch {
	case c.Whole() && c.Count == 1:
		s = "1 whole GPU"
	case c.Whole():
		s = fmt.Sprintf("%d whole GPUs", c.Count)
	case c.MemoryMiB > 0 && c.Count == 1:
		s = FormatMiB(c.MemoryMiB) + " of GPU memory on 1 GPU"
	case c.MemoryMiB > 0:
		s = fmt.Sprintf("%s of GPU memory on each of %d GPUs", FormatMiB(c.MemoryMiB), c.Count)
	case c.Count == 1:
		s = gpu.FormatMilli(c.Milli) + " of a GPU"
	default:
		s = fmt.Sprintf("%s of a GPU on each of %d GPUs", gpu.FormatMilli(c.Milli), c.Count)
	}
	if len(r.Containers) == 1 {
		return s + " (container " + c.Name + ")"
	}
	names := make([]string, len(r.Containers))
	for i, c := range r.Containers {
		names[i] = c.Name
	}
	return s + " in each of its containers " + strings.Join(names, ", ")
}

// describeAllocation names the devices a pod holds or would hold:
// "GPU 3 (0.5)", "GPUs 0,1 (whole)".
func describeAllocation(a *gpu.PodAllocation) string {
	parts := make([]string, 0, len(a.Containers))
	for _, c := range a.Containers {
		idx := make([]string, len(c.DeviceIndexes))
		for i, d := range c.DeviceIndexes {
			idx[i] = fmt.Sprint(d)
		}
		noun := "GPU"
		if len(idx) > 1 {
			noun = "GPUs"
		}
		amount := gpu.FormatMilli(c.Milli) + " each"
		switch {
		case c.Whole():
			amount = "whole"
		case len(idx) == 1:
			amount = gpu.FormatMilli(c.Milli)
		}
		s := fmt.Sprintf("%s %s (%s)", noun, strings.Join(idx, ","), amount)
		if len(a.Containers) > 1 {
			s = "container " + c.Container + ": " + s
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, "; ")
}

func hasAdmissionGate(p *corev1.Pod) bool {
	for _, g := range p.Spec.SchedulingGates {
		if g.Name == v1alpha1.SchedulingGateAdmission {
			return true
		}
	}
	return false
}

// models checks, for a pod bound but not started, each model it asks for on
// its node: the node's cache must hold it before the kubelet starts the
// pod's containers. It returns the first thing it waits for.
func (w *why) models() (string, bool) {
	p := w.pod
	names := v1alpha1.ModelNamesOf(p.Annotations)
	if len(names) == 0 || p.Spec.NodeName == "" || orPending(p.Status.Phase) != corev1.PodPending {
		return "", false
	}
	first := ""
	for _, name := range names {
		i := slices.IndexFunc(w.c.Models, func(m v1alpha1.Model) bool { return m.Namespace == p.Namespace && m.Name == name })
		if i < 0 {
			if len(w.c.Models) == 0 {
				w.add(CheckModels, StatusInfo, nil, "model %s: the Models of %s could not be read", name, p.Namespace)
				continue
			}
			msg := fmt.Sprintf("model %s does not exist in %s: the pod's volume cannot be mounted", name, p.Namespace)
			w.add(CheckModels, StatusBlocking, nil, "%s", msg)
			first = cmp.Or(first, msg)
			continue
		}
		m := &w.c.Models[i]
		e := m.Status.ModelNode(p.Spec.NodeName)
		var msg string
		switch {
		case e == nil:
			msg = fmt.Sprintf("waiting for model %s on %s: its cache has not started fetching it (it does when the kubelet mounts the pod's volume)", name, p.Spec.NodeName)
		case e.Phase == v1alpha1.ModelReady:
			w.add(CheckModels, StatusOK, nil, "model %s is on %s", name, p.Spec.NodeName)
			continue
		case e.Phase == v1alpha1.ModelFailed:
			msg = fmt.Sprintf("model %s failed on %s: %s", name, p.Spec.NodeName, e.Message)
		default:
			msg = e.Message
			if msg == "" || !strings.HasPrefix(msg, "waiting for model") {
				msg = fmt.Sprintf("waiting for model %s on %s: %s", name, p.Spec.NodeName, cmp.Or(e.Message, string(e.Phase)))
			}
		}
		var nums map[string]float64
		if e != nil && e.Total > 0 {
			nums = map[string]float64{"bytes": float64(e.Bytes), "total": float64(e.Total)}
		}
		w.add(CheckModels, StatusBlocking, nums, "%s", msg)
		first = cmp.Or(first, msg)
	}
	return first, first != ""
}

// whyModelsOnly is why for a pod that asks for no GPU but for models: only
// where it is and its models can hold it.
func whyModelsOnly(c *Cluster, pod *corev1.Pod) WhyReport {
	w := &why{c: c, pod: pod}
	subject := fmt.Sprintf("pod %s/%s", pod.Namespace, pod.Name)
	r := WhyReport{Namespace: pod.Namespace, Pod: pod.Name}
	switch {
	case finished(pod):
		w.add(CheckBound, StatusOK, nil, "the pod has finished (%s)", pod.Status.Phase)
		r.Summary = fmt.Sprintf("%s is not waiting: it has finished (%s)", subject, pod.Status.Phase)
	case pod.Spec.NodeName == "":
		r.Waiting = true
		w.add(CheckBound, StatusInfo, nil, "not bound yet: it asks for no GPU, so kube-scheduler alone places it")
		r.Summary = fmt.Sprintf("%s waits for kube-scheduler ('kubectl describe pod' shows its reasons); its models are fetched on the node it goes to", subject)
	default:
		w.add(CheckBound, StatusOK, nil, "bound to %s (phase %s)", pod.Spec.NodeName, orPending(pod.Status.Phase))
		if f, waiting := w.models(); waiting {
			r.Waiting = true
			r.Summary = fmt.Sprintf("%s waits: %s", subject, f)
		} else {
			r.Summary = fmt.Sprintf("%s is not waiting: it is bound to %s (phase %s)", subject, pod.Spec.NodeName, orPending(pod.Status.Phase))
		}
	}
	r.Findings = w.findings
	return r
}
