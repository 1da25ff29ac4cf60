// Package report computes what Partita shows people about a cluster: the
// GPU nodes and their device slices (Nodes), grouped by the levels of a
// Topology when asked (NodesByTopology, GroupByLevels), the queue tree
// with quotas and fair shares (Queues), and why a pod waits (Why). It has
// two faces: the kubectl plugin (package ctl) prints the reports as tables
// or JSON, and the console (package console) serves them on its API and
// pages.
//
// Every report is a pure function of a Cluster, the objects read once from
// the API server (Load) or kept by the console's informers, so that tests
// build a Cluster by hand and compare the result. Device usage comes from
// package gpu's ledger (BuildLedger, AllocationFromPod, Fit), the model the
// scheduler extender and the admission loop use: what a report says is
// what the scheduler sees, with no accounting of its own.
//
// report imports api/v1alpha1, gpu and dra only of Partita's packages,
// never extender, admission, webhook or nodeagent: a client must not pull
// in the servers.
package report
