package webhook

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
)

// Device env: what the container runtime and the isolation layers read
// (DESIGN §2.1, §8). Only Partita sets these.
const (
	// EnvVisibleDevices selects the devices the NVIDIA runtime mounts.
	EnvVisibleDevices = "NVIDIA_VISIBLE_DEVICES"
	// EnvMPSPinnedMemLimit is the MPS client's memory limit (mps mode).
	EnvMPSPinnedMemLimit = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
	// EnvMPSActiveThreads is the MPS client's share of SMs (mps mode).
	EnvMPSActiveThreads = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
	// EnvDeviceMemoryLimit is HAMi-core's memory limit (hami-core mode).
	EnvDeviceMemoryLimit = "CUDA_DEVICE_MEMORY_LIMIT"
	// EnvDeviceSMLimit is HAMi-core's compute limit (hami-core mode).
	EnvDeviceSMLimit = "CUDA_DEVICE_SM_LIMIT"
	// EnvMPSPipeDirectory is where an MPS client finds its device's control
	// daemon (mps mode): MPSPipeMountPath, where the container mounts
	// <mps-dir>/<device UUID>/pipe and nothing else of the MPS directory.
	EnvMPSPipeDirectory = "CUDA_MPS_PIPE_DIRECTORY"
	// EnvPartitaDevice is the UUID of the container's device, from its
	// allocation annotation; the kubelet expands it in the MPS mount's
	// subPathExpr.
	EnvPartitaDevice = "PARTITA_DEVICE"
	// VisibleDevicesVoid makes the NVIDIA runtime mount no device, whatever
	// the image sets.
	VisibleDevicesVoid = "void"
)

// DefaultMPSDir is the agent's default --mps-dir: the MPS daemons' pipe
// and log directories, one per device UUID.
const DefaultMPSDir = "/run/partita/mps"

// MPSVolume is the name of the hostPath volume of the MPS directory
// through which an MPS client reaches its device's daemon; only Partita
// adds and mounts it.
const MPSVolume = "partita-mps"

// MPSPipeMountPath is where an MPS client container sees its own device's
// pipe directory, <mps-dir>/<device UUID>/pipe (the agent's layout,
// nodeagent/mps.go): the mount's subPathExpr picks the device's directory
// when the container starts, so no container sees another device's pipe.
const MPSPipeMountPath = "/run/partita/mps-pipe"

// mpsSubPathExpr is the MPS mount's subPathExpr.
const mpsSubPathExpr = "$(" + EnvPartitaDevice + ")/pipe"

// Prefixes of env names that only Partita sets.
const (
	envPrefixMPS    = "CUDA_MPS_"
	envPrefixDevice = "CUDA_DEVICE_"
)

// isDeviceEnv reports whether only Partita may set the env var.
func isDeviceEnv(name string) bool {
	return name == EnvVisibleDevices || name == EnvPartitaDevice || strings.HasPrefix(name, envPrefixMPS) || strings.HasPrefix(name, envPrefixDevice)
}

// usesMPSPipe reports whether a GPU container connects to an MPS daemon when
// it lands on an mps node: a slice of one device (whole devices and slices
// over several devices run without MPS).
func usesMPSPipe(c gpu.ContainerRequest) bool { return c.Count == 1 && !c.Whole() }

// annotationRef is an env source that the kubelet resolves from the pod's
// annotation at container start. The annotation is written at bind; until
// then (and on a pod that never got devices) it resolves to "", which the
// NVIDIA runtime treats as no device.
func annotationRef(key string) *corev1.EnvVarSource {
	return &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{
		APIVersion: "v1",
		FieldPath:  "metadata.annotations['" + key + "']",
	}}
}

// deviceEnvFor is the device env of one GPU container, for the isolation
// modes that nodes in the cluster use: a pod is created before it is
// placed, so it carries the env of every mode it may land in; a layer that
// is not running ignores its variables. Memory limits come with slices
// only (whole devices have none), compute limits only when asked for.
func deviceEnvFor(c gpu.ContainerRequest, modes []v1alpha1.IsolationMode) []corev1.EnvVar {
	devices := annotationRef(v1alpha1.AnnotationDevicesPrefix + c.Name)
	out := []corev1.EnvVar{{Name: EnvVisibleDevices, ValueFrom: devices}}
	memRef := annotationRef(v1alpha1.AnnotationMemLimitPrefix + c.Name)
	smRef := annotationRef(v1alpha1.AnnotationSMLimitPrefix + c.Name)
	for _, m := range modes {
		switch m {
		case v1alpha1.IsolationMPS:
			if usesMPSPipe(c) {
				// The kubelet expands $(PARTITA_DEVICE) in the mount's
				// subPathExpr; off an mps node the directory has no daemon
				// and CUDA runs without MPS.
				out = append(out, corev1.EnvVar{Name: EnvPartitaDevice, ValueFrom: devices},
					corev1.EnvVar{Name: EnvMPSPipeDirectory, Value: MPSPipeMountPath})
			}
			if !c.Whole() {
				out = append(out, corev1.EnvVar{Name: EnvMPSPinnedMemLimit, ValueFrom: memRef})
			}
			if c.CoresPercent > 0 {
				out = append(out, corev1.EnvVar{Name: EnvMPSActiveThreads, ValueFrom: smRef})
			}
		case v1alpha1.IsolationHAMiCore:
			if !c.Whole() {
				out = append(out, corev1.EnvVar{Name: EnvDeviceMemoryLimit, ValueFrom: memRef})
			}
			if c.CoresPercent > 0 {
				out = append(out, corev1.EnvVar{Name: EnvDeviceSMLimit, ValueFrom: smRef})
			}
		}
	}
	return out
}

