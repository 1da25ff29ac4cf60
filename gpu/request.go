package gpu

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// Bounds on what a pod may ask for. Values outside them are refused as
// mistakes rather than scheduled as "never fits".
const (
	// MilliPerGPU is one whole device in milli-GPUs.
	MilliPerGPU int64 = 1000
	// MaxCount is the most devices one container may ask for.
	MaxCount = 64
	// MaxMemoryMiB is the most GPU memory one container may ask for per
	// device (1Ti).
	MaxMemoryMiB int64 = 1 << 20
	// MaxGPUContainerNameLen is the longest name a GPU container may have:
	// Partita writes per-container annotations such as
	// partita.dev/mem-limit.<container>, whose name part may not exceed 63
	// characters.
	MaxGPUContainerNameLen = 63 - len("mem-limit.")
	// maxValueLen bounds the annotation values ParsePod reads, so that a huge
	// string is refused before it is parsed or echoed into a message.
	maxValueLen = 64
)

// Dialect is the way a pod asked for GPUs (DESIGN §4).
type Dialect string

// Dialects ParsePod reads.
const (
	// DialectPartita is the canonical form: partita.dev/* annotations.
	DialectPartita Dialect = "partita"
	// DialectRunAI is Run:ai/KAI's gpu-fraction, gpu-memory and
	// gpu-fraction-num-devices annotations.
	DialectRunAI Dialect = "runai"
	// DialectHAMi is HAMi's nvidia.com/gpumem, nvidia.com/gpumem-percentage
	// and nvidia.com/gpucores container resources with nvidia.com/gpu.
	DialectHAMi Dialect = "hami"
	// DialectWholeGPU is nvidia.com/gpu alone: whole devices.
	DialectWholeGPU Dialect = "nvidia.com/gpu"
	// DialectClaims is a pod that asks for GPUs through ResourceClaims of
	// a GPU DeviceClass only (package dra, Demand): ParsePod never reports
	// it; the webhook and the admission loop make such a request, with no
	// containers, for the pod's queue and gang.
	DialectClaims Dialect = "resourceclaims"
)

// Placement selects how devices are chosen on a node.
type Placement string

// Placements.
const (
	// PlacementBinpack (the default) fills partly used devices first and
	// keeps whole devices free.
	PlacementBinpack Placement = "binpack"
	// PlacementSpread puts a slice on the emptiest device.
	PlacementSpread Placement = "spread"
)

// Keys of the foreign dialects ParsePod translates (DESIGN §4). Partita's own
// keys are in api/v1alpha1.
const (
	// AnnotationRunAIGPUFraction is Run:ai's fraction of one device.
	AnnotationRunAIGPUFraction = "gpu-fraction"
	// AnnotationRunAIGPUMemory is Run:ai's GPU memory per device, in MiB.
	AnnotationRunAIGPUMemory = "gpu-memory"
	// AnnotationRunAIGPUFractionNumDevices is Run:ai's device count for a
	// fraction or memory request.
	AnnotationRunAIGPUFractionNumDevices = "gpu-fraction-num-devices"
	// AnnotationRunAIPodGroup names a Run:ai/KAI pod group.
	AnnotationRunAIPodGroup = "pod-group-name"
	// LabelRunAIQueue names a Run:ai queue.
	LabelRunAIQueue = "runai/queue"
	// LabelKAIQueue names a KAI-Scheduler queue.
	LabelKAIQueue = "kai.scheduler/queue"
	// LabelCoschedulingPodGroup names a scheduler-plugins coscheduling group.
	LabelCoschedulingPodGroup = "scheduling.x-k8s.io/pod-group"

	// ResourceNVIDIAGPU is the NVIDIA device plugin's whole-device resource.
	ResourceNVIDIAGPU corev1.ResourceName = "nvidia.com/gpu"
	// ResourceHAMiGPUMem is HAMi's GPU memory per device, in MiB.
	ResourceHAMiGPUMem corev1.ResourceName = "nvidia.com/gpumem"
	// ResourceHAMiGPUMemPercentage is HAMi's share of a device's memory, in
	// percent.
	ResourceHAMiGPUMemPercentage corev1.ResourceName = "nvidia.com/gpumem-percentage"
	// ResourceHAMiGPUCores is HAMi's share of a device's compute, in percent.
	ResourceHAMiGPUCores corev1.ResourceName = "nvidia.com/gpucores"
)

