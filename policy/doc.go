// Package policy is Partita's Rego policy engine (DESIGN §7). It owns:
//
//   - the default bundle, embedded from policy/rego/*.rego, with its Rego
//     unit tests (policy/rego/*_test.rego), which `go test` runs with
//     coverage;
//   - the Engine: Rego v1 on github.com/open-policy-agent/opa/v1/rego,
//     prepared once per policy version and swapped atomically, reading the
//     cluster state (queues, their usage, namespace labels) from an
//     in-memory store that StateSync fills in batches;
//   - the decision point data.partita.admission, which the webhook asks
//     for every GPU pod: a set of deny messages and patch defaults;
//   - the decision point data.partita.quota, which the extender's admitter
//     asks for every workload it is about to admit: a set of deny messages,
//     on an input (QuotaInput) the admitter aggregates itself;
//   - ConfigMapLoader: operator overrides in ConfigMaps labelled
//     partita.dev/policy=rego, hot reloaded; a policy that does not compile
//     is refused, the last good one stays, and the ConfigMap gets a status
//     annotation and an Event;
//   - RunTests, the engine of `partita policy test`.
//
// policy imports api/v1alpha1, OPA and the Kubernetes libraries; the
// webhook and the extender's admission loop import it, never the reverse.
// Its inputs are plain data (AdmissionInput, QuotaInput), so it needs no
// gpu types.
package policy
