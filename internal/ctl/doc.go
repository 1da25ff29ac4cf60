// Package ctl is the logic behind `partita ctl`, which is also the kubectl
// plugin `kubectl partita`: read-only views of what Partita did (nodes,
// queues) and why a pod waits (why).
//
// Every view is a pure function of a Cluster, the objects read once from the
// API server, so that tests build a Cluster by hand and compare the text.
// Device usage comes from package gpu's ledger (BuildLedger,
// AllocationFromPod, Fit), the model the scheduler extender and the
// admission loop use: what ctl prints is what the scheduler sees, with no
// accounting of its own.
//
// ctl imports api/v1alpha1 and gpu only of Partita's packages, never
// extender, webhook or nodeagent: a client must not pull in the servers.
package ctl
