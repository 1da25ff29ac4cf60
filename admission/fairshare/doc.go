// Package fairshare divides cluster capacity among a tree of queues the way
// KAI-Scheduler does (design §6), so that users moving from KAI or Run:ai see
// the same fair shares. It owns the arithmetic only: Divide is a pure function
// of capacity, queue settings and demand. The admitter feeds it from its ledger
// snapshot and the `partita fairshare` CLI feeds it from a file (Load).
//
// The package must not import gpu, the extender, api/v1alpha1 or any client:
// callers convert their types into Queue values. It imports only the standard
// library, k8s.io/apimachinery (quantities) and sigs.k8s.io/yaml (the file).
//
// # The division
//
// Each resource is divided on its own, level by level: the cluster capacity
// among the top-level queues, then each queue's fair share among its children.
// A queue's request is its demand (leaf) or the sum of its children's requests;
// requestable is the request capped by the limit (-1: no limit, 0: nothing).
//
//  1. Quota. Every sibling gets min(quota, requestable), whatever its priority
//     and even when the quotas add up to more than the capacity (quota -1 is
//     the whole capacity of the level). If nothing is left, the level is done.
//  2. Over quota, priority tiers highest first. Rounds over the tier's queues
//     that still want more and have a weight: each is offered
//     pool × weight / Σweight. A queue that wants no more than its offer takes
//     what it wants; any other takes whole units of its offer and remembers the
//     fraction. Another round runs only if some queue wanted less than its
//     offer. Whatever a tier leaves, whole units included, goes to the next tier.
//  3. Fractions, tiers highest first again: while something is left, each queue
//     that remembered a fraction gets one more unit (or what is left), largest
//     fraction first, then the earlier-created queue, then the smaller name.
//
// What is left after step 3 stays unassigned.
//
// # Worked example
//
// 10 GPUs; four top-level queues, in creation order:
//
//	queue     priority  quota  weight  demand
//	research  100       2      2       8
//	prod      100       2      1       3
//	dev       100       0      1       6
//	batch      50       1      1       1.5
//
// Step by step:
//
//  1. Quota: research 2, prod 2, dev 0, batch 1; 10 − 5 = 5 left.
//  2. Tier 100, round 1 (pool 5, Σweight 4): research is offered 2.5 and wants
//     6, so it takes 2 and remembers 0.5; prod is offered 1.25 and wants 1, so
//     it takes 1; dev is offered 1.25, takes 1 and remembers 0.25. prod wanted
//     less than its offer, so 1 is left for round 2 (pool 1, Σweight 3):
//     research is offered 0.667 and dev 0.333, both take 0 and remember those
//     fractions. Nobody wanted less than its offer: the tier is done.
//     Tier 50 (pool 1): batch wants 0.5 and takes it; 0.5 is left.
//  3. Tier 100: research (0.667) gets min(1, 0.5) = 0.5 before dev (0.333).
//
// Fair shares: research 4.5, prod 3, dev 1, batch 1.5.
//
// # History
//
// DivideWith can weigh each queue's past usage (time-based fair share, as
// KAI-Scheduler does since v0.10): in every round of step 2 a queue's weight
// becomes max(0, w + k×(w − u)), where w is its over-quota weight over the
// sum of the wanting siblings' weights, u its usage as a share of what the
// level divides over the usage window (a parent's is its subtree's) and k
// the usage weight (KAI's kValue). Quotas (step 1) are not touched. With
// k = 0 the division is the one above. Usage comes in as a share of the
// cluster's capacity; at the top level that is what the level divides, as
// in KAI; below it Partita rescales it to the parent's fair share, where
// KAI keeps the cluster's and history hardly moves shares inside a
// department (setLevelUsage). If usage leaves every share weight at 0,
// plain weights divide (KAI leaves the rest undivided). The admission loop computes usage
// (package admission/usage); the file gives it per queue.
//
// # Units
//
// Amounts are in each resource's natural unit: GPUs (decimals for fractions),
// CPU cores and memory bytes. The "whole unit" of steps 2 and 3 is the unit KAI
// divides in: one GPU, one millicore, one byte (see Resource).
package fairshare
