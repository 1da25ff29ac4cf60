package webhook

import (
	"fmt"
	"path"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/partita-dev/partita/gpu"
)

// Other routes to a GPU than Partita's assignment (issue "trust boundaries",
// item 5): a privileged container, a hostPath into the node's devices or the
// MPS daemons' pipes, a mount where the NVIDIA runtime reads device requests,
// a CDI annotation. The same rules run twice, with the same messages: here
// for the pods the webhook sees, and in the API server as CEL (policies.go)
// for every pod, so that they hold while the webhook is down.

// Node paths that reach GPUs.
const (
	// devDir holds the device nodes: /dev/nvidia<N>, nvidiactl, nvidia-uvm,
	// nvidia-caps/, and /dev/char/<major>:<minor> links to each.
	devDir = "/dev"
	// devNVIDIAPrefix and devCharDir are the device nodes under devDir
	// that reach a GPU.
	devNVIDIAPrefix = "/dev/nvidia"
	devCharDir      = "/dev/char"
	// nvidiaRunDir is the GPU Operator's driver root and the NVIDIA device
	// plugin's MPS directory.
	nvidiaRunDir = "/run/nvidia"
	// partitaStateDir holds what the node's Partita processes keep on the
	// host and mount into containers: the HAMi-core interposer that every
	// hami-core slice preloads (the chart's agent.interposer.hostDir lies
	// under it), the agent's state. A tenant who could write there could
	// swap the library every other tenant's slice loads.
	partitaStateDir = "/var/lib/partita"
	// containerDevicesDir is where the NVIDIA container runtime, with the
	// volume-mounts device list strategy, reads the devices a container
	// asks for: a mount at <dir>/all asks for every GPU. Both spellings,
	// since /var/run is /run.
	containerDevicesDir    = "/var/run/nvidia-container-devices"
	containerDevicesDirRun = "/run/nvidia-container-devices"
	// cdiAnnotationPrefix marks CDI device requests, which a container
	// runtime with CDI enabled honours whatever the pod's resources say.
	cdiAnnotationPrefix = "cdi.k8s.io/"
)

// Messages, shared with the CEL rules so that a refusal reads the same
// whichever layer made it.
const (
	reachDevicesText = "the node's GPU devices (/dev/nvidia*)"
	reachMPSText     = "the MPS daemons' pipes of every GPU on the node"
	reachNVIDIAText  = "the NVIDIA driver's and MPS files under /run/nvidia"
	reachStateText   = "Partita's node files under /var/lib/partita (the HAMi-core interposer every slice loads)"
	hostPathTail     = ": a pod in a namespace Partita manages may not mount them, because Partita gives each GPU container its own devices; " +
		"run node agents and other system pods in a namespace Partita does not manage (the chart's webhook.excludeNamespaces)"
	privilegedText = "a privileged container sees every device of the node, so a pod that asks for GPUs cannot have one; " +
		"remove it: Partita gives the GPU containers their own devices"
	cdiText = "asks the container runtime for devices directly (CDI): in a namespace Partita manages GPUs come from Partita only; " +
		"remove it and ask for a GPU (for example the annotation partita.dev/gpu-fraction)"
	containerDevicesText = " is where the NVIDIA container runtime reads device requests from mounts: a pod cannot ask it for devices; mount the volume elsewhere"
	mpsVolumeText        = "the volume " + MPSVolume + " is added by Partita on clusters with MPS nodes: a pod cannot mount the MPS daemons itself; rename the volume"
	mpsMountText         = "the volume " + MPSVolume + " is mounted by Partita only, in a GPU container, as its own device's pipe directory (subPathExpr " +
		mpsSubPathExpr + " at " + MPSPipeMountPath + "); remove this mount"
)

// cleanDir is a directory flag as the rules compare it: absolute, clean.
func cleanDir(dir string) string { return path.Clean("/" + dir) }