// PodRequest is a pod's GPU request in canonical form, whatever dialect the
// pod was written in.
type PodRequest struct {
	// Namespace is the pod's namespace.
	Namespace string
	// Name is the pod's name (empty in the webhook for a generateName pod).
	Name string
	// UID is the pod's UID (empty in the webhook, before the API server has
	// assigned it).
	UID types.UID
	// Dialect is the dialect the pod was written in. A pod that carries both
	// canonical keys and (consistent) foreign annotations, as a Run:ai pod
	// does after the webhook, reports the foreign dialect; HAMi's and
	// nvidia.com/gpu resources are removed by ApplyCanonical, so such a pod
	// reads as Partita's own afterwards.
	Dialect Dialect
	// Containers are the GPU containers in spec order. Every one carries the
	// same request: per-container differences are refused.
	Containers []ContainerRequest
	// Queue is the leaf queue, empty when the pod names none.
	Queue string
	// PodGroup is the gang, empty when the pod belongs to none.
	PodGroup string
	// Placement is the pod's own placement preference, empty for the default.
	Placement Placement
	// Topology is what the pod asks of the network's topology
	// (partita.dev/topology*, KAI's or Kueue's keys), zero for nothing. The
	// admission loop reads a gang's from its PodGroup first.
	Topology v1alpha1.TopologyRequest
	// SubGroup is the sub-group of its gang the pod belongs to
	// (partita.dev/sub-group or KAI's label), empty for none.
	SubGroup string
}

// ContainerRequest is one GPU container's request.
//
// Exactly one of Milli and MemoryMiB describes the per-device amount:
// a fraction or whole device (Milli in 1..1000, MemoryMiB 0), or an amount of
// GPU memory (MemoryMiB > 0, Milli 0), whose share of a device depends on the
// device (see MilliOn).
type ContainerRequest struct {
	// Name is the container's name.
	Name string
	// Index is the container's position in spec.containers.
	Index int
	// Count is the number of devices, each holding the per-device amount.
	Count int
	// Milli is the share of each device in milli-GPUs (1000 = whole), 0 when
	// the request is memory-based.
	Milli int64
	// MemoryMiB is the GPU memory per device, 0 when the request is a
	// fraction or whole devices.
	MemoryMiB int64
	// CoresPercent is the compute (SM) limit in percent, 0 for none.
	CoresPercent int32
}

// Whole reports whether the container asks for whole devices.
func (c ContainerRequest) Whole() bool {
	return c.Milli == MilliPerGPU && c.MemoryMiB == 0
}

// MilliOn is the container's per-device share, in milli-GPUs, of a device
// with deviceMemoryMiB of memory. A memory-based request takes
// ceil(memory × 1000 / device memory), capped at 1000 (whether the memory
// fits at all is a separate check); a device of unknown memory counts as
// taken whole.
func (c ContainerRequest) MilliOn(deviceMemoryMiB int64) int64 {
	if c.MemoryMiB == 0 {
		return c.Milli
	}
	return milliForMemory(c.MemoryMiB, deviceMemoryMiB)
}

func milliForMemory(memMiB, deviceMemoryMiB int64) int64 {
	if deviceMemoryMiB <= 0 || memMiB >= deviceMemoryMiB {
		return MilliPerGPU
	}
	return max(1, (memMiB*MilliPerGPU+deviceMemoryMiB-1)/deviceMemoryMiB)
}

// MilliResource is the container's partita.dev/gpu-milli: count × the
// per-device share. A memory-based request is estimated against
// referenceDeviceMemoryMiB and rounded down, at least 1 per device, so that
// it stays a lower bound when the reference is the largest device memory in
// the cluster: kube-scheduler's node-level check must never refuse a node on
// which the extender would find room. A reference of 0 or less counts 1 per
// device.
func (c ContainerRequest) MilliResource(referenceDeviceMemoryMiB int64) resource.Quantity {
	per := c.Milli
	if c.MemoryMiB > 0 {
		per = 1
		if referenceDeviceMemoryMiB > 0 {
			per = min(MilliPerGPU, max(1, c.MemoryMiB*MilliPerGPU/referenceDeviceMemoryMiB))
		}
	}
	return *resource.NewQuantity(int64(c.Count)*per, resource.DecimalSI)
}

// milliRange is the range of partita.dev/gpu-milli values consistent with c:
// exact for fractions and whole devices, count..count×1000 for memory-based
// requests, whose estimate depends on the reference memory.
func (c ContainerRequest) milliRange() (lo, hi int64) {
	if c.MemoryMiB > 0 {
		return int64(c.Count), int64(c.Count) * MilliPerGPU
	}
	return int64(c.Count) * c.Milli, int64(c.Count) * c.Milli
}

