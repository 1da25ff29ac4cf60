// Package partitatest holds fluent builders for the objects Partita's tests
// use, in the style of kueue's and kube-scheduler's test wrappers: each
// embeds the real type, its methods chain, and Obj returns the object.
//
//	pod := partitatest.MakePod("p", "ns").GPUMemory("20Gi").Queue("team-a").Obj()
//	node := partitatest.MakeGPUNode("n1").Device(0, "H100", 81559).Obj()
//
// It imports only the API types and Kubernetes API machinery, so that any
// package's tests, gpu's internal ones included, can use it.
package partitatest