// nodePath is a hostPath as the node resolves it: relative to / (the
// kubelet's working directory), with empty and "." parts and ".." resolved,
// and /var/run read as /run, its symlink on every distribution. Symlinks
// that someone placed on the node cannot be seen from here: see
// docs/operations.md for what that leaves to Pod Security.
func nodePath(p string) string {
	c := path.Clean("/" + p)
	if c == "/var/run" || strings.HasPrefix(c, "/var/run/") {
		c = "/run" + strings.TrimPrefix(c, "/var/run")
	}
	return c
}

// ancestorOrSelf reports whether node path n is dir or contains it.
func ancestorOrSelf(n, dir string) bool {
	return n == "/" || n == dir || strings.HasPrefix(dir, n+"/")
}

// beneath reports whether node path n lies inside dir.
func beneath(n, dir string) bool { return strings.HasPrefix(n, dir+"/") }

// hostPathReach says what a hostPath (normalised by nodePath) reaches, ""
// when nothing of the GPUs: the device nodes and the directories that hold
// them, the MPS directory with everything above and below it, /run/nvidia
// and Partita's node state likewise.
func hostPathReach(n, mpsDir string) string {
	switch {
	case ancestorOrSelf(n, devDir) || strings.HasPrefix(n, devNVIDIAPrefix) || n == devCharDir || beneath(n, devCharDir):
		return reachDevicesText
	case ancestorOrSelf(n, mpsDir) || beneath(n, mpsDir):
		return reachMPSText + " (" + mpsDir + ")"
	case ancestorOrSelf(n, nvidiaRunDir) || beneath(n, nvidiaRunDir):
		return reachNVIDIAText
	case ancestorOrSelf(n, partitaStateDir) || beneath(n, partitaStateDir):
		return reachStateText
	}
	return ""
}

// reachesContainerDevices reports whether a container mount path is where
// the NVIDIA runtime reads device requests. A path with ".." that names
// that directory at all is taken to, as the CEL rule (which cannot resolve
// "..") does.
func reachesContainerDevices(mountPath string) bool {
	n := path.Clean("/" + mountPath)
	for _, d := range []string{containerDevicesDir, containerDevicesDirRun} {
		if n == d || beneath(n, d) {
			return true
		}
	}
	return hasDotDot(mountPath) && strings.Contains(mountPath, "nvidia-container-devices")
}

func hasDotDot(p string) bool {
	for _, part := range strings.Split(p, "/") {
		if part == ".." {
			return true
		}
	}
	return false
}

// mpsMount is the one way a container mounts MPSVolume: a GPU container's
// own device's pipe directory, chosen by the kubelet from PARTITA_DEVICE
// (the allocation annotation) when the container starts.
func mpsMount() corev1.VolumeMount {
	return corev1.VolumeMount{Name: MPSVolume, MountPath: MPSPipeMountPath, SubPathExpr: mpsSubPathExpr}
}

func isMPSMount(m corev1.VolumeMount) bool {
	return m.Name == MPSVolume && m.MountPath == MPSPipeMountPath && m.SubPathExpr == mpsSubPathExpr && m.SubPath == "" &&
		!m.ReadOnly && m.RecursiveReadOnly == nil && (m.MountPropagation == nil || *m.MountPropagation == corev1.MountPropagationNone)
}

// isPartitaMPSVolume reports whether v is the MPS volume exactly as Partita
// adds it.
func isPartitaMPSVolume(v corev1.Volume, mpsDir string) bool {
	want := mpsVolume(mpsDir)
	return v.Name == want.Name && v.HostPath != nil && v.HostPath.Path == want.HostPath.Path &&
		v.HostPath.Type != nil && *v.HostPath.Type == *want.HostPath.Type
}

// cdiAnnotationErrors refuses CDI device requests in annotations.
func cdiAnnotationErrors(annotations map[string]string) field.ErrorList {
	var errs field.ErrorList
	for _, k := range sortedKeys(annotations) {
		if strings.HasPrefix(k, cdiAnnotationPrefix) {
			errs = append(errs, field.Forbidden(annotationsPath().Key(k), cdiText))
		}
	}
	return errs
}