// CanonicalAnnotations are the canonical request annotations for r: either
// partita.dev/gpu-fraction or partita.dev/gpu-memory (neither for whole
// devices), partita.dev/gpu-count always, and partita.dev/gpu-cores,
// partita.dev/placement and the partita.dev/topology* keys when set.
func (r *PodRequest) CanonicalAnnotations() map[string]string {
	if r == nil {
		return map[string]string{}
	}
	out := TopologyCanonicalAnnotations(r.Topology)
	if len(r.Containers) == 0 {
		return out
	}
	c := r.Containers[0]
	switch {
	case c.MemoryMiB > 0:
		out[v1alpha1.AnnotationGPUMemory] = resource.NewQuantity(c.MemoryMiB<<20, resource.BinarySI).String()
	case !c.Whole():
		out[v1alpha1.AnnotationGPUFraction] = FormatMilli(c.Milli)
	}
	out[v1alpha1.AnnotationGPUCount] = strconv.Itoa(c.Count)
	if c.CoresPercent > 0 {
		out[v1alpha1.AnnotationGPUCores] = strconv.Itoa(int(c.CoresPercent))
	}
	if r.Placement != "" {
		out[v1alpha1.AnnotationPlacement] = string(r.Placement)
	}
	return out
}

// CanonicalLabels are the canonical queue, pod-group and sub-group labels
// for r, each present when set.
func (r *PodRequest) CanonicalLabels() map[string]string {
	out := map[string]string{}
	if r == nil {
		return out
	}
	if r.Queue != "" {
		out[v1alpha1.LabelQueue] = r.Queue
	}
	if r.PodGroup != "" {
		out[v1alpha1.LabelPodGroup] = r.PodGroup
	}
	if r.SubGroup != "" {
		out[v1alpha1.LabelSubGroup] = r.SubGroup
	}
	return out
}

// CanonicalRequestAnnotations are the annotations ApplyCanonical owns: it
// writes those CanonicalAnnotations names and removes the others.
func CanonicalRequestAnnotations() [8]string {
	return [...]string{
		v1alpha1.AnnotationGPUFraction,
		v1alpha1.AnnotationGPUMemory,
		v1alpha1.AnnotationGPUCount,
		v1alpha1.AnnotationGPUCores,
		v1alpha1.AnnotationPlacement,
		v1alpha1.AnnotationTopology,
		v1alpha1.AnnotationTopologyRequired,
		v1alpha1.AnnotationTopologyPreferred,
	}
}

// ApplyCanonical returns a copy of pod rewritten in the canonical form of req
// (as ParsePod returned it for this pod): the canonical annotations and
// labels, and partita.dev/gpu-milli (requests and limits, see
// MilliResource) on every GPU container. The user's own keys, in any
// dialect, stay; canonical request annotations that req does not need are
// removed. The webhook diffs the result into its JSON patch. Parsing the
// result gives req again, and applying it twice changes nothing.
func ApplyCanonical(pod *corev1.Pod, req *PodRequest, referenceDeviceMemoryMiB int64) *corev1.Pod {
	out := pod.DeepCopy()
	if req == nil {
		return out
	}
	if out.Annotations == nil {
		out.Annotations = map[string]string{}
	}
	for _, k := range CanonicalRequestAnnotations() {
		delete(out.Annotations, k)
	}
	for k, v := range req.CanonicalAnnotations() {
		out.Annotations[k] = v
	}
	if labels := req.CanonicalLabels(); len(labels) > 0 {
		if out.Labels == nil {
			out.Labels = map[string]string{}
		}
		for k, v := range labels {
			out.Labels[k] = v
		}
	}
	for _, c := range req.Containers {
		if c.Index < 0 || c.Index >= len(out.Spec.Containers) {
			continue
		}
		res := &out.Spec.Containers[c.Index].Resources
		q := c.MilliResource(referenceDeviceMemoryMiB)
		if res.Requests == nil {
			res.Requests = corev1.ResourceList{}
		}
		if res.Limits == nil {
			res.Limits = corev1.ResourceList{}
		}
		res.Requests[v1alpha1.ResourceGPUMilli] = q
		res.Limits[v1alpha1.ResourceGPUMilli] = q.DeepCopy()
		// The foreign resources are read into the canonical annotations;
		// left in place they would ask kube-scheduler for resources that
		// Partita's nodes do not advertise (NVIDIA's device plugin is off
		// there), and the pod would never schedule.
		for _, r := range ForeignResourceNames() {
			delete(res.Requests, r)
			delete(res.Limits, r)
		}
	}
	return out
}

