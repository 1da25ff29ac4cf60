package dra

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
)

// How the webhook turns a request into claims (docs/design.md, "GPU
// backends"). Each GPU container gets its own pod claim,
// v1alpha1.PodClaimPrefix+index, made by kube-controller-manager from a
// ResourceClaimTemplate in the pod's namespace. The template depends only on
// the request's shape and the device sizes of the cluster, so pods of one
// shape share one template, named after its content: TemplatePrefix, the
// shape, and a hash of the spec.
//
// A slice consumes both capacities in proportion, as the extender's ledger
// charges it (gpu.ContainerRequest.MilliOn): 0.25 of an 80Gi device takes
// 250 compute and 20Gi, 20Gi of it takes 250 compute too. Since that depends
// on the device, the request lists one alternative per device size in the
// cluster (firstAvailable, smallest first), each selecting its size by
// AttributeMemoryMiB. Whole devices ask for no capacity and so take all of
// both.

// TemplatePrefix starts the names of Partita's ResourceClaimTemplates.
const TemplatePrefix = "partita-gpu-"

// RequestName is the name of the one device request in Partita's claims.
const RequestName = "gpu"

// MaxSizes is the most device sizes one claim can tell apart (the API's
// limit on firstAvailable alternatives); a cluster with more takes the
// largest ones.
const MaxSizes = resourceapi.FirstAvailableDeviceRequestMaxSize

// LabelShape on a template says, in words, what it asks for ("1x0.25").
const LabelShape = DriverName + "/shape"

// SliceConfig is the opaque configuration of Partita's claims, for what the
// capacities cannot say: the compute limit a HAMi gpucores request asked
// for. The kubelet plugin reads it when it prepares the claim.
type SliceConfig struct {
	metav1.TypeMeta `json:",inline"`
	// SMLimitPercent is the compute limit in percent; 0 sets none.
	SMLimitPercent int32 `json:"smLimitPercent,omitempty"`
}

// SliceConfigKind is SliceConfig's kind, in API version DriverName/v1.
const SliceConfigKind = "SliceConfig"

// ErrNoDeviceSizes means that no device size is known yet, so a slice's
// claim cannot be written: no GPU node has reported its devices.
var ErrNoDeviceSizes = errors.New("no GPU node has reported its devices yet, so the size of a slice on them is not known; create the pod again once 'kubectl get gpunodes' lists a node")

// PodClaimName is the name of the pod claim of the GPU container at index.
func PodClaimName(containerIndex int) string {
	return v1alpha1.PodClaimPrefix + strconv.Itoa(containerIndex)
}

// Template is the ResourceClaimTemplate for one GPU container's request in
// namespace, on a cluster whose devices have the given memory sizes (MiB,
// any order, duplicates allowed). Its name is a function of its content.
func Template(namespace string, c gpu.ContainerRequest, sizesMiB []int64) (*resourceapi.ResourceClaimTemplate, error) {
	spec, err := claimSpec(c, sizesMiB)
	if err != nil {
		return nil, err
	}
	raw, err := json.Marshal(spec)
	if err != nil {
		return nil, fmt.Errorf("encode claim spec: %w", err)
	}
	sum := sha256.Sum256(raw)
	return &resourceapi.ResourceClaimTemplate{
		TypeMeta: metav1.TypeMeta{APIVersion: resourceapi.SchemeGroupVersion.String(), Kind: "ResourceClaimTemplate"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      TemplatePrefix + shapeName(c) + "-" + hex.EncodeToString(sum[:])[:10],
			Namespace: namespace,
			Labels:    map[string]string{LabelManagedBy: ManagedByPartita, LabelShape: shapeLabel(c)},
		},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: spec},
	}, nil
}

// shapeName is the request in a name: "1x250m", "2x20480mi", "4xwhole",
// with "-c30" for a compute limit.
func shapeName(c gpu.ContainerRequest) string {
	s := strconv.Itoa(c.Count) + "x"
	switch {
	case c.MemoryMiB > 0:
		s += strconv.FormatInt(c.MemoryMiB, 10) + "mi"
	case c.Whole():
		s += "whole"
	default:
		s += strconv.FormatInt(c.Milli, 10) + "m"
	}
	if c.CoresPercent > 0 {
		s += "-c" + strconv.Itoa(int(c.CoresPercent))
	}
	return s
}

