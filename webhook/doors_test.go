package webhook

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/internal/partitatest"
)

// door is one way a tenant tries to reach a GPU (or a pod that must pass),
// judged the same by the webhook alone, by the API server with the webhook,
// and by the API server's policies with the webhook down.
type door struct {
	pod *corev1.Pod
	// refused is part of the refusal, "" when the pod is admitted.
	refused string
	// down is what the API server says with the webhook down, when it is
	// not refused: a GPU pod is refused as unavailable (unavailableText),
	// a pod with Partita's keys by the validating webhook failing closed.
	down string
	// api is the API server's own validation, when it refuses first.
	api string
	// check looks at an admitted pod as the API server stored it.
	check func(t *testing.T, p *corev1.Pod)
}

const (
	doorNamespace = "team-a"
	// failedCalling is how the API server reports a webhook that does not
	// answer and fails closed.
	failedCalling = `failed calling webhook "` + WebhookValidatePods + `"`
	fakeUUID      = "GPU-00000000-0000-0000-0000-000000000000"
)

func plainPod(name string) *partitatest.PodWrapper {
	return partitatest.MakePod(name, doorNamespace).Container("main")
}

func gpuDoorPod(name string) *partitatest.PodWrapper {
	return plainPod(name).GPUFraction("0.5")
}

func devicesRef(container string) string {
	return "metadata.annotations['" + v1alpha1.AnnotationDevicesPrefix + container + "']"
}

func envOf(c corev1.Container, name string) (corev1.EnvVar, bool) {
	i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == name })
	if i < 0 {
		return corev1.EnvVar{}, false
	}
	return c.Env[i], true
}

// hasVoid checks that every named container (all when none are named) and
// init container got NVIDIA_VISIBLE_DEVICES=void.
func hasVoid(names ...string) func(*testing.T, *corev1.Pod) {
	return func(t *testing.T, p *corev1.Pod) {
		t.Helper()
		for _, c := range append(slices.Clone(p.Spec.Containers), p.Spec.InitContainers...) {
			if len(names) > 0 && !slices.Contains(names, c.Name) {
				continue
			}
			if e, ok := envOf(c, EnvVisibleDevices); !ok || e.Value != VisibleDevicesVoid || e.ValueFrom != nil {
				t.Errorf("container %s: %s = %+v (set %v), want void", c.Name, EnvVisibleDevices, e, ok)
			}
		}
	}
}

// isCanonical checks a GPU pod in Partita's form: gpu-milli, the devices
// env, the admission gate, and (the cluster has mps nodes) only its own
// device's MPS pipe mounted.
func isCanonical(gpuCtr string, voidCtrs ...string) func(*testing.T, *corev1.Pod) {
	return func(t *testing.T, p *corev1.Pod) {
		t.Helper()
		i := slices.IndexFunc(p.Spec.Containers, func(c corev1.Container) bool { return c.Name == gpuCtr })
		c := p.Spec.Containers[i]
		if _, ok := c.Resources.Limits[v1alpha1.ResourceGPUMilli]; !ok {
			t.Errorf("limits %v lack %s", c.Resources.Limits, v1alpha1.ResourceGPUMilli)
		}
		if e, _ := envOf(c, EnvVisibleDevices); e.ValueFrom == nil || e.ValueFrom.FieldRef.FieldPath != devicesRef(gpuCtr) {
			t.Errorf("%s = %+v, want it from %s", EnvVisibleDevices, e, devicesRef(gpuCtr))
		}
		if !v1alpha1.HasAdmissionGate(p) {
			t.Errorf("scheduling gates %v lack %s", p.Spec.SchedulingGates, v1alpha1.SchedulingGateAdmission)
		}
		if e, _ := envOf(c, EnvMPSPipeDirectory); e.Value != MPSPipeMountPath {
			t.Errorf("%s = %q, want %q", EnvMPSPipeDirectory, e.Value, MPSPipeMountPath)
		}
		if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
			return m.Name == MPSVolume && m.MountPath == MPSPipeMountPath && m.SubPathExpr == "$(PARTITA_DEVICE)/pipe" && m.SubPath == ""
		}) {
			t.Errorf("mounts %+v lack the device's own pipe directory", c.VolumeMounts)
		}
		if !slices.ContainsFunc(p.Spec.Volumes, func(v corev1.Volume) bool { return isPartitaMPSVolume(v, DefaultMPSDir) }) {
			t.Errorf("volumes %+v lack %s", p.Spec.Volumes, MPSVolume)
		}
		if len(voidCtrs) > 0 {
			hasVoid(voidCtrs...)(t, p)
		}
	}
}