// FormatMilli writes milli-GPUs as a decimal number of GPUs: 250 → "0.25",
// 1000 → "1", 1500 → "1.5".
func FormatMilli(milli int64) string {
	sign := ""
	if milli < 0 {
		sign, milli = "-", -milli
	}
	whole, frac := milli/MilliPerGPU, milli%MilliPerGPU
	if frac == 0 {
		return sign + strconv.FormatInt(whole, 10)
	}
	return sign + strings.TrimRight(fmt.Sprintf("%d.%03d", whole, frac), "0")
}

// FormatHours writes GPU-hours (a queue's usage) whole from 100, with at
// most one decimal below, and with one significant digit below 0.1, so that
// a little use does not read as none: 410.4 → "410", 12.46 → "12.5",
// 0.04 → "0.04".
func FormatHours(h float64) string {
	switch {
	case h >= 100:
		return strconv.FormatFloat(math.Round(h), 'f', -1, 64)
	case h >= 0.1 || h == 0:
		return strconv.FormatFloat(math.Round(h*10)/10, 'f', -1, 64)
	}
	return strconv.FormatFloat(h, 'g', 1, 64)
}

// ParsePod reads pod's GPU request in any dialect of DESIGN §4 and returns it
// in canonical form, nil and nil when the pod asks for no GPU, or the
// problems found, each with its path, the value, what is allowed and how to
// fix it.
//
// Which containers are GPU containers: those that name partita.dev/gpu-milli,
// nvidia.com/gpu or a HAMi resource, or (with canonical annotations, as the
// webhook writes a pod in dra mode) use a pod claim named
// v1alpha1.PodClaimPrefix+index; when none does and the request is
// written as pod annotations (canonical or Run:ai), the first container.
// Pod-level annotations apply to every GPU container.
//
// ParsePod refuses:
//   - a value that does not parse or is out of range (fraction outside
//     (0, 1], memory under 1Mi or over 1Ti per device, count outside 1..64,
//     cores outside 1..100, NaN, negative, longer than 64 characters);
//   - a fraction and an amount of memory together;
//   - two foreign dialects in one pod (Run:ai with HAMi or nvidia.com/gpu),
//     naming both keys; canonical keys may accompany one foreign dialect only
//     if they ask for the same thing;
//   - GPU containers that ask for different amounts;
//   - partita.dev/gpu-milli set without any request that explains it, or
//     set to a value other than the one ApplyCanonical would write (for a
//     memory-based request, anything in count..count×1000 is accepted);
//   - GPU resources on init containers, and GPU containers whose names are
//     longer than MaxGPUContainerNameLen;
//   - queue or pod-group names that disagree across dialects or are not valid
//     object names, and an unknown placement;
//   - a topology request or sub-group (ParseTopology, ParseSubGroup) whose
//     levels are not label keys, whose Topology is not a valid name, or
//     whose dialects disagree.
//
// Only a pod that asks for GPUs has its topology keys read: on any other
// they are not Partita's to check.
func ParsePod(pod *corev1.Pod) (*PodRequest, field.ErrorList) {
	if pod == nil {
		return nil, nil
	}
	p := &parser{pod: pod}
	return p.parse()
}

// QueueAndGroup reads a pod's queue and pod group from the labels and
// annotations of every dialect, as ParsePod does, for a pod that asks for
// GPUs by other means (ResourceClaims): names that disagree across dialects
// or are not valid object names are errors.
func QueueAndGroup(pod *corev1.Pod) (queue, podGroup string, errs field.ErrorList) {
	p := &parser{pod: pod}
	queue = p.pickName("Queue", []origin{
		p.label(v1alpha1.LabelQueue), p.label(LabelRunAIQueue), p.label(LabelKAIQueue),
	})
	podGroup = p.pickName("PodGroup", []origin{
		p.label(v1alpha1.LabelPodGroup), p.annotation(AnnotationRunAIPodGroup), p.label(LabelCoschedulingPodGroup),
	})
	return queue, podGroup, p.errs
}

// origin says where a part of a request was written, for messages.
type origin struct {
	path *field.Path
	raw  string
}

func (o origin) set() bool { return o.path != nil }

// String is the path and the value, for messages.
func (o origin) String() string {
	return fmt.Sprintf("%s=%q", o.path, o.raw)
}

