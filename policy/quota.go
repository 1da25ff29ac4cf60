package policy

import (
	"context"
	"strconv"

	"github.com/open-policy-agent/opa/v1/ast"
)

// Kinds of workload in QuotaWorkload.Kind.
const (
	// QuotaKindPodGroup is a gang: a PodGroup and its pods, admitted whole.
	QuotaKindPodGroup = "PodGroup"
	// QuotaKindPod is a single pod that belongs to no gang.
	QuotaKindPod = "Pod"
)

// QuotaInput is the input document of data.partita.quota: one workload the
// admitter is about to admit, its queue and the queue's ancestors, with
// usage already aggregated (DESIGN §10: never whole objects). The admitter
// builds it from its ledger snapshot, so the policy reads no other data.
// docs/policy.md specifies it with examples; keep the two in step.
type QuotaInput struct {
	// Workload is what asks to be admitted.
	Workload QuotaWorkload `json:"workload"`
	// Queue is the workload's (leaf) queue.
	Queue QuotaQueue `json:"queue"`
	// Ancestors are the queue's parent, its parent and so on up to the
	// root, parent first; empty for a top-level queue.
	Ancestors []QuotaQueue `json:"ancestors"`
	// Cluster is the cluster's capacity.
	Cluster QuotaCluster `json:"cluster"`
}

// QuotaWorkload is a gang or a single pod as the quota policy sees it.
type QuotaWorkload struct {
	// Namespace is the workload's namespace.
	Namespace string `json:"namespace"`
	// Name is the PodGroup's or the pod's name.
	Name string `json:"name"`
	// Kind is QuotaKindPodGroup or QuotaKindPod.
	Kind string `json:"kind"`
	// Queue is the queue the workload goes to.
	Queue string `json:"queue"`
	// Members is the number of pods admitted together: the gang's
	// minMember, 1 for a single pod.
	Members int32 `json:"members"`
	// GPUMilli is the GPUs the whole workload takes, in milli-GPUs: the sum
	// of its members' partita.dev/gpu-milli.
	GPUMilli int64 `json:"gpuMilli"`
	// CPUMilli and MemoryBytes are the CPU (milli-CPUs) and memory its pods
	// request, summed.
	CPUMilli    int64 `json:"cpuMilli"`
	MemoryBytes int64 `json:"memoryBytes"`
	// Priority is the workload's priority (its pods' priority class value).
	Priority int32 `json:"priority"`
}

// QuotaQueue is one queue and its usage.
type QuotaQueue struct {
	// Name is the queue's name.
	Name string `json:"name"`
	// Priority is spec.priority (default 100).
	Priority int32 `json:"priority"`
	// GPU is the queue's GPU quota, limit and usage.
	GPU QuotaResource `json:"gpu"`
	// CPU is the queue's CPU quota, limit and usage, in milli-CPUs (the
	// CPU its pods request).
	CPU QuotaResource `json:"cpu"`
	// Memory is the queue's memory quota, limit and usage, in bytes (the
	// memory its pods request).
	Memory QuotaBytes `json:"memory"`
}

// QuotaBytes is a queue's quota, limit and usage of memory, in bytes, as
// QuotaResource is of GPUs and CPU.
type QuotaBytes struct {
	QuotaBytes     int64 `json:"quotaBytes"`
	LimitBytes     int64 `json:"limitBytes"`
	AllocatedBytes int64 `json:"allocatedBytes"`
	FairShareBytes int64 `json:"fairShareBytes"`
}

