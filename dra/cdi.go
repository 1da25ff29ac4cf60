package dra

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/internal/durable"
	"github.com/partita-dev/partita/nodeagent/interposer"
)

// The CDI side of a prepared claim (docs/design.md, "GPU backends"). The
// kubelet plugin writes one CDI spec file per claim, with one CDI device per
// request of the claim; the container runtime applies its edits to the
// container's OCI spec after the pod's own env, so a container cannot
// change what its devices and limits are through its own env.

// CDIKind is the kind of Partita's CDI devices: vendor gpu.partita.dev,
// class claim. A device is "gpu.partita.dev/claim=<claim UID>-<request>".
const CDIKind = DriverName + "/claim"

// CDIVersion is the CDI spec version written: env and mounts need 0.3.0,
// annotations 0.6.0; containerd 2 reads it.
const CDIVersion = "0.6.0"

// DefaultCDIDir is where container runtimes look for dynamic CDI specs.
const DefaultCDIDir = "/var/run/cdi"

// Env and paths the CDI edits set: the same names as the webhook's device
// env in extender mode (webhook/env.go).
const (
	EnvVisibleDevices    = "NVIDIA_VISIBLE_DEVICES"
	EnvMPSPinnedMemLimit = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
	EnvMPSActiveThreads  = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
	EnvMPSPipeDirectory  = "CUDA_MPS_PIPE_DIRECTORY"
	EnvDeviceMemoryLimit = "CUDA_DEVICE_MEMORY_LIMIT"
	EnvDeviceSMLimit     = "CUDA_DEVICE_SM_LIMIT"
	// MPSPipeMountPath is where an MPS client sees its own device's pipe
	// directory, <mps-dir>/<UUID>/pipe, and nothing else of the MPS
	// directory.
	MPSPipeMountPath = "/run/partita/mps-pipe"
)

// annotationConsumed on a spec records what each of its devices consumes,
// "gpu-0=250/20480,gpu-1=...", so that a restarted plugin can check a new
// claim against the claims already prepared.
const annotationConsumed = DriverName + "/consumed"

// annotationNamespace on a spec records its claim's namespace: an MPS
// device serves one namespace (checkTenancy).
const annotationNamespace = DriverName + "/namespace"

// PreparedDevice is one allocated device of a request, resolved against the
// node's inventory.
type PreparedDevice struct {
	// Device is the DRA device name (gpu-0).
	Device string
	// UUID is the device's UUID.
	UUID string
	// Milli and MemoryMiB are what the allocation consumed of it.
	Milli, MemoryMiB int64
}

// PreparedRequest is what one request of a claim gives its containers.
type PreparedRequest struct {
	// Request is the request's name, with its subrequest ("gpu/mib81559").
	Request string
	// Devices are its devices, in allocation order.
	Devices []PreparedDevice
	// Whole is set when every device is held whole (no limits apply).
	Whole bool
	// SMLimitPercent is the compute limit asked for, 0 for none.
	SMLimitPercent int32
}

// CDINode is what a claim's CDI edits depend on besides the claim.
type CDINode struct {
	// Mode is the node's isolation mode.
	Mode v1alpha1.IsolationMode
	// MPSDir is where the node's MPS daemons keep their pipes.
	MPSDir string
	// InterposerDir is the host directory of the HAMi-core interposer and
	// its preload list (nodeagent/interposer), "" when it is not
	// installed.
	InterposerDir string
}

// CDISpec is the CDI spec of a prepared claim on node.
func CDISpec(claimUID types.UID, namespace string, reqs []PreparedRequest, node CDINode) *cdispec.Spec {
	spec := &cdispec.Spec{Version: CDIVersion, Kind: CDIKind, Annotations: map[string]string{annotationNamespace: namespace}}
	var consumed []string
	for _, r := range reqs {
		edits := containerEdits(r, node)
		spec.Devices = append(spec.Devices, cdispec.Device{Name: CDIDeviceName(claimUID, r.Request), ContainerEdits: edits})
		for _, d := range r.Devices {
			consumed = append(consumed, d.Device+"="+strconv.FormatInt(d.Milli, 10)+"/"+strconv.FormatInt(d.MemoryMiB, 10))
		}
	}
	spec.Annotations[annotationConsumed] = strings.Join(consumed, ",")
	return spec
}

