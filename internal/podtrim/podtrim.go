// Package podtrim keeps in an informer's cache only what the extender and
// the admission loop read of a pod. At 50,000 pending pods the cached pods
// are most of the extender's memory, and most of each pod is what only its
// kubelet reads: environment, mounts, probes, the service account's
// projected volume, commands, images, container statuses. What stays: all
// of the metadata but managed fields and kubectl's last-applied copy; of
// the spec, everything that places a pod (node name and selector,
// affinity, tolerations, topology spread, priority, gates, overhead,
// pod-level resources, claims) and of each container its name, resources,
// restart policy and ports; the volumes that bind a pod to a node
// (PersistentVolumeClaims and generic ephemeral volumes); the status but
// its container statuses.
//
// Nothing in the process writes a cached pod back (releases and conditions
// are patches computed against it), so a trimmed pod never reaches the API
// server.
package podtrim

import (
	corev1 "k8s.io/api/core/v1"
)

// LastAppliedAnnotation is kubectl's copy of the applied object: for a pod
// applied with kubectl, as large as the pod itself.
const LastAppliedAnnotation = corev1.LastAppliedConfigAnnotation

// Transform is a cache transform (controller-runtime's
// cache.ByObject.Transform, client-go's SetTransform): it trims pods in
// place and leaves every other object, and tombstones, as they are.
func Transform(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	Pod(pod)
	return pod, nil
}

// Pod trims pod in place.
func Pod(pod *corev1.Pod) {
	pod.ManagedFields = nil
	delete(pod.Annotations, LastAppliedAnnotation)
	spec := &pod.Spec
	for i := range spec.Containers {
		trimContainer(&spec.Containers[i])
	}
	for i := range spec.InitContainers {
		trimContainer(&spec.InitContainers[i])
	}
	for i := range spec.EphemeralContainers {
		trimContainer((*corev1.Container)(&spec.EphemeralContainers[i].EphemeralContainerCommon))
	}
	var keep []corev1.Volume
	for _, v := range spec.Volumes {
		if v.PersistentVolumeClaim != nil || v.Ephemeral != nil {
			keep = append(keep, v)
		}
	}
	spec.Volumes = keep
	spec.ImagePullSecrets, spec.HostAliases, spec.DNSConfig, spec.SecurityContext, spec.ReadinessGates = nil, nil, nil, nil, nil
	pod.Status.ContainerStatuses, pod.Status.InitContainerStatuses, pod.Status.EphemeralContainerStatuses = nil, nil, nil
}

// trimContainer keeps a container's name, resources, restart policy (a
// sidecar's requests count differently) and ports (host ports place a pod).
func trimContainer(c *corev1.Container) {
	*c = corev1.Container{
		Name: c.Name, Resources: c.Resources, RestartPolicy: c.RestartPolicy, RestartPolicyRules: c.RestartPolicyRules, Ports: c.Ports,
	}
}
