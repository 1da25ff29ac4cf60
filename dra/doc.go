// Package dra is Partita's Dynamic Resource Allocation driver, gpu.partita.dev,
// and the one place that says how Partita's requests, devices and claims look
// in DRA terms (docs/design.md, "GPU backends"):
//
//   - devices.go: each GPU as a DRA device (attributes, consumable capacity
//     in milli-GPUs and memory, request policies) and the DeviceClass;
//   - claims.go: a pod's canonical request (gpu.PodRequest) as
//     ResourceClaimTemplates and the pod's claim references, which the
//     webhook writes in dra mode;
//   - held.go: the GPUs a pod holds through its ResourceClaims (any
//     driver), in milli-GPUs per device, for the queue accounting;
//   - cdi.go: the CDI spec that gives a prepared claim's containers their
//     devices and the limits of the node's isolation mode;
//   - publisher.go: ResourceSlices for many nodes from one process (the
//     simulated fleet);
//   - plugin.go: the kubelet plugin (Prepare/Unprepare) on a real node.
//
// It imports api/v1alpha1, gpu and the Kubernetes libraries, never the other
// parts of Partita.
package dra