// addMPSMount mounts the container's own device's pipe directory (the
// daemons' directory is a hostPath, created empty on nodes without MPS,
// and the kubelet creates the device's directory in it if it is missing)
// into c, adding the pod's volume once.
func addMPSMount(pod *corev1.Pod, c *corev1.Container, mpsDir string) {
	if !slices.ContainsFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == MPSVolume }) {
		pod.Spec.Volumes = append(pod.Spec.Volumes, mpsVolume(mpsDir))
	}
	if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == MPSVolume }) {
		c.VolumeMounts = append(c.VolumeMounts, mpsMount())
	}
}

// mpsVolume is the hostPath volume of the daemons' directory.
func mpsVolume(mpsDir string) corev1.Volume {
	t := corev1.HostPathDirectoryOrCreate
	return corev1.Volume{Name: MPSVolume, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: mpsDir, Type: &t}}}
}

// voidEnv is the device env of a container without a GPU.
func voidEnv() []corev1.EnvVar {
	return []corev1.EnvVar{{Name: EnvVisibleDevices, Value: VisibleDevicesVoid}}
}

// addEnv appends each variable the container does not set yet. It never
// changes a variable the container sets: validation has checked those.
func addEnv(c *corev1.Container, vars []corev1.EnvVar) {
	for _, v := range vars {
		if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == v.Name }) {
			c.Env = append(c.Env, v)
		}
	}
}

// injectEnv writes the device env into every container of pod: the
// downward-API env on GPU containers, void on the others (init containers
// never get a GPU).
func injectEnv(pod *corev1.Pod, req *gpu.PodRequest, modes []v1alpha1.IsolationMode, mpsDir string) {
	gpuCtrs := gpuContainers(req)
	mps := slices.Contains(modes, v1alpha1.IsolationMPS)
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		if cr, ok := gpuCtrs[c.Name]; ok {
			addEnv(c, deviceEnvFor(cr, modes))
			if mps && usesMPSPipe(cr) {
				addMPSMount(pod, c, mpsDir)
			}
			continue
		}
		addEnv(c, voidEnv())
	}
	for i := range pod.Spec.InitContainers {
		addEnv(&pod.Spec.InitContainers[i], voidEnv())
	}
}

func gpuContainers(req *gpu.PodRequest) map[string]gpu.ContainerRequest {
	if req == nil {
		return nil
	}
	out := make(map[string]gpu.ContainerRequest, len(req.Containers))
	for _, c := range req.Containers {
		out[c.Name] = c
	}
	return out
}

// gpuEnvForm is the one form a device variable may take in a GPU
// container: a reference to one of the container's own allocation
// annotations (refPrefix + container name), or a fixed value.
type gpuEnvForm struct {
	name, refPrefix, value string
}

// gpuEnvForms are the device variables a GPU container may carry, as
// deviceEnvFor writes them; the CEL rules are built from the same table.
func gpuEnvForms() []gpuEnvForm {
	return []gpuEnvForm{
		{name: EnvVisibleDevices, refPrefix: v1alpha1.AnnotationDevicesPrefix},
		{name: EnvPartitaDevice, refPrefix: v1alpha1.AnnotationDevicesPrefix},
		{name: EnvMPSPipeDirectory, value: MPSPipeMountPath},
		{name: EnvMPSPinnedMemLimit, refPrefix: v1alpha1.AnnotationMemLimitPrefix},
		{name: EnvMPSActiveThreads, refPrefix: v1alpha1.AnnotationSMLimitPrefix},
		{name: EnvDeviceMemoryLimit, refPrefix: v1alpha1.AnnotationMemLimitPrefix},
		{name: EnvDeviceSMLimit, refPrefix: v1alpha1.AnnotationSMLimitPrefix},
	}
}