// QuotaResource is a queue's quota, limit and usage of one resource, in
// milli-units (1000 = one GPU, one CPU).
type QuotaResource struct {
	// QuotaMilli is spec quota, what the queue is guaranteed; -1 means the
	// whole capacity.
	QuotaMilli int64 `json:"quotaMilli"`
	// LimitMilli is spec limit, the most the queue (with its descendants)
	// may hold; -1 means none, 0 means nothing.
	LimitMilli int64 `json:"limitMilli"`
	// AllocatedMilli is what the queue and its descendants hold now,
	// including the admitter's live reservations, so that workloads
	// admitted earlier in the same cycle count; the admitter computes it
	// rather than reading Queue.status, which lags.
	AllocatedMilli int64 `json:"allocatedMilli"`
	// FairShareMilli is the queue's fair share at this moment (DESIGN §6).
	FairShareMilli int64 `json:"fairShareMilli"`
}

// QuotaCluster is the cluster as the quota policy sees it.
type QuotaCluster struct {
	// GPUMilli is the cluster's GPU capacity in milli-GPUs.
	GPUMilli int64 `json:"gpuMilli"`
	// CPUMilli and MemoryBytes are the allocatable CPU and memory of the
	// nodes with GPUs, where queued workloads run.
	CPUMilli    int64 `json:"cpuMilli"`
	MemoryBytes int64 `json:"memoryBytes"`
}

// QuotaDecision is data.partita.quota's answer for one workload.
type QuotaDecision struct {
	// Allowed is true when the queue may take the workload now: the
	// policy's deny set is empty.
	Allowed bool
	// Reasons are the deny messages, sorted; empty when allowed. The
	// admitter writes them to the workload's status, so they are what the
	// user reads.
	Reasons []string
	// Version is the policy version that decided.
	Version string
}

// QuotaByNumbers reports whether the policy in force answers quota
// questions by their numbers alone: it reads neither the asking workload's
// name nor its namespace, and calls no non-deterministic built-in. Two
// questions that differ only in who asks then have one answer, which the
// admission loop asks once a cycle.
func (e *Engine) QuotaByNumbers() bool { return e.current.Load().opts.quotaByNumbers }

// Quota evaluates data.partita.quota for one workload: may its queue take
// it now. The policy defines deny, a set of messages; the workload is
// allowed when it is empty, and a policy without the package allows
// everything. A failed evaluation returns an *EvaluationError, and the
// caller should keep the workload waiting (fail closed).
func (e *Engine) Quota(ctx context.Context, in *QuotaInput) (*QuotaDecision, error) {
	return decide(ctx, e, pointQuota, in, readQuota)
}

// readQuota reads data.partita.quota.deny; undefined is an empty set, so
// that a bundle without quota rules allows every workload.
func readQuota(version string, v any, defined bool) (*QuotaDecision, error) {
	if !defined {
		return &QuotaDecision{Allowed: true, Reasons: []string{}, Version: version}, nil
	}
	reasons, err := denyMessages("data.partita.quota.deny", v)
	if err != nil {
		return nil, err
	}
	return &QuotaDecision{Allowed: len(reasons) == 0, Reasons: reasons, Version: version}, nil
}

// value builds the Rego input as AST terms directly, as AdmissionInput
// does: the admitter asks for every workload it considers, so a JSON round
// trip per call would cost more than the policy. The terms come from one
// arena, and keys are constants, which need no allocation of their own.
func (in *QuotaInput) value(inputOptions) (ast.Value, error) {
	a := termArena{free: make([]ast.Term, quotaInputTerms+quotaQueueTerms*len(in.Ancestors))}
	ancestors := make([]*ast.Term, 0, len(in.Ancestors))
	for i := range in.Ancestors {
		ancestors = append(ancestors, a.queue(&in.Ancestors[i]))
	}
	w := &in.Workload
	return ast.NewObject(
		ast.Item(a.term(ast.String("workload")), a.object(
			ast.Item(a.term(ast.String("namespace")), a.term(ast.String(w.Namespace))),
			ast.Item(a.term(ast.String("name")), a.term(ast.String(w.Name))),
			ast.Item(a.term(ast.String("kind")), a.term(ast.String(w.Kind))),
			ast.Item(a.term(ast.String("queue")), a.term(ast.String(w.Queue))),
			ast.Item(a.term(ast.String("members")), a.int(int64(w.Members))),
			ast.Item(a.term(ast.String("gpuMilli")), a.int(w.GPUMilli)),
			ast.Item(a.term(ast.String("cpuMilli")), a.int(w.CPUMilli)),
			ast.Item(a.term(ast.String("memoryBytes")), a.int(w.MemoryBytes)),
			ast.Item(a.term(ast.String("priority")), a.int(int64(w.Priority))),
		)),
		ast.Item(a.term(ast.String("queue")), a.queue(&in.Queue)),
		ast.Item(a.term(ast.String("ancestors")), a.term(ast.NewArray(ancestors...))),
		ast.Item(a.term(ast.String("cluster")), a.object(
			ast.Item(a.term(ast.String("gpuMilli")), a.int(in.Cluster.GPUMilli)),
			ast.Item(a.term(ast.String("cpuMilli")), a.int(in.Cluster.CPUMilli)),
			ast.Item(a.term(ast.String("memoryBytes")), a.int(in.Cluster.MemoryBytes)),
		)),
	), nil
}

