// Package cycle decides which waiting workloads the admission loop lets
// start (DESIGN §2.2, §6): a workload is a gang (a PodGroup, or pods sharing
// the label partita.dev/pod-group with partita.dev/min-member) or a single
// pod. One Cycle orders the workloads by queue (below fair share first, then
// queue priority, then smallest share), and within a queue by priority then
// age; asks the quota policy whether the queue may take each one now;
// simulates the whole gang on a gpu.Snapshot with the node predicates that
// matter (CPU and memory room, node selector and affinity, taints); and, when
// nothing fits, looks for whole workloads to evict: from queues over their
// fair share (reclaim) or of lower priority in the same queue (preemption).
//
// The package decides; it does not write. The caller (admission.Admitter)
// feeds the Cache from informers, runs a Cycle on a fresh ledger snapshot,
// and carries out the Result: reservations, pins and ungating, evictions,
// statuses and events. Keeping the decision pure makes it testable with
// tables and benchmarkable at cluster scale.
package cycle