// allowedDeviceEnv is the one form each device variable may take in a
// container: gpuEnvForms on a GPU container, "void" on any other. Every
// other device variable is refused.
func allowedDeviceEnv(container string, isGPU bool) map[string]corev1.EnvVar {
	if !isGPU {
		return map[string]corev1.EnvVar{EnvVisibleDevices: {Name: EnvVisibleDevices, Value: VisibleDevicesVoid}}
	}
	forms := gpuEnvForms()
	out := make(map[string]corev1.EnvVar, len(forms))
	for _, f := range forms {
		if f.refPrefix != "" {
			out[f.name] = corev1.EnvVar{Name: f.name, ValueFrom: annotationRef(f.refPrefix + container)}
		} else {
			out[f.name] = corev1.EnvVar{Name: f.name, Value: f.value}
		}
	}
	return out
}

// envMatches compares a variable with its allowed form; the API server
// defaults fieldRef.apiVersion to v1, so an empty one counts as v1.
func envMatches(got, want corev1.EnvVar) bool {
	if got.Name != want.Name || got.Value != want.Value {
		return false
	}
	switch {
	case got.ValueFrom == nil || want.ValueFrom == nil:
		return got.ValueFrom == nil && want.ValueFrom == nil
	case got.ValueFrom.FieldRef == nil || want.ValueFrom.FieldRef == nil:
		return false
	}
	g, w := got.ValueFrom, want.ValueFrom
	if g.ConfigMapKeyRef != nil || g.SecretKeyRef != nil || g.ResourceFieldRef != nil || g.FileKeyRef != nil {
		return false
	}
	api := g.FieldRef.APIVersion
	if api == "" {
		api = "v1"
	}
	return api == w.FieldRef.APIVersion && g.FieldRef.FieldPath == w.FieldRef.FieldPath
}

// deviceEnvErrors refuses device env that the pod sets itself: any device
// variable not in its allowed form, in regular, init and ephemeral
// containers.
func deviceEnvErrors(pod *corev1.Pod, req *gpu.PodRequest) field.ErrorList {
	var errs field.ErrorList
	gpuCtrs := gpuContainers(req)
	check := func(path *field.Path, c *corev1.Container, kind containerKind) {
		isGPU := kind == kindGPU
		var allowed map[string]corev1.EnvVar
		for j, e := range c.Env {
			if !isDeviceEnv(e.Name) {
				continue
			}
			if allowed == nil {
				allowed = allowedDeviceEnv(c.Name, isGPU)
			}
			if want, ok := allowed[e.Name]; ok && envMatches(e, want) {
				continue
			}
			errs = append(errs, field.Forbidden(path.Index(j), deviceEnvMessage(e, kind)))
		}
	}
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		kind := kindPlain
		if _, isGPU := gpuCtrs[c.Name]; isGPU {
			kind = kindGPU
		}
		check(field.NewPath("spec", "containers").Index(i).Child("env"), c, kind)
	}
	for i := range pod.Spec.InitContainers {
		check(field.NewPath("spec", "initContainers").Index(i).Child("env"), &pod.Spec.InitContainers[i], kindPlain)
	}
	for i := range pod.Spec.EphemeralContainers {
		c := corev1.Container(pod.Spec.EphemeralContainers[i].EphemeralContainerCommon)
		check(field.NewPath("spec", "ephemeralContainers").Index(i).Child("env"), &c, kindEphemeral)
	}
	return errs
}

// containerKind says what a container is, for deviceEnvMessage.
type containerKind int

const (
	kindPlain containerKind = iota
	kindGPU
	kindEphemeral
)

// The tails of deviceEnvMessage, shared with the CEL rules.
const (
	envGPUText       = " is set by Partita from the devices assigned at bind: a pod cannot choose its own GPUs; remove it"
	envEphemeralText = ` is set by Partita: a debug container gets "void" and no GPU; remove it`
	envPlainText     = ` is set by Partita: a container without a GPU request gets "void"; remove it, or ask for a GPU (for example the annotation partita.dev/gpu-fraction)`
	envLimitText     = " is set by Partita for the node's isolation mode: a pod cannot set its own GPU limits; remove it"
	voidMissingText  = "NVIDIA_VISIBLE_DEVICES=void is missing: the container did not pass Partita's mutating webhook or mutating admission policy; " +
		"check that both are installed (docs/operations.md)"
)

func deviceEnvMessage(e corev1.EnvVar, kind containerKind) string {
	what := e.Name
	if e.Value != "" {
		what = fmt.Sprintf("%s=%q", e.Name, shorten(e.Value))
	}
	switch {
	case e.Name == EnvPartitaDevice:
		return what + envGPUText
	case e.Name != EnvVisibleDevices:
		return what + envLimitText
	case kind == kindGPU:
		return what + envGPUText
	case kind == kindEphemeral:
		return what + envEphemeralText
	}
	return what + envPlainText
}

// shorten keeps an echoed value readable.
func shorten(s string) string {
	const max = 64
	if len(s) <= max {
		return s
	}
	return s[:max] + "..."
}