// shapeLabel is the request in a label value: "1x0.25", "2x20Gi", "4x1".
func shapeLabel(c gpu.ContainerRequest) string {
	amount := gpu.FormatMilli(c.Milli)
	if c.MemoryMiB > 0 {
		m := mebibytes(c.MemoryMiB)
		amount = m.String()
	}
	s := strconv.Itoa(c.Count) + "x" + amount
	if c.CoresPercent > 0 {
		s += "_cores" + strconv.Itoa(int(c.CoresPercent))
	}
	return s
}

// claimSpec is the claim of one GPU container.
func claimSpec(c gpu.ContainerRequest, sizesMiB []int64) (resourceapi.ResourceClaimSpec, error) {
	var spec resourceapi.ResourceClaimSpec
	if c.Count < 1 || c.Count > gpu.MaxCount {
		return spec, fmt.Errorf("claim for %d devices: want 1 to %d", c.Count, gpu.MaxCount)
	}
	count := int64(c.Count)
	req := resourceapi.DeviceRequest{Name: RequestName}
	switch {
	case c.Whole():
		req.Exactly = &resourceapi.ExactDeviceRequest{
			DeviceClassName: DeviceClassName,
			AllocationMode:  resourceapi.DeviceAllocationModeExactCount,
			Count:           count,
		}
	default:
		sizes := fitting(c, sizesMiB)
		if len(sizes) == 0 {
			if c.MemoryMiB == 0 || len(sizesMiB) == 0 {
				return spec, ErrNoDeviceSizes
			}
			// No device is large enough: the claim asks for what it
			// wants, and waits (kube-scheduler says why) until one joins.
			req.Exactly = &resourceapi.ExactDeviceRequest{
				DeviceClassName: DeviceClassName,
				AllocationMode:  resourceapi.DeviceAllocationModeExactCount,
				Count:           count,
				Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
					CapacityCompute: *resource.NewQuantity(gpu.MilliPerGPU, resource.DecimalSI),
					CapacityMemory:  mebibytes(c.MemoryMiB),
				}},
			}
			break
		}
		for _, size := range sizes {
			milli, memMiB := SliceOn(c, size)
			req.FirstAvailable = append(req.FirstAvailable, resourceapi.DeviceSubRequest{
				Name:            SubRequestName(size),
				DeviceClassName: DeviceClassName,
				Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
					Expression: fmt.Sprintf("device.attributes[%q].%s == %d", DriverName, AttributeMemoryMiB, size),
				}}},
				AllocationMode: resourceapi.DeviceAllocationModeExactCount,
				Count:          count,
				Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
					CapacityCompute: *resource.NewQuantity(milli, resource.DecimalSI),
					CapacityMemory:  mebibytes(memMiB),
				}},
			})
		}
	}
	spec.Devices.Requests = []resourceapi.DeviceRequest{req}
	if c.CoresPercent > 0 {
		raw, err := json.Marshal(SliceConfig{
			TypeMeta:       metav1.TypeMeta{APIVersion: DriverName + "/v1", Kind: SliceConfigKind},
			SMLimitPercent: c.CoresPercent,
		})
		if err != nil {
			return spec, fmt.Errorf("encode slice config: %w", err)
		}
		spec.Devices.Config = []resourceapi.DeviceClaimConfiguration{{
			Requests: []string{RequestName},
			DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
				Driver: DriverName, Parameters: runtime.RawExtension{Raw: raw},
			}},
		}}
	}
	return spec, nil
}

// SubRequestName names the alternative for devices of sizeMiB: "mib81559".
func SubRequestName(sizeMiB int64) string { return "mib" + strconv.FormatInt(sizeMiB, 10) }