// changedCDIAnnotations refuses an update that adds or changes a CDI
// device request.
func changedCDIAnnotations(old, updated map[string]string) field.ErrorList {
	var errs field.ErrorList
	for _, k := range sortedKeys(updated) {
		if ov, ok := old[k]; strings.HasPrefix(k, cdiAnnotationPrefix) && (!ok || ov != updated[k]) {
			errs = append(errs, field.Forbidden(annotationsPath().Key(k), cdiText))
		}
	}
	return errs
}

// specCheck says which parts of a pod spec podSpecErrors looks at.
type specCheck struct {
	// gpuPod: the pod asks for GPUs (privileged is refused).
	gpuPod bool
	// gpuContainers are the GPU containers by name (they may mount
	// MPSVolume).
	gpuContainers map[string]gpu.ContainerRequest
	// create: the whole pod is new; otherwise only the ephemeral containers
	// that isNew reports are.
	create bool
	isNew  func(ephemeral string) bool
}

// podSpecErrors refuses the routes to a GPU that do not go through
// Partita: privileged containers in a pod that asks for GPUs, hostPaths
// that reach the devices or the MPS pipes, mounts of MPSVolume other than
// Partita's, mounts where the NVIDIA runtime reads device requests, and CDI
// annotations. It applies to everyone: Partita's own identities never need
// any of these in a namespace it manages.
func podSpecErrors(pod *corev1.Pod, mpsDir string, chk specCheck) field.ErrorList {
	var errs field.ErrorList
	if chk.create {
		errs = cdiAnnotationErrors(pod.Annotations)
	}
	type ctr struct {
		path  *field.Path
		c     *corev1.Container
		isGPU bool
	}
	var ctrs []ctr
	if chk.create {
		for i := range pod.Spec.Containers {
			c := &pod.Spec.Containers[i]
			_, isGPU := chk.gpuContainers[c.Name]
			ctrs = append(ctrs, ctr{field.NewPath("spec", "containers").Index(i), c, isGPU})
		}
		for i := range pod.Spec.InitContainers {
			ctrs = append(ctrs, ctr{field.NewPath("spec", "initContainers").Index(i), &pod.Spec.InitContainers[i], false})
		}
	}
	for i := range pod.Spec.EphemeralContainers {
		ec := &pod.Spec.EphemeralContainers[i]
		if chk.create || chk.isNew(ec.Name) {
			c := corev1.Container(ec.EphemeralContainerCommon)
			ctrs = append(ctrs, ctr{field.NewPath("spec", "ephemeralContainers").Index(i), &c, false})
		}
	}
	for _, c := range ctrs {
		if chk.gpuPod && c.c.SecurityContext != nil && c.c.SecurityContext.Privileged != nil && *c.c.SecurityContext.Privileged {
			errs = append(errs, field.Forbidden(c.path.Child("securityContext", "privileged"), privilegedText))
		}
	}
	if chk.create {
		for i, v := range pod.Spec.Volumes {
			p := field.NewPath("spec", "volumes").Index(i)
			if v.Name == MPSVolume && !isPartitaMPSVolume(v, mpsDir) {
				errs = append(errs, field.Forbidden(p.Child("name"), mpsVolumeText))
			}
			if v.HostPath == nil || isPartitaMPSVolume(v, mpsDir) {
				continue
			}
			if what := hostPathReach(nodePath(v.HostPath.Path), mpsDir); what != "" {
				errs = append(errs, field.Forbidden(p.Child("hostPath", "path"), fmt.Sprintf("%q reaches %s%s", v.HostPath.Path, what, hostPathTail)))
			}
		}
	}
	for _, c := range ctrs {
		for j, m := range c.c.VolumeMounts {
			p := c.path.Child("volumeMounts").Index(j)
			if m.Name == MPSVolume && (!c.isGPU || !isMPSMount(m)) {
				errs = append(errs, field.Forbidden(p, mpsMountText))
			}
			if reachesContainerDevices(m.MountPath) {
				errs = append(errs, field.Forbidden(p.Child("mountPath"), fmt.Sprintf("%q%s", m.MountPath, containerDevicesText)))
			}
		}
	}
	return errs
}
