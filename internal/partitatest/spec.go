package partitatest

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
)

// Env adds an env variable with a value to a container ("" is the last
// added).
func (w *PodWrapper) Env(container, name, value string) *PodWrapper {
	c := w.container(container)
	c.Env = append(c.Env, corev1.EnvVar{Name: name, Value: value})
	return w
}

// EnvFrom adds an env variable from the downward API field path to a
// container.
func (w *PodWrapper) EnvFrom(container, name, fieldPath string) *PodWrapper {
	c := w.container(container)
	c.Env = append(c.Env, corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: fieldPath}}})
	return w
}

// Privileged makes a container privileged.
func (w *PodWrapper) Privileged(container string) *PodWrapper {
	c := w.container(container)
	if c.SecurityContext == nil {
		c.SecurityContext = &corev1.SecurityContext{}
	}
	c.SecurityContext.Privileged = ptr.To(true)
	return w
}

// Volume adds a volume.
func (w *PodWrapper) Volume(v corev1.Volume) *PodWrapper {
	w.Spec.Volumes = append(w.Spec.Volumes, v)
	return w
}

// HostPath adds a hostPath volume of the node's path p.
func (w *PodWrapper) HostPath(name, p string) *PodWrapper {
	return w.Volume(corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: p}}})
}

// EmptyDir adds an emptyDir volume.
func (w *PodWrapper) EmptyDir(name string) *PodWrapper {
	return w.Volume(corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
}

// Mount mounts a volume into a container.
func (w *PodWrapper) Mount(container string, m corev1.VolumeMount) *PodWrapper {
	c := w.container(container)
	c.VolumeMounts = append(c.VolumeMounts, m)
	return w
}