// Terms value takes from its arena at most: quotaQueueTerms for each queue
// (an object, 5 keys, the name, a number, and 3 resource objects of 4 keys
// and 4 numbers each) and quotaInputTerms for the rest (the workload: an
// object, 9 keys, 4 strings, 5 numbers; 4 top-level keys, the ancestors
// array, the cluster object, its 3 keys and numbers). A wrong count costs
// an allocation, never a wrong input.
const (
	quotaQueueTerms = 35
	quotaInputTerms = 33 + quotaQueueTerms
)

func (a *termArena) queue(q *QuotaQueue) *ast.Term {
	milli := func(r *QuotaResource) *ast.Term {
		return a.object(
			ast.Item(a.term(ast.String("quotaMilli")), a.int(r.QuotaMilli)),
			ast.Item(a.term(ast.String("limitMilli")), a.int(r.LimitMilli)),
			ast.Item(a.term(ast.String("allocatedMilli")), a.int(r.AllocatedMilli)),
			ast.Item(a.term(ast.String("fairShareMilli")), a.int(r.FairShareMilli)),
		)
	}
	return a.object(
		ast.Item(a.term(ast.String("name")), a.term(ast.String(q.Name))),
		ast.Item(a.term(ast.String("priority")), a.int(int64(q.Priority))),
		ast.Item(a.term(ast.String("gpu")), milli(&q.GPU)),
		ast.Item(a.term(ast.String("cpu")), milli(&q.CPU)),
		ast.Item(a.term(ast.String("memory")), a.object(
			ast.Item(a.term(ast.String("quotaBytes")), a.int(q.Memory.QuotaBytes)),
			ast.Item(a.term(ast.String("limitBytes")), a.int(q.Memory.LimitBytes)),
			ast.Item(a.term(ast.String("allocatedBytes")), a.int(q.Memory.AllocatedBytes)),
			ast.Item(a.term(ast.String("fairShareBytes")), a.int(q.Memory.FairShareBytes)),
		)),
	)
}

// termArena hands out terms from one slice: an input has dozens of terms,
// and one allocation for all of them is cheaper than one each. OPA never
// changes an input's terms, so they may share a backing array.
type termArena struct {
	free []ast.Term
}

func (a *termArena) term(v ast.Value) *ast.Term {
	if len(a.free) == 0 {
		a.free = make([]ast.Term, quotaQueueTerms)
	}
	t := &a.free[0]
	a.free = a.free[1:]
	t.Value = v
	return t
}

func (a *termArena) object(items ...[2]*ast.Term) *ast.Term {
	return a.term(ast.NewObject(items...))
}

// int is v as a number term; OPA interns small numbers.
func (a *termArena) int(v int64) *ast.Term {
	if ast.HasInternedIntNumberTerm(int(v)) {
		return ast.InternedTerm(int(v))
	}
	return a.term(ast.Number(strconv.FormatInt(v, 10)))
}