// claim is one dialect's reading of the request, before the dialects are
// merged. Amount and count are always set when the claim is; cores only when
// written.
type claim struct {
	dialect    Dialect
	milli      int64
	memMiB     int64
	amountFrom origin
	count      int
	countFrom  origin
	cores      int32
	coresFrom  origin
}

func (c *claim) describeAmount() string {
	switch {
	case c.memMiB > 0:
		return fmt.Sprintf("%dMiB of GPU memory", c.memMiB)
	case c.milli == MilliPerGPU:
		return "whole GPUs"
	default:
		return FormatMilli(c.milli) + " of a GPU"
	}
}

// parser collects the problems of one pod.
type parser struct {
	pod  *corev1.Pod
	errs field.ErrorList
}

func annotationsPath() *field.Path { return field.NewPath("metadata", "annotations") }
func labelsPath() *field.Path      { return field.NewPath("metadata", "labels") }
func containersPath() *field.Path  { return field.NewPath("spec", "containers") }

func (p *parser) invalid(path *field.Path, raw, detail string) {
	p.errs = append(p.errs, field.Invalid(path, shorten(raw), detail))
}

// shorten keeps an echoed value readable.
func shorten(s string) string {
	if len(s) <= maxValueLen {
		return s
	}
	return s[:maxValueLen] + "..."
}

func (p *parser) parse() (*PodRequest, field.ErrorList) {
	p.checkInitContainers()
	ctrs := p.scanContainers()
	canon, canonPresent := p.canonicalClaim()
	runai, runaiPresent := p.runaiClaim()

	var hami, nvidia, milli []*containerInfo
	for _, c := range ctrs {
		if c.hami() {
			hami = append(hami, c)
		}
		if c.gpu.set() {
			nvidia = append(nvidia, c)
		}
		if c.milliFrom.set() {
			milli = append(milli, c)
		}
	}
	podLevel := canonPresent || runaiPresent
	if !podLevel && len(hami) == 0 && len(nvidia) == 0 && len(milli) == 0 {
		if len(p.errs) > 0 {
			return nil, p.errs
		}
		return nil, nil
	}

	// At most one foreign dialect.
	var foreign *claim
	switch {
	case runaiPresent && (len(hami) > 0 || len(nvidia) > 0):
		var other origin
		if len(hami) > 0 {
			other = hami[0].firstHAMi()
		} else {
			other = nvidia[0].gpu
		}
		key := p.firstPresent(annotationsPath(), p.pod.Annotations, AnnotationRunAIGPUFraction, AnnotationRunAIGPUMemory, AnnotationRunAIGPUFractionNumDevices)
		p.invalid(key.path, key.raw, fmt.Sprintf("Run:ai request conflicts with %s; a pod asks for GPUs in one dialect: remove one of them", other))
	case len(hami) > 0:
		foreign = p.hamiClaim(ctrs)
	case len(nvidia) > 0:
		foreign = p.wholeClaim(nvidia)
	case runaiPresent:
		foreign = runai
	}

	// The GPU containers.
	var gpuCtrs []*containerInfo
	for _, c := range ctrs {
		if c.hami() || c.gpu.set() || c.milliFrom.set() || (podLevel && c.claim) {
			gpuCtrs = append(gpuCtrs, c)
		}
	}
	if len(gpuCtrs) == 0 && len(ctrs) > 0 {
		gpuCtrs = ctrs[:1]
	}
	if len(gpuCtrs) == 0 {
		p.errs = append(p.errs, field.Required(containersPath(), "a pod that asks for GPUs needs a container"))
	}

	merged := p.merge(canon, foreign)
	if merged == nil && !canonPresent && !runaiPresent && len(hami) == 0 && len(nvidia) == 0 {
		c := milli[0]
		p.invalid(c.milliFrom.path, c.milliFrom.raw, "partita.dev/gpu-milli is set by Partita's webhook; ask with the annotation partita.dev/gpu-fraction, partita.dev/gpu-memory or partita.dev/gpu-count, or the resource nvidia.com/gpu, and leave partita.dev/gpu-milli out")
	}

	req := &PodRequest{
		Namespace: p.pod.Namespace,
		Name:      p.pod.Name,
		UID:       p.pod.UID,
		Dialect:   DialectPartita,
	}
	if foreign != nil {
		req.Dialect = foreign.dialect
	}
	for _, c := range gpuCtrs {
		if len(c.name) > MaxGPUContainerNameLen {
			p.invalid(containersPath().Index(c.index).Child("name"), c.name,
				fmt.Sprintf("a GPU container's name may have at most %d characters, because Partita writes it into annotation names; shorten it", MaxGPUContainerNameLen))
		}
		if merged == nil {
			continue
		}
		cr := ContainerRequest{
			Name:         c.name,
			Index:        c.index,
			Count:        merged.count,
			Milli:        merged.milli,
			MemoryMiB:    merged.memMiB,
			CoresPercent: merged.cores,
		}
		if c.milliFrom.set() {
			lo, hi := cr.milliRange()
			if c.milli < lo || c.milli > hi {
				want := strconv.FormatInt(lo, 10)
				if lo != hi {
					want = fmt.Sprintf("between %d and %d", lo, hi)
				}
				p.invalid(c.milliFrom.path, c.milliFrom.raw, fmt.Sprintf("does not match the request (%d × %s): must be %s; leave partita.dev/gpu-milli out, the webhook sets it", cr.Count, merged.describeAmount(), want))
			}
		}
		req.Containers = append(req.Containers, cr)
	}

	req.Queue = p.pickName("Queue", []origin{
		p.label(v1alpha1.LabelQueue), p.label(LabelRunAIQueue), p.label(LabelKAIQueue),
	})
	req.PodGroup = p.pickName("PodGroup", []origin{
		p.label(v1alpha1.LabelPodGroup), p.annotation(AnnotationRunAIPodGroup), p.label(LabelCoschedulingPodGroup),
	})
	if v, ok := p.pod.Annotations[v1alpha1.AnnotationPlacement]; ok {
		switch Placement(v) {
		case PlacementBinpack, PlacementSpread:
			req.Placement = Placement(v)
		default:
			p.invalid(annotationsPath().Key(v1alpha1.AnnotationPlacement), v, `must be "binpack" or "spread"; leave it out for the cluster's default`)
		}
	}
	topo, sub, errs := PodTopology(p.pod)
	p.errs = append(p.errs, errs...)
	req.Topology, req.SubGroup = topo, sub

	if len(p.errs) > 0 {
		return nil, p.errs
	}
	return req, nil
}