// partitaMPSVolume is the volume as Partita writes it.
func partitaMPSVolume() corev1.Volume { return mpsVolume(DefaultMPSDir) }

// doors are the cases every layer must agree on.
func doors() map[string]door {
	hostPath := func(p string) *corev1.Pod { return plainPod("hp").HostPath("host", p).Obj() }
	const mpsReach = `reaches the MPS daemons' pipes of every GPU on the node (/run/partita/mps)`
	return map[string]door{
		// Pods that ask for no GPU: the policies alone decide them.
		"a pod without a GPU gets void":             {pod: plainPod("plain").InitContainer("init").Obj(), check: hasVoid()},
		"a privileged pod without a GPU gets void":  {pod: plainPod("priv").Privileged("main").Obj(), check: hasVoid()},
		"nvidia.com/gpu of 0 asks for nothing":      {pod: plainPod("zero").Limit("main", "nvidia.com/gpu", "0").Obj(), check: hasVoid()},
		"a hostPath that reaches nothing of a GPU":  {pod: plainPod("data").HostPath("a", "/var/log").HostPath("b", "/dev/shm").HostPath("c", "/run/containerd").Obj(), check: hasVoid()},
		"an emptyDir mounted where nothing is read": {pod: plainPod("mnt").EmptyDir("x").Mount("main", corev1.VolumeMount{Name: "x", MountPath: "/var/run/nvidia"}).Obj(), check: hasVoid()},
		"NVIDIA_VISIBLE_DEVICES=all without a GPU": {pod: plainPod("all").Env("main", EnvVisibleDevices, "all").Obj(),
			refused: `spec.containers[0].env[0]: Forbidden: NVIDIA_VISIBLE_DEVICES="all" is set by Partita: a container without a GPU request gets "void"`},
		"NVIDIA_VISIBLE_DEVICES=all in an init container": {pod: plainPod("init").InitContainer("init").Env("init", EnvVisibleDevices, "all").Obj(),
			refused: `spec.initContainers[0].env[0]: Forbidden: NVIDIA_VISIBLE_DEVICES="all"`},
		"an MPS pipe directory without a GPU": {pod: plainPod("pipe").Env("main", EnvMPSPipeDirectory, "/run/partita/mps/GPU-1/pipe").Obj(),
			refused: `spec.containers[0].env[0]: Forbidden: CUDA_MPS_PIPE_DIRECTORY="/run/partita/mps/GPU-1/pipe" is set by Partita for the node's isolation mode`},
		"a device annotation without a GPU": {pod: plainPod("spoof").Annotation(v1alpha1.AnnotationDevicesPrefix+"main", fakeUUID).Obj(),
			refused: "metadata.annotations[partita.dev/devices.main]: Forbidden: is written only by Partita when it binds the pod"},
		"hostPath /dev/nvidia0":     {pod: hostPath("/dev/nvidia0"), refused: `spec.volumes[0].hostPath.path: Forbidden: "/dev/nvidia0" reaches the node's GPU devices (/dev/nvidia*)`},
		"hostPath /dev/nvidiactl":   {pod: hostPath("/dev/nvidiactl"), refused: `"/dev/nvidiactl" reaches the node's GPU devices`},
		"hostPath /dev/char/195:0":  {pod: hostPath("/dev/char/195:0"), refused: `"/dev/char/195:0" reaches the node's GPU devices`},
		"hostPath /dev":             {pod: hostPath("/dev"), refused: `"/dev" reaches the node's GPU devices`},
		"hostPath /":                {pod: hostPath("/"), refused: `"/" reaches the node's GPU devices`},
		"hostPath the MPS dir":      {pod: hostPath("/run/partita/mps"), refused: `spec.volumes[0].hostPath.path: Forbidden: "/run/partita/mps" ` + mpsReach},
		"hostPath one device pipe":  {pod: hostPath("/run/partita/mps/GPU-1/pipe"), refused: mpsReach},
		"hostPath //run/./partita/": {pod: hostPath("//run/./partita/mps/"), refused: `"//run/./partita/mps/" ` + mpsReach},
		"hostPath relative":         {pod: hostPath("run/partita/mps"), refused: mpsReach},
		"hostPath through /var/run": {pod: hostPath("/var/run/partita/mps"), refused: mpsReach},
		"hostPath /run":             {pod: hostPath("/run"), refused: `"/run" ` + mpsReach},
		"hostPath with ..":          {pod: hostPath("/run/x/../partita/mps"), refused: mpsReach, api: "must not contain '..'"},
		"hostPath /run/nvidia/driver": {pod: hostPath("/run/nvidia/driver"),
			refused: `"/run/nvidia/driver" reaches the NVIDIA driver's and MPS files under /run/nvidia`},
		"hostPath of type CharDevice": {pod: plainPod("chr").Volume(corev1.Volume{Name: "gpu", VolumeSource: corev1.VolumeSource{
			HostPath: &corev1.HostPathVolumeSource{Path: "/dev/nvidia1", Type: ptr.To(corev1.HostPathCharDev)}}}).Obj(),
			refused: `"/dev/nvidia1" reaches the node's GPU devices`},
		"an emptyDir named like the MPS volume": {pod: plainPod("name").EmptyDir(MPSVolume).Obj(),
			refused: "spec.volumes[0].name: Forbidden: the volume partita-mps is added by Partita"},
		"a mount where the NVIDIA runtime reads devices": {pod: plainPod("cdev").EmptyDir("x").Mount("main", corev1.VolumeMount{Name: "x", MountPath: "/var/run/nvidia-container-devices/all"}).Obj(),
			refused: `spec.containers[0].volumeMounts[0].mountPath: Forbidden: "/var/run/nvidia-container-devices/all" is where the NVIDIA container runtime reads device requests`},
		"the same under /run": {pod: plainPod("cdev2").EmptyDir("x").Mount("main", corev1.VolumeMount{Name: "x", MountPath: "/run//nvidia-container-devices"}).Obj(),
			refused: `"/run//nvidia-container-devices" is where the NVIDIA container runtime reads device requests`},
		"a CDI annotation": {pod: plainPod("cdi").Annotation("cdi.k8s.io/gpu", "nvidia.com/gpu=all").Obj(),
			refused: "metadata.annotations[cdi.k8s.io/gpu]: Forbidden: asks the container runtime for devices directly (CDI)"},

		// Pods that ask for GPUs: the webhook canonicalises them; without
		// it the policies refuse them.
		"a GPU pod": {pod: gpuDoorPod("gpu").Container("sidecar").InitContainer("init").Obj(), check: isCanonical("main", "sidecar", "init"),
			down: unavailableText},
		"whole GPUs through nvidia.com/gpu": {pod: plainPod("whole").Limit("main", "nvidia.com/gpu", "1").Obj(), down: unavailableText,
			check: func(t *testing.T, p *corev1.Pod) {
				if q := p.Spec.Containers[0].Resources.Limits[v1alpha1.ResourceGPUMilli]; q.String() != "1k" {
					t.Errorf("gpu-milli = %s, want 1k", q.String())
				}
			}},
		"a queue label without a GPU": {pod: plainPod("labelled").Queue("team-a").Obj(), check: hasVoid(), down: failedCalling},
		"a privileged GPU container": {pod: gpuDoorPod("gpupriv").Privileged("main").Obj(),
			refused: "spec.containers[0].securityContext.privileged: Forbidden: a privileged container sees every device of the node"},
		"a privileged sidecar in a GPU pod": {pod: gpuDoorPod("privside").Container("sidecar").Privileged("sidecar").Obj(),
			refused: "spec.containers[1].securityContext.privileged: Forbidden"},
		"a privileged init container in a GPU pod": {pod: gpuDoorPod("privinit").InitContainer("init").Privileged("init").Obj(),
			refused: "spec.initContainers[0].securityContext.privileged: Forbidden"},
		"a GPU pod that mounts the MPS dir under another name": {pod: gpuDoorPod("gpuhp").HostPath("mps", "/run/partita/mps").Obj(),
			refused: `spec.volumes[0].hostPath.path: Forbidden: "/run/partita/mps" ` + mpsReach},
		"a GPU pod that mounts the MPS volume whole": {pod: gpuDoorPod("whole-mps").Volume(partitaMPSVolume()).
			Mount("main", corev1.VolumeMount{Name: MPSVolume, MountPath: "/mps"}).Obj(),
			refused: "spec.containers[0].volumeMounts[0]: Forbidden: the volume partita-mps is mounted by Partita only"},
		"a sidecar that mounts the GPU's pipe": {pod: gpuDoorPod("side-mps").Container("sidecar").Volume(partitaMPSVolume()).
			Mount("sidecar", mpsMount()).Obj(),
			refused: "spec.containers[1].volumeMounts[0]: Forbidden: the volume partita-mps is mounted by Partita only"},
		"a GPU pod with a device annotation": {pod: gpuDoorPod("gpuspoof").Annotation(v1alpha1.AnnotationDevicesPrefix+"main", fakeUUID).Obj(),
			refused: "metadata.annotations[partita.dev/devices.main]: Forbidden: is written only by Partita when it binds the pod"},
		"a GPU pod with a node annotation": {pod: gpuDoorPod("node").Annotation(v1alpha1.AnnotationNode, "gpu-node-0").Obj(),
			refused: "metadata.annotations[partita.dev/node]: Forbidden: is written only by Partita when it binds the pod"},
		"NVIDIA_VISIBLE_DEVICES=all on a GPU container": {pod: gpuDoorPod("gpuall").Env("main", EnvVisibleDevices, "all").Obj(),
			refused: `spec.containers[0].env[0]: Forbidden: NVIDIA_VISIBLE_DEVICES="all" is set by Partita from the devices assigned at bind`, down: unavailableText},
		"a GPU pod that names its own device": {pod: gpuDoorPod("own").Env("main", EnvPartitaDevice, fakeUUID).Obj(),
			refused: `PARTITA_DEVICE="` + fakeUUID + `" is set by Partita from the devices assigned at bind`, down: unavailableText},
		"a GPU in an init container": {pod: plainPod("initgpu").InitContainer("init").Limit("init", "nvidia.com/gpu", "1").Obj(),
			refused: "init containers cannot use GPUs under Partita", down: unavailableText},
		// Written by hand exactly as the webhook writes it: the webhook
		// admits it; with the webhook down the policies cannot tell, and
		// the validating webhook fails closed.
		"a GPU pod that forges the canonical form": {pod: gpuDoorPod("forged").Limit("main", v1alpha1.ResourceGPUMilli, "500").
			EnvFrom("main", EnvVisibleDevices, devicesRef("main")).SchedulingGates(v1alpha1.SchedulingGateAdmission).Obj(),
			check: isCanonical("main"), down: failedCalling},
	}
}

