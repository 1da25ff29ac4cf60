// Package console is the Partita console: a web UI and a JSON API
// (/api/v1, documented by the OpenAPI document it serves) for the people
// who share the GPUs. It shows the workload map (every GPU and its slices),
// the queue tree against quota and fair share, every workload with the
// verdict of `kubectl partita why`, utilisation over time and the policy in
// force, and lets a person do the few things they need (edit queues, delete
// or suspend a workload, submit a small one), always within their own
// Kubernetes permissions.
//
// The parts, and what each owns:
//
//   - Source (source.go): the informers. In local mode (ModeLocal) they run
//     with the user's kubeconfig, scoped to what the user may list; in
//     shared mode (ModeShared, the chart's Deployment) with the console's
//     own ServiceAccount, cluster-wide.
//   - Snapshot (snapshot.go): an immutable picture built from the Source
//     after each batch of changes: the map, the queues, the workloads. Every
//     number comes from the code the scheduler and `kubectl partita` use:
//     package gpu's ledger and package report's nodes, queues and why; the
//     map's nodes are grouped by a Topology's levels as `kubectl partita
//     nodes --topology` groups them (report.GroupByLevels).
//   - Workloads (workload.go): the one place that says which workload a pod
//     belongs to (kind and name) and what it holds; new workload kinds are
//     added there.
//   - Access (access.go): what a user may see and do, asked of the API
//     server (SelfSubjectAccessReview in local mode, SubjectAccessReview in
//     shared mode) and cached briefly. Every response is filtered by it: a
//     user never sees the workloads of a namespace where they may not list
//     pods. Writes never rely on it: they are made as the user (their own
//     client, or impersonation), so the API server decides.
//   - Authentication (auth.go): a per-start token in local mode; bearer
//     tokens (TokenReview) or a verified authenticating proxy in shared mode.
//   - Hub (hub.go): pushes changes to the pages over Server-Sent Events.
//   - History (history.go, prometheus.go): utilisation over time, from
//     Prometheus when configured, else sampled by the console itself.
//
// The package imports api/v1alpha1, gpu, policy (for the default bundle's
// version) and report (the computation it shares with `kubectl partita`);
// it must not import the servers (extender, admission, webhook,
// nodeagent).
package console