// merge checks that the canonical and the foreign claim agree and returns the
// request they make; canonical keys win where only they are set.
func (p *parser) merge(canon, foreign *claim) *claim {
	switch {
	case canon == nil:
		return foreign
	case foreign == nil:
		return canon
	}
	ok := true
	if canon.milli != foreign.milli || canon.memMiB != foreign.memMiB {
		p.invalid(canon.amountFrom.path, canon.amountFrom.raw, fmt.Sprintf("asks for %s, but %s asks for %s; remove one of them or make them agree", canon.describeAmount(), foreign.amountFrom, foreign.describeAmount()))
		ok = false
	}
	if canon.count != foreign.count {
		p.invalid(canon.countFrom.path, canon.countFrom.raw, fmt.Sprintf("asks for %d GPUs, but %s asks for %d; remove one of them or make them agree", canon.count, foreign.countFrom, foreign.count))
		ok = false
	}
	out := *canon
	if canon.coresFrom.set() && foreign.coresFrom.set() && canon.cores != foreign.cores {
		p.invalid(canon.coresFrom.path, canon.coresFrom.raw, fmt.Sprintf("conflicts with %s; remove one of them or make them agree", foreign.coresFrom))
		ok = false
	}
	if !canon.coresFrom.set() {
		out.cores, out.coresFrom = foreign.cores, foreign.coresFrom
	}
	if !ok {
		return nil
	}
	return &out
}

func (p *parser) label(key string) origin {
	v, ok := p.pod.Labels[key]
	if !ok || v == "" {
		return origin{}
	}
	return origin{path: labelsPath().Key(key), raw: v}
}

func (p *parser) annotation(key string) origin {
	v, ok := p.pod.Annotations[key]
	if !ok || v == "" {
		return origin{}
	}
	return origin{path: annotationsPath().Key(key), raw: v}
}

func (p *parser) firstPresent(base *field.Path, m map[string]string, keys ...string) origin {
	for _, k := range keys {
		if v, ok := m[k]; ok {
			return origin{path: base.Key(k), raw: v}
		}
	}
	return origin{}
}

// pickName returns the one name that all the set sources agree on.
func (p *parser) pickName(kind string, sources []origin) string {
	v, errs := agree(sources, kind, validation.IsDNS1123Subdomain, "must be the name of a "+kind)
	p.errs = append(p.errs, errs...)
	return v
}

