// Package partitatest holds fluent builders for the objects Partita's tests
// use, in the style of kueue's and kube-scheduler's test wrappers: each
// embeds the real type, its methods chain, and Obj returns the object.
//
//	pod := partitatest.MakePod("p", "ns").GPUMemory("20Gi").Queue("team-a").Obj()
//	node := partitatest.MakeGPUNode("n1").Device(0, "H100", 81559).Obj()
//
// It imports the API types, package gpu (for canonical and bound pods) and
// Kubernetes' API machinery, so that the tests of any package above gpu can
// use it; gpu's own tests use it from package gpu_test.
package partitatest