// fitting are the distinct sizes a slice fits on, smallest first (so that
// small slices keep the large devices free), at most MaxSizes of the
// largest.
func fitting(c gpu.ContainerRequest, sizesMiB []int64) []int64 {
	var out []int64
	for _, s := range sizesMiB {
		if s > 0 && c.MemoryMiB <= s && !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	slices.Sort(out)
	if len(out) > MaxSizes {
		out = out[len(out)-MaxSizes:]
	}
	return out
}

// SliceOn is what a slice consumes of a device of deviceMemoryMiB: compute
// in milli-GPUs and memory in MiB, each at least 1, the same amounts the
// extender's ledger charges (a fraction takes its share of the memory, an
// amount of memory ceil(1000 × memory / device memory) of the compute).
func SliceOn(c gpu.ContainerRequest, deviceMemoryMiB int64) (milli, memMiB int64) {
	milli = c.MilliOn(deviceMemoryMiB)
	memMiB = c.MemoryMiB
	if memMiB == 0 {
		memMiB = max(1, milli*deviceMemoryMiB/gpu.MilliPerGPU)
	}
	return milli, memMiB
}

// ApplyClaims returns a copy of pod (as gpu.ApplyCanonical wrote it for
// req) rewritten for the dra backend: partita.dev/gpu-milli comes off the GPU
// containers, and each uses its own pod claim made from the template of its
// request, which it returns (one per distinct request; the caller creates
// it). Pod claims and container references of Partita's that the pod
// already had are replaced, so applying it twice changes nothing.
func ApplyClaims(pod *corev1.Pod, req *gpu.PodRequest, sizesMiB []int64) (*corev1.Pod, []*resourceapi.ResourceClaimTemplate, error) {
	out := pod.DeepCopy()
	out.Spec.ResourceClaims = slices.DeleteFunc(out.Spec.ResourceClaims, func(c corev1.PodResourceClaim) bool {
		return strings.HasPrefix(c.Name, v1alpha1.PodClaimPrefix)
	})
	if len(out.Spec.ResourceClaims) == 0 {
		out.Spec.ResourceClaims = nil
	}
	for i := range out.Spec.Containers {
		res := &out.Spec.Containers[i].Resources
		res.Claims = slices.DeleteFunc(res.Claims, func(c corev1.ResourceClaim) bool {
			return strings.HasPrefix(c.Name, v1alpha1.PodClaimPrefix)
		})
		if len(res.Claims) == 0 {
			res.Claims = nil
		}
	}
	if req == nil {
		return out, nil, nil
	}
	var templates []*resourceapi.ResourceClaimTemplate
	for _, c := range req.Containers {
		if c.Index < 0 || c.Index >= len(out.Spec.Containers) {
			continue
		}
		t, err := Template(pod.Namespace, c, sizesMiB)
		if err != nil {
			return nil, nil, err
		}
		if !slices.ContainsFunc(templates, func(o *resourceapi.ResourceClaimTemplate) bool { return o.Name == t.Name }) {
			templates = append(templates, t)
		}
		name := PodClaimName(c.Index)
		out.Spec.ResourceClaims = append(out.Spec.ResourceClaims, corev1.PodResourceClaim{Name: name, ResourceClaimTemplateName: &t.Name})
		ctr := &out.Spec.Containers[c.Index]
		ctr.Resources.Claims = append(ctr.Resources.Claims, corev1.ResourceClaim{Name: name})
		delete(ctr.Resources.Requests, v1alpha1.ResourceGPUMilli)
		delete(ctr.Resources.Limits, v1alpha1.ResourceGPUMilli)
		if len(ctr.Resources.Requests) == 0 {
			ctr.Resources.Requests = nil
		}
		if len(ctr.Resources.Limits) == 0 {
			ctr.Resources.Limits = nil
		}
	}
	return out, templates, nil
}

// SizesOf are the distinct memory sizes (MiB) of the healthy devices of the
// given GPUNodes.
func SizesOf(nodes []v1alpha1.GPUNode) []int64 {
	var out []int64
	for i := range nodes {
		for _, d := range nodes[i].Status.Devices {
			if d.Health == v1alpha1.DeviceHealthy && d.MemoryMiB > 0 && !slices.Contains(out, d.MemoryMiB) {
				out = append(out, d.MemoryMiB)
			}
		}
	}
	slices.Sort(out)
	return out
}

// TemplateSizes are the device sizes a template of Partita's was written
// for, read back from its alternatives' names (SubRequestName).
func TemplateSizes(t *resourceapi.ResourceClaimTemplate) []int64 {
	var out []int64
	for _, r := range t.Spec.Spec.Devices.Requests {
		for _, s := range r.FirstAvailable {
			if v, err := strconv.ParseInt(strings.TrimPrefix(s.Name, "mib"), 10, 64); err == nil && strings.HasPrefix(s.Name, "mib") {
				out = append(out, v)
			}
		}
		if r.Exactly != nil && r.Exactly.Capacity != nil {
			// A memory slice larger than every device: any size below it
			// gives the same claim.
			out = append(out, 1)
		}
	}
	return out
}