// containerEdits are the env and mounts of one request: the devices, and per
// isolation mode the limits of a slice (whole devices have none); a
// hami-core slice also gets the interposer, read-only, and the preload
// list that loads it into every process.
func containerEdits(r PreparedRequest, node CDINode) cdispec.ContainerEdits {
	mode := interposer.SliceMode(node.Mode, len(r.Devices), node.InterposerDir != "")
	mpsDir := node.MPSDir
	uuids := make([]string, len(r.Devices))
	for i, d := range r.Devices {
		uuids[i] = d.UUID
	}
	edits := cdispec.ContainerEdits{Env: []string{EnvVisibleDevices + "=" + strings.Join(uuids, ",")}}
	if r.Whole || len(r.Devices) == 0 {
		return edits
	}
	// Every device of a request holds the same slice; the memory limit is
	// per device.
	memLimit := strconv.FormatInt(r.Devices[0].MemoryMiB, 10) + "M"
	switch mode {
	case v1alpha1.IsolationMPS:
		if len(r.Devices) == 1 {
			edits.Env = append(edits.Env, EnvMPSPipeDirectory+"="+MPSPipeMountPath)
			edits.Mounts = []*cdispec.Mount{{
				HostPath: MPSPipeDir(mpsDir, r.Devices[0].UUID), ContainerPath: MPSPipeMountPath,
				Type: "bind", Options: []string{"rbind", "rw", "nosuid", "nodev"},
			}}
		}
		edits.Env = append(edits.Env, EnvMPSPinnedMemLimit+"="+memLimit)
		if r.SMLimitPercent > 0 {
			edits.Env = append(edits.Env, EnvMPSActiveThreads+"="+strconv.Itoa(int(r.SMLimitPercent)))
		}
	case v1alpha1.IsolationHAMiCore:
		edits.Env = append(edits.Env, EnvDeviceMemoryLimit+"="+memLimit)
		if r.SMLimitPercent > 0 {
			edits.Env = append(edits.Env, EnvDeviceSMLimit+"="+strconv.Itoa(int(r.SMLimitPercent)))
		}
		if node.InterposerDir != "" {
			ro := []string{"bind", "ro", "nosuid", "nodev"}
			edits.Mounts = append(edits.Mounts,
				&cdispec.Mount{HostPath: node.InterposerDir, ContainerPath: interposer.ContainerDir, Type: "bind", Options: append([]string{"rbind"}, ro[1:]...)},
				&cdispec.Mount{HostPath: filepath.Join(node.InterposerDir, interposer.PreloadName), ContainerPath: interposer.ContainerPreload, Type: "bind", Options: ro})
		}
	}
	return edits
}

// MPSPipeDir is the pipe directory of the MPS daemon of device uuid, the
// agent's layout (nodeagent/mps.go).
func MPSPipeDir(mpsDir, uuid string) string { return filepath.Join(mpsDir, uuid, "pipe") }

var cdiNameUnsafe = regexp.MustCompile(`[^a-zA-Z0-9_.-]`)

// CDIDeviceName is the CDI device name of a claim's request: the claim UID
// (never reused, so a runtime's cache never serves an old spec) and the
// request.
func CDIDeviceName(claimUID types.UID, request string) string {
	return string(claimUID) + "-" + cdiNameUnsafe.ReplaceAllString(request, "_")
}

// CDIDeviceID is the qualified CDI device ID the kubelet hands the runtime.
func CDIDeviceID(claimUID types.UID, request string) string {
	return CDIKind + "=" + CDIDeviceName(claimUID, request)
}

// CDISpecPath is the file of a claim's spec in dir.
func CDISpecPath(dir string, claimUID types.UID) string {
	return filepath.Join(dir, strings.ReplaceAll(CDIKind, "/", "-")+"_"+string(claimUID)+".json")
}

// WriteCDISpec writes spec into dir atomically (a runtime never reads half
// a file).
func WriteCDISpec(dir string, claimUID types.UID, spec *cdispec.Spec) error {
	data, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return fmt.Errorf("encode CDI spec: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create CDI directory: %w", err)
	}
	// The temporary file is a dot file without .json: neither the
	// runtime's CDI cache nor PreparedConsumption reads it.
	if err := durable.WriteFile(CDISpecPath(dir, claimUID), data, 0o644); err != nil {
		return fmt.Errorf("write CDI spec: %w", err)
	}
	return nil
}

// RemoveCDISpec removes a claim's spec; a missing one is not an error.
func RemoveCDISpec(dir string, claimUID types.UID) error {
	if err := os.Remove(CDISpecPath(dir, claimUID)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove CDI spec: %w", err)
	}
	return nil
}

// Consumption is what prepared claims consume of one device.
type Consumption struct {
	Milli, MemoryMiB int64
	// Namespaces are the namespaces of the claims that consume the device,
	// sorted, once each; "" for a claim prepared by an agent that did not
	// record it.
	Namespaces []string
}

// PreparedConsumption reads the specs in dir and sums what the prepared
// claims other than except consume, per device name.
func PreparedConsumption(dir string, except types.UID) (map[string]Consumption, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return map[string]Consumption{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read CDI directory: %w", err)
	}
	prefix := strings.ReplaceAll(CDIKind, "/", "-") + "_"
	out := map[string]Consumption{}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, prefix) || !strings.HasSuffix(name, ".json") || name == filepath.Base(CDISpecPath(dir, except)) {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return nil, fmt.Errorf("read CDI spec: %w", err)
		}
		var spec cdispec.Spec
		if err := json.Unmarshal(data, &spec); err != nil {
			return nil, fmt.Errorf("read CDI spec %s: %w", name, err)
		}
		for _, part := range strings.Split(spec.Annotations[annotationConsumed], ",") {
			dev, amounts, ok := strings.Cut(part, "=")
			if !ok {
				continue
			}
			m, mem, _ := strings.Cut(amounts, "/")
			mi, err1 := strconv.ParseInt(m, 10, 64)
			me, err2 := strconv.ParseInt(mem, 10, 64)
			if err1 != nil || err2 != nil {
				continue
			}
			c := out[dev]
			c.Milli += mi
			c.MemoryMiB += me
			if ns := spec.Annotations[annotationNamespace]; !slices.Contains(c.Namespaces, ns) {
				c.Namespaces = append(c.Namespaces, ns)
				slices.Sort(c.Namespaces)
			}
			out[dev] = c
		}
	}
	return out, nil
}

// sortedKeys is for stable messages.
func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
