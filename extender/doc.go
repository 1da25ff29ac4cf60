// Package extender is Partita's kube-scheduler HTTP extender (DESIGN §2.3,
// §9): kube-scheduler knows how many milli-GPUs a node has left, not which
// device has room, and the extender closes that gap.
//
//   - filter (filter.go) keeps the nodes whose healthy devices can hold every
//     GPU container of the pod, and says why the others cannot, with numbers;
//   - prioritize (prioritize.go) packs at device level (or spreads, per pod
//     or per flag), scores 0–10;
//   - bind (bind.go) is the single place where devices are assigned: per
//     node serialised, it chooses the devices, records them in the ledger at
//     once, and creates the Binding with the allocation annotations on it,
//     so node and devices reach the pod in one write; it is idempotent and
//     rolls the ledger back when the Binding fails;
//   - preempt (preempt.go) keeps only the nodes where evicting the proposed
//     victims really frees a slice that fits, and never breaks a gang.
//
// The ledger is a gpu.Ledger fed by informers on GPUNodes and pods
// (package gpu/ledgerfeed), rebuilt from the API objects alone on every
// start. The
// HTTP server (server.go) runs on every replica; only the elected leader
// binds, others answer bind with an error so that kube-scheduler retries.
// Metrics are in metrics.go, the kube-scheduler configuration that wires the
// extender in schedconfig.go.
//
// The admission loop that releases pods for kube-scheduler to place is a
// program of its own (package admission). The two share only the ledger
// and the pods the loop has just released (ReleasedPods, which the loop
// fills through its admission.ReleasedPodSink); cmd/partita wires them.
//
// extender imports gpu and api/v1alpha1, never the admission loop. Nothing
// but cmd/partita imports extender.
package extender