// checkInitContainers refuses GPU resources on init containers: Partita
// assigns devices to regular containers only.
func (p *parser) checkInitContainers() {
	for i, c := range p.pod.Spec.InitContainers {
		for _, name := range gpuResourceNames() {
			for _, kind := range []string{"limits", "requests"} {
				list := c.Resources.Limits
				if kind == "requests" {
					list = c.Resources.Requests
				}
				if q, ok := list[name]; ok && !q.IsZero() {
					p.invalid(field.NewPath("spec", "initContainers").Index(i).Child("resources", kind).Key(string(name)), q.String(),
						"init containers cannot use GPUs under Partita; move the GPU work into a regular container")
				}
			}
		}
	}
}

// RequestAnnotations are the pod annotations whose presence, whatever their
// value, makes ParsePod read a GPU request: the canonical request keys and
// Run:ai's. With ResourceNames they say which pods ask for GPUs, for
// admission rules that cannot call ParsePod (the API server's CEL).
func RequestAnnotations() []string {
	return []string{
		v1alpha1.AnnotationGPUFraction, v1alpha1.AnnotationGPUMemory, v1alpha1.AnnotationGPUCount, v1alpha1.AnnotationGPUCores,
		AnnotationRunAIGPUFraction, AnnotationRunAIGPUMemory, AnnotationRunAIGPUFractionNumDevices,
	}
}

// ResourceNames are the container resources that make a GPU container when
// their quantity is not zero (on an init container, a refused request).
func ResourceNames() []corev1.ResourceName {
	names := gpuResourceNames()
	return names[:]
}

// ForeignResourceNames are the GPU resources of other dialects, which
// ApplyCanonical replaces with partita.dev/gpu-milli.
func ForeignResourceNames() []corev1.ResourceName {
	return []corev1.ResourceName{ResourceNVIDIAGPU, ResourceHAMiGPUMem, ResourceHAMiGPUMemPercentage, ResourceHAMiGPUCores}
}

// ForeignAnnotations and ForeignLabels are the keys of other dialects that
// ParsePod reads (requests, queues, gangs); Partita's own keys all start
// with partita.dev/.
func ForeignAnnotations() []string {
	return []string{AnnotationRunAIGPUFraction, AnnotationRunAIGPUMemory, AnnotationRunAIGPUFractionNumDevices, AnnotationRunAIPodGroup}
}

// ForeignLabels: see ForeignAnnotations.
func ForeignLabels() []string {
	return []string{LabelRunAIQueue, LabelKAIQueue, LabelCoschedulingPodGroup}
}

// gpuResourceNames are the container resources that make a GPU container.
func gpuResourceNames() [5]corev1.ResourceName {
	return [...]corev1.ResourceName{
		v1alpha1.ResourceGPUMilli, ResourceNVIDIAGPU, ResourceHAMiGPUMem, ResourceHAMiGPUMemPercentage, ResourceHAMiGPUCores,
	}
}

// containerInfo is what one container's resources say.
type containerInfo struct {
	index int
	name  string
	// gpu is nvidia.com/gpu: a count.
	gpu   origin
	count int
	// milliFrom is partita.dev/gpu-milli.
	milliFrom origin
	milli     int64
	// HAMi.
	mem      origin
	memMiB   int64
	pct      origin
	pctValue int64
	cores    origin
	coresPct int64
	// claim is set when the container uses one of Partita's pod claims
	// (v1alpha1.PodClaimPrefix), as the webhook writes in dra mode.
	claim bool
	// bad is set when a resource value was refused.
	bad bool
}

func (c *containerInfo) hami() bool {
	return c.mem.set() || c.pct.set() || c.cores.set()
}

func (c *containerInfo) firstHAMi() origin {
	for _, o := range []origin{c.mem, c.pct, c.cores} {
		if o.set() {
			return o
		}
	}
	return c.gpu
}

func (p *parser) scanContainers() []*containerInfo {
	out := make([]*containerInfo, 0, len(p.pod.Spec.Containers))
	for i := range p.pod.Spec.Containers {
		c := &p.pod.Spec.Containers[i]
		ci := &containerInfo{index: i, name: c.Name}
		var v int64
		if ci.gpu, v = p.intResource(c, i, ResourceNVIDIAGPU, 1, MaxCount, "the number of whole GPUs", &ci.bad); ci.gpu.set() {
			ci.count = int(v)
		}
		ci.milliFrom, ci.milli = p.intResource(c, i, v1alpha1.ResourceGPUMilli, 1, MaxCount*MilliPerGPU, "milli-GPUs", &ci.bad)
		ci.mem, ci.memMiB = p.intResource(c, i, ResourceHAMiGPUMem, 1, MaxMemoryMiB, "MiB of GPU memory per GPU", &ci.bad)
		ci.pct, ci.pctValue = p.intResource(c, i, ResourceHAMiGPUMemPercentage, 1, 100, "percent of each GPU's memory", &ci.bad)
		ci.cores, ci.coresPct = p.intResource(c, i, ResourceHAMiGPUCores, 1, 100, "percent of each GPU's compute", &ci.bad)
		for _, rc := range c.Resources.Claims {
			if strings.HasPrefix(rc.Name, v1alpha1.PodClaimPrefix) {
				ci.claim = true
			}
		}
		out = append(out, ci)
	}
	return out
}

