// Package usage counts what each queue has used over time, so that fair
// share can remember (time-based fair share, DESIGN §6): a team that held
// the whole cluster all night does not compete at 9:00 on equal terms with
// a team that had nothing.
//
// The admission loop's leader feeds a Tracker from its own ledger every
// cycle (Observe: what each queue's workloads hold now), and reads back each
// queue's usage (Usage): the integral of what it held over the window, each
// moment weighted by 0.5^(age/half-life), and the same as a share of what
// the cluster's capacity would have given over the window with the same
// decay (KAI-Scheduler's normalized usage). A parent's usage is its own plus
// its children's. No Prometheus is needed.
//
// # Buckets
//
// A queue's history is a list of buckets, stretches of time aligned to
// multiples of the bucket width. Each holds the integral of the queue's use
// over the bucket, decayed to the bucket's end: a constant rate x over
// [p, q] in a bucket ending at E adds x × (h/ln 2) × (0.5^((E−q)/h) −
// 0.5^((E−p)/h)), exact for any h. Read at time t, a bucket counts
// 0.5^((t−E)/h) times its value, so the sum is the exact decayed integral;
// only the one bucket the window's start cuts through is counted
// pro rata. The width is the smaller of window/24 and half-life/2, whole
// seconds; buckets older than the window or 30 half-lives (a factor below
// 10⁻⁹) are dropped, so a queue keeps at most about 62 (up to 92 with a
// half-life of a few seconds, where whole-second buckets are coarse; the
// CRD allows 128).
//
// # Persistence
//
// The buckets are written to each Queue's status (status.usage), at most
// once per PersistEvery, so that a new leader carries on where the last one
// stopped (Restore). The time between the last write and the new leader's
// first cycle is counted with what the queues hold at that first cycle: the
// pods that run then most likely ran before.
package usage
