// Package admission is Partita's queue and gang admission loop (DESIGN
// §2.2, §6; docs/queues.md): the leader-elected controller that lets
// waiting GPU workloads start all-or-nothing, by queue, quota, fair share
// and priority, and reclaims and preempts to make room.
//
// Pods that need a GPU are created with the scheduling gate
// partita.dev/admission (the webhook adds it). The Admitter feeds a
// cycle.Cache from informers (admitter_feed.go), runs cycle.Run on a
// snapshot of the GPU ledger, and carries out the decision: it holds the
// placed devices in the ledger, pins and ungates members
// (admitter.go, admitter_patch.go), gives up pins kube-scheduler keeps
// refusing (admitter_pins.go), evicts victims whole
// (admitter_evict.go), writes Queue and PodGroup status and pod
// conditions (admitter_status.go, conditions.go), keeps the PodGroups of mapped
// workloads (admitter_mapped.go), and counts what it did
// (admitter_metrics.go). The quota decision asks the Rego policy
// (quota.go). HeartbeatMonitor marks the nodes whose agent stopped
// reporting, for the loop and the extender alike.
//
// Beneath it:
//   - cycle decides, from a cache of workloads, queues and nodes, what to
//     admit and whom to evict; it writes nothing;
//   - fairshare divides capacity among the queue tree (KAI-compatible);
//   - workloadmap groups pods that name no pod group into workloads, by
//     Rego rules over their owners;
//   - claims reads GPUs asked for through ResourceClaims and simulates
//     their allocation with DRA's structured allocator.
//
// kube-scheduler then places the released pods through the extender
// (package extender), which shares only the ledger (package
// gpu/ledgerfeed feeds it) and the hand-off of released pods
// (ReleasedPodSink). Nothing here imports the extender.
package admission