// TestDoorsWebhook: the webhook alone (mutate, then validate what it
// patched) refuses each door with its message.
func TestDoorsWebhook(t *testing.T) {
	h := newTestServer(t, testOptions{gate: true, modes: []v1alpha1.IsolationMode{v1alpha1.IsolationTimeSlicing, v1alpha1.IsolationMPS}})
	for name, d := range doors() {
		t.Run(name, func(t *testing.T) {
			raw, err := json.Marshal(d.pod)
			if err != nil {
				t.Fatal(err)
			}
			req := &admissionv1.AdmissionRequest{
				UID: types.UID("uid"), Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
				Resource: metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
				Name:     d.pod.Name, Namespace: d.pod.Namespace, Operation: admissionv1.Create,
				UserInfo: testUsers()[""], Object: runtime.RawExtension{Raw: raw},
			}
			m := outcomeOf(t, post(t, h, PathMutatePods, req))
			got, path := m, PathMutatePods
			if m.Allowed {
				req.Object.Raw = applyPatch(t, raw, m.Patch)
				got, path = outcomeOf(t, post(t, h, PathValidatePods, req)), PathValidatePods
			}
			switch {
			case d.refused == "" && !got.Allowed:
				t.Fatalf("%s refused it: %s", path, got.Status.Message)
			case d.refused != "" && got.Allowed:
				t.Fatalf("admitted, want a refusal with %q", d.refused)
			case d.refused != "" && !strings.Contains(got.Status.Message, d.refused):
				t.Fatalf("%s refused it with\n  %s\nwant it to contain\n  %s", path, got.Status.Message, d.refused)
			case d.refused == "" && d.check != nil:
				d.check(t, podOf(t, req.Object.Raw))
			}
		})
	}
}