// intResource reads an integer extended resource, preferring limits (which
// the API server copies into requests when only limits are set). A zero
// quantity asks for nothing and counts as unset. A refused value is reported,
// sets *bad, and still counts as set, so that the container stays a GPU
// container and no second error follows from its absence.
func (p *parser) intResource(c *corev1.Container, i int, name corev1.ResourceName, lo, hi int64, unit string, bad *bool) (origin, int64) {
	base := containersPath().Index(i).Child("resources")
	lim, hasLim := c.Resources.Limits[name]
	reqQ, hasReq := c.Resources.Requests[name]
	q, path := lim, base.Child("limits").Key(string(name))
	switch {
	case hasLim && hasReq && lim.Cmp(reqQ) != 0:
		p.invalid(base.Child("requests").Key(string(name)), reqQ.String(), fmt.Sprintf("differs from the limit %s; set them equal, or set only the limit", lim.String()))
		*bad = true
		return origin{path: path, raw: lim.String()}, 0
	case hasLim:
	case hasReq:
		q, path = reqQ, base.Child("requests").Key(string(name))
	default:
		return origin{}, 0
	}
	if q.IsZero() {
		return origin{}, 0
	}
	o := origin{path: path, raw: q.String()}
	if v, ok := q.AsInt64(); ok {
		o.raw = strconv.FormatInt(v, 10)
	}
	switch {
	case q.Sign() < 0 || q.Cmp(*resource.NewQuantity(hi, resource.DecimalSI)) > 0 || q.Cmp(*resource.NewQuantity(lo, resource.DecimalSI)) < 0:
		p.invalid(path, o.raw, fmt.Sprintf("must be a whole number from %d to %d (%s)", lo, hi, unit))
		*bad = true
		return o, 0
	case q.MilliValue()%1000 != 0:
		p.invalid(path, o.raw, fmt.Sprintf("must be a whole number from %d to %d (%s), not a fraction", lo, hi, unit))
		*bad = true
		return o, 0
	}
	return o, q.Value()
}

// parseFraction reads a decimal in (0, 1] into milli-GPUs, rounding up so a
// pod never gets less than it asked for. It accepts only digits and one dot,
// so NaN, infinities, exponents and signs are refused.
func parseFraction(s, wholeHint string) (int64, string) {
	syntax := `must be a decimal in (0, 1], such as "0.5"`
	if len(s) > maxValueLen {
		return 0, syntax + "; this value is too long"
	}
	intPart, fracPart, hasDot := strings.Cut(s, ".")
	if (intPart == "" && fracPart == "") || (hasDot && fracPart == "") || !allDigits(intPart) || !allDigits(fracPart) {
		return 0, syntax
	}
	intPart = strings.TrimLeft(intPart, "0")
	switch {
	case intPart == "":
	case intPart == "1" && strings.Trim(fracPart, "0") == "":
		return MilliPerGPU, ""
	default:
		return 0, "must be a decimal in (0, 1]; " + wholeHint
	}
	head := fracPart
	if len(head) > 3 {
		head = head[:3]
	}
	head += strings.Repeat("0", 3-len(head))
	milli, _ := strconv.ParseInt(head, 10, 64)
	if len(fracPart) > 3 && strings.Trim(fracPart[3:], "0") != "" {
		milli++
	}
	if milli == 0 {
		return 0, `must be greater than 0, such as "0.5"; leave it out if the pod needs no GPU`
	}
	return milli, ""
}

// parseSmallInt reads a plain decimal integer in [lo, hi].
func parseSmallInt(s string, lo, hi int64, what string) (int64, string) {
	detail := fmt.Sprintf("must be a whole number from %d to %d (%s)", lo, hi, what)
	if s == "" || len(s) > 12 || !allDigits(s) {
		return 0, detail
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v < lo || v > hi {
		return 0, detail
	}
	return v, ""
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
