package gpu_test

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
	pt "github.com/partita-dev/partita/internal/partitatest"
)

const (
	gpuMilli  = v1alpha1.ResourceGPUMilli
	nvGPU     = gpu.ResourceNVIDIAGPU
	hamiMem   = gpu.ResourceHAMiGPUMem
	hamiPct   = gpu.ResourceHAMiGPUMemPercentage
	hamiCores = gpu.ResourceHAMiGPUCores
)

// req builds the expected request of a pod made by pt.MakePod("p", "ns").
func req(d gpu.Dialect, containers ...gpu.ContainerRequest) *gpu.PodRequest {
	return &gpu.PodRequest{Namespace: "ns", Name: "p", UID: "uid-ns-p", Dialect: d, Containers: containers}
}

func ctr(name string, index, count int, milli, memMiB int64, cores int32) gpu.ContainerRequest {
	return gpu.ContainerRequest{Name: name, Index: index, Count: count, Milli: milli, MemoryMiB: memMiB, CoresPercent: cores}
}

func with(r *gpu.PodRequest, f func(*gpu.PodRequest)) *gpu.PodRequest {
	f(r)
	return r
}

func TestParsePod(t *testing.T) {
	cases := map[string]struct {
		pod  *corev1.Pod
		want *gpu.PodRequest
	}{
		"no GPU": {
			pod: pt.MakePod("p", "ns").Resource("", corev1.ResourceCPU, "1").Obj(),
		},
		"placement, queue and group without a GPU request": {
			pod: pt.MakePod("p", "ns").Placement("spread").Queue("team-a").PodGroup("g").Obj(),
		},
		"zero nvidia.com/gpu asks for nothing": {
			pod: pt.MakePod("p", "ns").Resource("", nvGPU, "0").Obj(),
		},
		"canonical fraction": {
			pod:  pt.MakePod("p", "ns").GPUFraction("0.5").Obj(),
			want: req(gpu.DialectPartita, ctr("main", 0, 1, 500, 0, 0)),
		},
		"canonical fraction rounds up": {
			pod:  pt.MakePod("p", "ns").GPUFraction("0.3333").Obj(),
			want: req(gpu.DialectPartita, ctr("main", 0, 1, 334, 0, 0)),
		},
		"canonical tiny fraction is at least 1 milli": {
			pod:  pt.MakePod("p", "ns").GPUFraction("0.0001").Obj(),
			want: req(gpu.DialectPartita, ctr("main", 0, 1, 1, 0, 0)),
		},
		"canonical fraction without a leading zero": {
			pod:  pt.MakePod("p", "ns").GPUFraction(".25").Obj(),
			want: req(gpu.DialectPartita, ctr("main", 0, 1, 250, 0, 0)),
		},
		"canonical fraction 1.000 is a whole GPU": {
			pod:  pt.MakePod("p", "ns").GPUFraction("1.000").Obj(),
			want: req(gpu.DialectPartita, ctr("main", 0, 1, 1000, 0, 0)),
		},
		"canonical memory on two GPUs with queue, group and placement": {
			pod: pt.MakePod("p", "ns").GPUMemory("20Gi").GPUCount(2).Queue("team-a").PodGroup("train-1").Placement("spread").Obj(),
			want: with(req(gpu.DialectPartita, ctr("main", 0, 2, 0, 20480, 0)), func(r *gpu.PodRequest) {
				r.Queue, r.PodGroup, r.Placement = "team-a", "train-1", gpu.PlacementSpread
			}),
		},
		"canonical memory in decimal units rounds up to MiB": {
			pod:  pt.MakePod("p", "ns").GPUMemory("1G").Obj(),
			want: req(gpu.DialectPartita, ctr("main", 0, 1, 0, 954, 0)),
		},
		"canonical count alone is whole GPUs": {
			pod:  pt.MakePod("p", "ns").GPUCount(4).Obj(),
			want: req(gpu.DialectPartita, ctr("main", 0, 4, 1000, 0, 0)),
		},
		"canonical cores with a fraction": {
			pod:  pt.MakePod("p", "ns").GPUFraction("0.25").GPUCores(30).Obj(),
			want: req(gpu.DialectPartita, ctr("main", 0, 1, 250, 0, 30)),
		},
		"canonical annotations go to the first container when none names a GPU": {
			pod:  pt.MakePod("p", "ns").Container("train").Container("sidecar").GPUFraction("0.5").Obj(),
			want: req(gpu.DialectPartita, ctr("train", 0, 1, 500, 0, 0)),
		},
		"canonical annotations apply to every container with gpu-milli": {
			pod: pt.MakePod("p", "ns").Container("sidecar").Container("a").Resource("a", gpuMilli, "500").
				Container("b").Resource("b", gpuMilli, "500").GPUFraction("0.5").Obj(),
			want: req(gpu.DialectPartita, ctr("a", 1, 1, 500, 0, 0), ctr("b", 2, 1, 500, 0, 0)),
		},
		"Run:ai fraction on two devices with queue and group": {
			pod: pt.MakePod("p", "ns").Annotation("gpu-fraction", "0.5").Annotation("gpu-fraction-num-devices", "2").
				Label("runai/queue", "team-a").Annotation("pod-group-name", "g1").Obj(),
			want: with(req(gpu.DialectRunAI, ctr("main", 0, 2, 500, 0, 0)), func(r *gpu.PodRequest) {
				r.Queue, r.PodGroup = "team-a", "g1"
			}),
		},
		"Run:ai memory in MiB with a KAI queue": {
			pod: pt.MakePod("p", "ns").Annotation("gpu-memory", "20480").Label("kai.scheduler/queue", "team-b").Obj(),
			want: with(req(gpu.DialectRunAI, ctr("main", 0, 1, 0, 20480, 0)), func(r *gpu.PodRequest) {
				r.Queue = "team-b"
			}),
		},
		"HAMi memory with cores": {
			pod:  pt.MakePod("p", "ns").Resource("", nvGPU, "1").Resource("", hamiMem, "3000").Resource("", hamiCores, "30").Obj(),
			want: req(gpu.DialectHAMi, ctr("main", 0, 1, 0, 3000, 30)),
		},
		"HAMi memory percentage": {
			pod:  pt.MakePod("p", "ns").Resource("", nvGPU, "2").Resource("", hamiPct, "25").Obj(),
			want: req(gpu.DialectHAMi, ctr("main", 0, 2, 250, 0, 0)),
		},
		"HAMi cores alone hold the whole device": {
			pod:  pt.MakePod("p", "ns").Resource("", nvGPU, "1").Resource("", hamiCores, "50").Obj(),
			want: req(gpu.DialectHAMi, ctr("main", 0, 1, 1000, 0, 50)),
		},
		"HAMi on the second container only": {
			pod:  pt.MakePod("p", "ns").Container("init").Container("train").Resource("train", nvGPU, "1").Resource("train", hamiMem, "8000").Obj(),
			want: req(gpu.DialectHAMi, ctr("train", 1, 1, 0, 8000, 0)),
		},
		"HAMi containers that ask the same": {
			pod: pt.MakePod("p", "ns").Container("a").Resource("a", nvGPU, "1").Resource("a", hamiMem, "4000").
				Container("b").Resource("b", nvGPU, "1").Resource("b", hamiMem, "4000").Obj(),
			want: req(gpu.DialectHAMi, ctr("a", 0, 1, 0, 4000, 0), ctr("b", 1, 1, 0, 4000, 0)),
		},
		"whole GPUs": {
			pod:  pt.MakePod("p", "ns").Resource("", nvGPU, "2").Obj(),
			want: req(gpu.DialectWholeGPU, ctr("main", 0, 2, 1000, 0, 0)),
		},
		"whole GPUs from requests only": {
			pod:  pt.MakePod("p", "ns").Request("", nvGPU, "1").Obj(),
			want: req(gpu.DialectWholeGPU, ctr("main", 0, 1, 1000, 0, 0)),
		},
		"coscheduling pod group": {
			pod: pt.MakePod("p", "ns").Resource("", nvGPU, "1").Label("scheduling.x-k8s.io/pod-group", "gang").Obj(),
			want: with(req(gpu.DialectWholeGPU, ctr("main", 0, 1, 1000, 0, 0)), func(r *gpu.PodRequest) {
				r.PodGroup = "gang"
			}),
		},
		"canonical keys with consistent Run:ai keys report Run:ai": {
			pod: pt.MakePod("p", "ns").Annotation("gpu-fraction", "0.3333").GPUFraction("0.334").GPUCount(1).
				Label("runai/queue", "q").Queue("q").Resource("", gpuMilli, "334").Obj(),
			want: with(req(gpu.DialectRunAI, ctr("main", 0, 1, 334, 0, 0)), func(r *gpu.PodRequest) {
				r.Queue = "q"
			}),
		},
		"canonical keys with consistent HAMi keys, canonical cores fill in": {
			pod: pt.MakePod("p", "ns").Resource("", nvGPU, "1").Resource("", hamiMem, "3000").
				GPUMemory("3000Mi").GPUCount(1).GPUCores(20).Resource("", gpuMilli, "37").Obj(),
			want: req(gpu.DialectHAMi, ctr("main", 0, 1, 0, 3000, 20)),
		},
		"canonical keys with consistent whole GPUs": {
			pod:  pt.MakePod("p", "ns").Resource("", nvGPU, "2").GPUCount(2).Resource("", gpuMilli, "2000").Obj(),
			want: req(gpu.DialectWholeGPU, ctr("main", 0, 2, 1000, 0, 0)),
		},
		"gpu-milli of a memory request anywhere in count..count×1000": {
			pod:  pt.MakePod("p", "ns").GPUMemory("10Gi").GPUCount(2).Resource("", gpuMilli, "2").Obj(),
			want: req(gpu.DialectPartita, ctr("main", 0, 2, 0, 10240, 0)),
		},
		"the same queue in two dialects": {
			pod: pt.MakePod("p", "ns").GPUFraction("0.5").Queue("q").Label("runai/queue", "q").Label("kai.scheduler/queue", "q").Obj(),
			want: with(req(gpu.DialectPartita, ctr("main", 0, 1, 500, 0, 0)), func(r *gpu.PodRequest) {
				r.Queue = "q"
			}),
		},
		"Partita's topology keys and sub-group": {
			pod: pt.MakePod("p", "ns").GPUCount(8).Annotation(v1alpha1.AnnotationTopology, "dc-1").
				Annotation(v1alpha1.AnnotationTopologyRequired, "network.example.com/block").
				Annotation(v1alpha1.AnnotationTopologyPreferred, "network.example.com/rack").
				Label(v1alpha1.LabelSubGroup, "replica-0").Obj(),
			want: with(req(gpu.DialectPartita, ctr("main", 0, 8, 1000, 0, 0)), func(r *gpu.PodRequest) {
				r.Topology = v1alpha1.TopologyRequest{Topology: "dc-1", Required: "network.example.com/block", Preferred: "network.example.com/rack"}
				r.SubGroup = "replica-0"
			}),
		},
		"KAI's topology keys and sub-group": {
			pod: pt.MakePod("p", "ns").Resource("", nvGPU, "1").Annotation(v1alpha1.AnnotationKAITopology, "dc-1").
				Annotation(v1alpha1.AnnotationKAITopologyRequired, "kubernetes.io/hostname").
				Annotation(v1alpha1.AnnotationKAITopologyPreferred, "nvidia.com/gpu.clique").
				Label(v1alpha1.LabelKAISubGroup, "decode").Obj(),
			want: with(req(gpu.DialectWholeGPU, ctr("main", 0, 1, 1000, 0, 0)), func(r *gpu.PodRequest) {
				r.Topology = v1alpha1.TopologyRequest{Topology: "dc-1", Required: "kubernetes.io/hostname", Preferred: "nvidia.com/gpu.clique"}
				r.SubGroup = "decode"
			}),
		},
		"Kueue's levels name no Topology": {
			pod: pt.MakePod("p", "ns").GPUFraction("0.5").Annotation(v1alpha1.AnnotationKueueTopologyRequired, "cloud.example.com/block").
				Annotation(v1alpha1.AnnotationKueueTopologyPreferred, "cloud.example.com/rack").Obj(),
			want: with(req(gpu.DialectPartita, ctr("main", 0, 1, 500, 0, 0)), func(r *gpu.PodRequest) {
				r.Topology = v1alpha1.TopologyRequest{Required: "cloud.example.com/block", Preferred: "cloud.example.com/rack"}
			}),
		},
		"the same level and sub-group in three dialects": {
			pod: pt.MakePod("p", "ns").GPUFraction("0.5").Annotation(v1alpha1.AnnotationTopologyRequired, "rack").
				Annotation(v1alpha1.AnnotationKAITopologyRequired, "rack").Annotation(v1alpha1.AnnotationKueueTopologyRequired, "rack").
				Label(v1alpha1.LabelSubGroup, "a").Label(v1alpha1.LabelKAISubGroup, "a").Obj(),
			want: with(req(gpu.DialectPartita, ctr("main", 0, 1, 500, 0, 0)), func(r *gpu.PodRequest) {
				r.Topology = v1alpha1.TopologyRequest{Required: "rack"}
				r.SubGroup = "a"
			}),
		},
		"empty topology values are unset": {
			pod: pt.MakePod("p", "ns").GPUFraction("0.5").Annotation(v1alpha1.AnnotationTopologyRequired, "").
				Annotation(v1alpha1.AnnotationKAITopologyRequired, "zone").Label(v1alpha1.LabelSubGroup, "").Obj(),
			want: with(req(gpu.DialectPartita, ctr("main", 0, 1, 500, 0, 0)), func(r *gpu.PodRequest) {
				r.Topology = v1alpha1.TopologyRequest{Required: "zone"}
			}),
		},
		"topology keys of a pod without GPUs are not read": {
			pod: pt.MakePod("p", "ns").Annotation(v1alpha1.AnnotationTopologyRequired, "not a label!").
				Annotation(v1alpha1.AnnotationKAITopologyRequired, "other").Label(v1alpha1.LabelSubGroup, "x").Obj(),
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, errs := gpu.ParsePod(tc.pod)
			if len(errs) > 0 {
				t.Fatalf("ParsePod: unexpected errors: %v", errs)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("ParsePod (-want,+got):\n%s", diff)
			}
		})
	}
}

func TestParsePodErrors(t *testing.T) {
	long := strings.Repeat("9", 200)
	cases := map[string]struct {
		pod *corev1.Pod
		// wantFields are the errors' paths; wantDetails, one per error, are
		// substrings of the messages.
		wantFields  []string
		wantDetails []string
	}{
		"fraction above 1": {
			pod:         pt.MakePod("p", "ns").GPUFraction("1.5").Obj(),
			wantFields:  []string{"metadata.annotations[partita.dev/gpu-fraction]"},
			wantDetails: []string{`"1.5": must be a decimal in (0, 1]; ask for whole GPUs with partita.dev/gpu-count`},
		},
		"fraction 1.0001": {
			pod:         pt.MakePod("p", "ns").GPUFraction("1.0001").Obj(),
			wantFields:  []string{"metadata.annotations[partita.dev/gpu-fraction]"},
			wantDetails: []string{"ask for whole GPUs"},
		},
		"fraction zero": {
			pod:         pt.MakePod("p", "ns").GPUFraction("0.000").Obj(),
			wantFields:  []string{"metadata.annotations[partita.dev/gpu-fraction]"},
			wantDetails: []string{"must be greater than 0"},
		},
		"fraction negative": {
			pod:         pt.MakePod("p", "ns").GPUFraction("-0.5").Obj(),
			wantFields:  []string{"metadata.annotations[partita.dev/gpu-fraction]"},
			wantDetails: []string{`must be a decimal in (0, 1], such as "0.5"`},
		},
		"fraction NaN, Inf and exponents": {
			pod: pt.MakePod("p", "ns").GPUFraction("NaN").Annotation("gpu-fraction", "Inf").Obj(),
			wantFields: []string{
				"metadata.annotations[partita.dev/gpu-fraction]",
				"metadata.annotations[gpu-fraction]",
			},
			wantDetails: []string{`"NaN": must be a decimal`, `"Inf": must be a decimal`},
		},
		"fraction exponent": {
			pod:         pt.MakePod("p", "ns").GPUFraction("5e-1").Obj(),
			wantFields:  []string{"metadata.annotations[partita.dev/gpu-fraction]"},
			wantDetails: []string{"must be a decimal"},
		},
		"fraction with a space": {
			pod:         pt.MakePod("p", "ns").GPUFraction(" 0.5").Obj(),
			wantFields:  []string{"metadata.annotations[partita.dev/gpu-fraction]"},
			wantDetails: []string{"must be a decimal"},
		},
		"huge fraction string is cut in the message": {
			pod:         pt.MakePod("p", "ns").GPUFraction("0." + long).Obj(),
			wantFields:  []string{"metadata.annotations[partita.dev/gpu-fraction]"},
			wantDetails: []string{`9...": must be a decimal in (0, 1], such as "0.5"; this value is too long`},
		},
		"empty canonical value": {
			pod:         pt.MakePod("p", "ns").GPUFraction("").Obj(),
			wantFields:  []string{"metadata.annotations[partita.dev/gpu-fraction]"},
			wantDetails: []string{"must not be empty"},
		},
		"memory negative": {
			pod:         pt.MakePod("p", "ns").GPUMemory("-1Gi").Obj(),
			wantFields:  []string{"metadata.annotations[partita.dev/gpu-memory]"},
			wantDetails: []string{"must be greater than 0"},
		},
		"memory without a unit": {
			pod:         pt.MakePod("p", "ns").GPUMemory("20").Obj(),
			wantFields:  []string{"metadata.annotations[partita.dev/gpu-memory]"},
			wantDetails: []string{`did you leave out the unit ("Gi")?`},
		},
		"memory above 1Ti": {
			pod:         pt.MakePod("p", "ns").GPUMemory("2Ti").Obj(),
			wantFields:  []string{"metadata.annotations[partita.dev/gpu-memory]"},
			wantDetails: []string{"at most 1Ti"},
		},
		"memory astronomically large": {
			pod:         pt.MakePod("p", "ns").GPUMemory("1e100").Obj(),
			wantFields:  []string{"metadata.annotations[partita.dev/gpu-memory]"},
			wantDetails: []string{"at most 1Ti"},
		},
		"memory not a quantity": {
			pod:         pt.MakePod("p", "ns").GPUMemory("lots").Obj(),
			wantFields:  []string{"metadata.annotations[partita.dev/gpu-memory]"},
			wantDetails: []string{`such as "20Gi"`},
		},
		"count out of range and not a number": {
			pod: pt.MakePod("p", "ns").GPUCount(65).Annotation("gpu-fraction", "0.5").Annotation("gpu-fraction-num-devices", "+2").Obj(),
			wantFields: []string{
				"metadata.annotations[partita.dev/gpu-count]",
				"metadata.annotations[gpu-fraction-num-devices]",
			},
			wantDetails: []string{`"65": must be a whole number from 1 to 64`, `"+2": must be a whole number from 1 to 64`},
		},
		"count zero": {
			pod:         pt.MakePod("p", "ns").GPUCount(0).Obj(),
			wantFields:  []string{"metadata.annotations[partita.dev/gpu-count]"},
			wantDetails: []string{"from 1 to 64"},
		},
		"cores out of range": {
			pod:         pt.MakePod("p", "ns").GPUFraction("0.5").GPUCores(101).Obj(),
			wantFields:  []string{"metadata.annotations[partita.dev/gpu-cores]"},
			wantDetails: []string{"from 1 to 100"},
		},
		"canonical fraction and memory together": {
			pod:         pt.MakePod("p", "ns").GPUFraction("0.5").GPUMemory("20Gi").Obj(),
			wantFields:  []string{"metadata.annotations[partita.dev/gpu-fraction]"},
			wantDetails: []string{"set either partita.dev/gpu-fraction or partita.dev/gpu-memory, not both"},
		},
		"Run:ai fraction and memory together": {
			pod:         pt.MakePod("p", "ns").Annotation("gpu-fraction", "0.5").Annotation("gpu-memory", "2000").Obj(),
			wantFields:  []string{"metadata.annotations[gpu-fraction]"},
			wantDetails: []string{"set either gpu-fraction or gpu-memory, not both"},
		},
		"Run:ai memory with a unit": {
			pod:         pt.MakePod("p", "ns").Annotation("gpu-memory", "20Gi").Obj(),
			wantFields:  []string{"metadata.annotations[gpu-memory]"},
			wantDetails: []string{`MiB of GPU memory per GPU, such as "20480"; or write partita.dev/gpu-memory: "20Gi"`},
		},
		"Run:ai device count alone": {
			pod:         pt.MakePod("p", "ns").Annotation("gpu-fraction-num-devices", "2").Obj(),
			wantFields:  []string{"metadata.annotations[gpu-fraction-num-devices]"},
			wantDetails: []string{"needs gpu-fraction or gpu-memory"},
		},
		"Run:ai with HAMi": {
			pod:         pt.MakePod("p", "ns").Annotation("gpu-fraction", "0.5").Resource("", nvGPU, "1").Resource("", hamiMem, "2000").Obj(),
			wantFields:  []string{"metadata.annotations[gpu-fraction]"},
			wantDetails: []string{`conflicts with spec.containers[0].resources.limits[nvidia.com/gpumem]="2000"; a pod asks for GPUs in one dialect`},
		},
		"Run:ai with whole GPUs": {
			pod:         pt.MakePod("p", "ns").Annotation("gpu-memory", "2000").Resource("", nvGPU, "1").Obj(),
			wantFields:  []string{"metadata.annotations[gpu-memory]"},
			wantDetails: []string{`conflicts with spec.containers[0].resources.limits[nvidia.com/gpu]="1"`},
		},
		"canonical fraction against whole GPUs": {
			pod:         pt.MakePod("p", "ns").GPUFraction("0.5").Resource("", nvGPU, "1").Obj(),
			wantFields:  []string{"metadata.annotations[partita.dev/gpu-fraction]"},
			wantDetails: []string{`asks for 0.5 of a GPU, but spec.containers[0].resources.limits[nvidia.com/gpu]="1" asks for whole GPUs`},
		},
		"canonical count against Run:ai device count": {
			pod:         pt.MakePod("p", "ns").GPUFraction("0.5").GPUCount(2).Annotation("gpu-fraction", "0.5").Obj(),
			wantFields:  []string{"metadata.annotations[partita.dev/gpu-count]"},
			wantDetails: []string{`asks for 2 GPUs, but metadata.annotations[gpu-fraction]="0.5" asks for 1`},
		},
		"canonical cores against HAMi cores": {
			pod:         pt.MakePod("p", "ns").GPUCores(20).Resource("", nvGPU, "1").Resource("", hamiCores, "30").Obj(),
			wantFields:  []string{"metadata.annotations[partita.dev/gpu-cores]"},
			wantDetails: []string{`conflicts with spec.containers[0].resources.limits[nvidia.com/gpucores]="30"`},
		},
		"HAMi memory without nvidia.com/gpu": {
			pod:         pt.MakePod("p", "ns").Resource("", hamiMem, "2000").Obj(),
			wantFields:  []string{"spec.containers[0].resources.limits[nvidia.com/gpumem]"},
			wantDetails: []string{"needs nvidia.com/gpu on the same container"},
		},
		"HAMi memory and percentage together": {
			pod:         pt.MakePod("p", "ns").Resource("", nvGPU, "1").Resource("", hamiMem, "2000").Resource("", hamiPct, "50").Obj(),
			wantFields:  []string{"spec.containers[0].resources.limits[nvidia.com/gpumem-percentage]"},
			wantDetails: []string{"set either nvidia.com/gpumem or nvidia.com/gpumem-percentage, not both"},
		},
		"HAMi memory above 1Ti": {
			pod:         pt.MakePod("p", "ns").Resource("", nvGPU, "1").Resource("", hamiMem, "2000000").Obj(),
			wantFields:  []string{"spec.containers[0].resources.limits[nvidia.com/gpumem]"},
			wantDetails: []string{`"2000000": must be a whole number from 1 to 1048576 (MiB of GPU memory per GPU)`},
		},
		"HAMi containers that ask differently": {
			pod: pt.MakePod("p", "ns").Container("a").Resource("a", nvGPU, "1").Resource("a", hamiMem, "3000").
				Container("b").Resource("b", nvGPU, "1").Resource("b", hamiMem, "4000").Obj(),
			wantFields:  []string{"spec.containers[1].resources.limits[nvidia.com/gpumem]"},
			wantDetails: []string{`container "b" asks for 1 × 4000MiB of GPU memory, but container "a" asks for 1 × 3000MiB of GPU memory; Partita gives every GPU container the same request`},
		},
		"whole-GPU containers that ask differently": {
			pod:         pt.MakePod("p", "ns").Container("a").Resource("a", nvGPU, "1").Container("b").Resource("b", nvGPU, "2").Obj(),
			wantFields:  []string{"spec.containers[1].resources.limits[nvidia.com/gpu]"},
			wantDetails: []string{`container "b" asks for 2 GPUs, but container "a" asks for 1`},
		},
		"too many whole GPUs": {
			pod:         pt.MakePod("p", "ns").Resource("", nvGPU, "100").Obj(),
			wantFields:  []string{"spec.containers[0].resources.limits[nvidia.com/gpu]"},
			wantDetails: []string{`"100": must be a whole number from 1 to 64`},
		},
		"fractional nvidia.com/gpu": {
			pod:         pt.MakePod("p", "ns").Resource("", nvGPU, "1500m").Obj(),
			wantFields:  []string{"spec.containers[0].resources.limits[nvidia.com/gpu]"},
			wantDetails: []string{"not a fraction"},
		},
		"requests and limits differ": {
			pod:         pt.MakePod("p", "ns").Request("", nvGPU, "1").Limit("", nvGPU, "2").Obj(),
			wantFields:  []string{"spec.containers[0].resources.requests[nvidia.com/gpu]"},
			wantDetails: []string{`"1": differs from the limit 2`},
		},
		"gpu-milli alone": {
			pod:         pt.MakePod("p", "ns").Resource("", gpuMilli, "500").Obj(),
			wantFields:  []string{"spec.containers[0].resources.limits[partita.dev/gpu-milli]"},
			wantDetails: []string{"partita.dev/gpu-milli is set by Partita's webhook"},
		},
		"gpu-milli that does not match a fraction": {
			pod:         pt.MakePod("p", "ns").GPUFraction("0.5").GPUCount(2).Resource("", gpuMilli, "500").Obj(),
			wantFields:  []string{"spec.containers[0].resources.limits[partita.dev/gpu-milli]"},
			wantDetails: []string{`"500": does not match the request (2 × 0.5 of a GPU): must be 1000`},
		},
		"gpu-milli above a memory request's range": {
			pod:         pt.MakePod("p", "ns").GPUMemory("10Gi").Resource("", gpuMilli, "1001").Obj(),
			wantFields:  []string{"spec.containers[0].resources.limits[partita.dev/gpu-milli]"},
			wantDetails: []string{"must be between 1 and 1000"},
		},
		"GPU on an init container": {
			pod:         pt.MakePod("p", "ns").InitContainer("setup").Resource("setup", nvGPU, "1").Obj(),
			wantFields:  []string{"spec.initContainers[0].resources.limits[nvidia.com/gpu]", "spec.initContainers[0].resources.requests[nvidia.com/gpu]"},
			wantDetails: []string{"init containers cannot use GPUs", "init containers cannot use GPUs"},
		},
		"GPU container name too long": {
			pod:         pt.MakePod("p", "ns").Container(strings.Repeat("c", 60)).GPUFraction("0.5").Obj(),
			wantFields:  []string{"spec.containers[0].name"},
			wantDetails: []string{"at most 53 characters"},
		},
		"queue that is not a name": {
			pod:         pt.MakePod("p", "ns").GPUFraction("0.5").Queue("Team_A").Obj(),
			wantFields:  []string{"metadata.labels[partita.dev/queue]"},
			wantDetails: []string{`"Team_A": must be the name of a Queue`},
		},
		"queues that disagree": {
			pod:         pt.MakePod("p", "ns").GPUFraction("0.5").Queue("a").Label("kai.scheduler/queue", "b").Obj(),
			wantFields:  []string{"metadata.labels[kai.scheduler/queue]"},
			wantDetails: []string{`names a different Queue than metadata.labels[partita.dev/queue]="a"`},
		},
		"pod groups that disagree": {
			pod:         pt.MakePod("p", "ns").GPUFraction("0.5").PodGroup("a").Annotation("pod-group-name", "b").Obj(),
			wantFields:  []string{"metadata.annotations[pod-group-name]"},
			wantDetails: []string{"names a different PodGroup"},
		},
		"unknown placement": {
			pod:         pt.MakePod("p", "ns").GPUFraction("0.5").Placement("pack").Obj(),
			wantFields:  []string{"metadata.annotations[partita.dev/placement]"},
			wantDetails: []string{`must be "binpack" or "spread"`},
		},
		"a required level that is not a label key": {
			pod:         pt.MakePod("p", "ns").GPUFraction("0.5").Annotation(v1alpha1.AnnotationTopologyRequired, "rack!").Obj(),
			wantFields:  []string{"metadata.annotations[partita.dev/topology-required]"},
			wantDetails: []string{`"rack!": must be a node label key, such as topology.kubernetes.io/zone`},
		},
		"a preferred level in KAI's key that is not a label key": {
			pod:         pt.MakePod("p", "ns").GPUFraction("0.5").Annotation(v1alpha1.AnnotationKAITopologyPreferred, "a/b/c").Obj(),
			wantFields:  []string{"metadata.annotations[kai.scheduler/topology-preferred-placement]"},
			wantDetails: []string{"must be a node label key"},
		},
		"a Topology name that is not a name": {
			pod:         pt.MakePod("p", "ns").GPUFraction("0.5").Annotation(v1alpha1.AnnotationTopology, "DC_1").Obj(),
			wantFields:  []string{"metadata.annotations[partita.dev/topology]"},
			wantDetails: []string{`"DC_1": must be the name of a Topology`},
		},
		"a long level is echoed short": {
			pod:         pt.MakePod("p", "ns").GPUFraction("0.5").Annotation(v1alpha1.AnnotationKueueTopologyRequired, strings.Repeat("r", 10000)).Obj(),
			wantFields:  []string{"metadata.annotations[kueue.x-k8s.io/podset-required-topology]"},
			wantDetails: []string{strings.Repeat("r", 64) + `..."`},
		},
		"Partita's and KAI's Topology disagree": {
			pod:         pt.MakePod("p", "ns").GPUFraction("0.5").Annotation(v1alpha1.AnnotationTopology, "a").Annotation(v1alpha1.AnnotationKAITopology, "b").Obj(),
			wantFields:  []string{"metadata.annotations[kai.scheduler/topology]"},
			wantDetails: []string{`"b": names a different Topology than metadata.annotations[partita.dev/topology]="a"; remove one of them or make them agree`},
		},
		"Partita's and Kueue's required levels disagree": {
			pod: pt.MakePod("p", "ns").GPUFraction("0.5").Annotation(v1alpha1.AnnotationTopologyRequired, "rack").
				Annotation(v1alpha1.AnnotationKueueTopologyRequired, "block").Obj(),
			wantFields:  []string{"metadata.annotations[kueue.x-k8s.io/podset-required-topology]"},
			wantDetails: []string{`names a different required level than metadata.annotations[partita.dev/topology-required]="rack"`},
		},
		"KAI's and Kueue's preferred levels disagree": {
			pod: pt.MakePod("p", "ns").GPUFraction("0.5").Annotation(v1alpha1.AnnotationKAITopologyPreferred, "rack").
				Annotation(v1alpha1.AnnotationKueueTopologyPreferred, "host").Obj(),
			wantFields:  []string{"metadata.annotations[kueue.x-k8s.io/podset-preferred-topology]"},
			wantDetails: []string{`names a different preferred level than metadata.annotations[kai.scheduler/topology-preferred-placement]="rack"`},
		},
		"a sub-group that is not a label value": {
			pod:         pt.MakePod("p", "ns").GPUFraction("0.5").Label(v1alpha1.LabelKAISubGroup, "-x").Obj(),
			wantFields:  []string{"metadata.labels[kai.scheduler/subgroup-name]"},
			wantDetails: []string{"must be the name of a sub-group of the pod's PodGroup"},
		},
		"sub-groups that disagree": {
			pod:         pt.MakePod("p", "ns").GPUFraction("0.5").Label(v1alpha1.LabelSubGroup, "a").Label(v1alpha1.LabelKAISubGroup, "b").Obj(),
			wantFields:  []string{"metadata.labels[kai.scheduler/subgroup-name]"},
			wantDetails: []string{`names a different sub-group than metadata.labels[partita.dev/sub-group]="a"`},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, errs := gpu.ParsePod(tc.pod)
			if got != nil {
				t.Errorf("ParsePod: got request %+v, want none", got)
			}
			var fields []string
			for _, e := range errs {
				fields = append(fields, e.Field)
			}
			if diff := cmp.Diff(tc.wantFields, fields); diff != "" {
				t.Fatalf("ParsePod error paths (-want,+got):\n%s\nerrors: %v", diff, errs)
			}
			for i, e := range errs {
				if !strings.Contains(e.Error(), tc.wantDetails[i]) {
					t.Errorf("error %d = %q, want it to contain %q", i, e.Error(), tc.wantDetails[i])
				}
			}
		})
	}
}

func TestContainerRequestMilli(t *testing.T) {
	cases := map[string]struct {
		c            gpu.ContainerRequest
		deviceMiB    int64
		referenceMiB int64
		wantWhole    bool
		wantOn       int64
		wantResource int64
	}{
		"whole": {
			c: ctr("c", 0, 2, 1000, 0, 0), deviceMiB: 81920, referenceMiB: 81920,
			wantWhole: true, wantOn: 1000, wantResource: 2000,
		},
		"fraction": {
			c: ctr("c", 0, 3, 250, 0, 0), deviceMiB: 81920, referenceMiB: 81920,
			wantOn: 250, wantResource: 750,
		},
		"memory rounds up on the device, down for the resource": {
			c: ctr("c", 0, 1, 0, 30000, 0), deviceMiB: 81920, referenceMiB: 81920,
			wantOn: 367, wantResource: 366,
		},
		"memory on a smaller device takes a larger share": {
			c: ctr("c", 0, 2, 0, 20480, 0), deviceMiB: 40960, referenceMiB: 81920,
			wantOn: 500, wantResource: 500,
		},
		"memory bigger than the device is capped at 1000": {
			c: ctr("c", 0, 1, 0, 100000, 0), deviceMiB: 81920, referenceMiB: 81920,
			wantOn: 1000, wantResource: 1000,
		},
		"tiny memory is at least 1 per device": {
			c: ctr("c", 0, 4, 0, 1, 0), deviceMiB: 81920, referenceMiB: 81920,
			wantOn: 1, wantResource: 4,
		},
		"unknown reference counts 1 per device": {
			c: ctr("c", 0, 2, 0, 20480, 0), deviceMiB: 0, referenceMiB: 0,
			wantOn: 1000, wantResource: 2,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			q := tc.c.MilliResource(tc.referenceMiB)
			got := []int64{boolInt(tc.c.Whole()), tc.c.MilliOn(tc.deviceMiB), q.Value()}
			want := []int64{boolInt(tc.wantWhole), tc.wantOn, tc.wantResource}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("[Whole, MilliOn, MilliResource] (-want,+got):\n%s", diff)
			}
		})
	}
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

func TestApplyCanonical(t *testing.T) {
	cases := map[string]struct {
		pod             *corev1.Pod
		wantAnnotations map[string]string
		wantLabels      map[string]string
		wantMilli       map[string]int64
	}{
		"Run:ai keeps the user's keys and adds the canonical ones": {
			pod: pt.MakePod("p", "ns").Annotation("gpu-fraction", "0.3333").Label("runai/queue", "q").Obj(),
			wantAnnotations: map[string]string{
				"gpu-fraction":                 "0.3333",
				v1alpha1.AnnotationGPUFraction: "0.334",
				v1alpha1.AnnotationGPUCount:    "1",
			},
			wantLabels: map[string]string{"runai/queue": "q", v1alpha1.LabelQueue: "q"},
			wantMilli:  map[string]int64{"main": 334},
		},
		"HAMi memory with cores on the second container": {
			pod: pt.MakePod("p", "ns").Container("side").Container("train").
				Resource("train", nvGPU, "2").Resource("train", hamiMem, "20480").Resource("train", hamiCores, "40").Obj(),
			wantAnnotations: map[string]string{
				v1alpha1.AnnotationGPUMemory: "20Gi",
				v1alpha1.AnnotationGPUCount:  "2",
				v1alpha1.AnnotationGPUCores:  "40",
			},
			wantMilli: map[string]int64{"train": 500},
		},
		"KAI's topology and sub-group get Partita's keys beside them": {
			pod: pt.MakePod("p", "ns").Resource("", nvGPU, "1").Annotation(v1alpha1.AnnotationKAITopology, "dc-1").
				Annotation(v1alpha1.AnnotationKAITopologyRequired, "rack").Label(v1alpha1.LabelKAISubGroup, "r0").Obj(),
			wantAnnotations: map[string]string{
				v1alpha1.AnnotationKAITopology:         "dc-1",
				v1alpha1.AnnotationKAITopologyRequired: "rack",
				v1alpha1.AnnotationTopology:            "dc-1",
				v1alpha1.AnnotationTopologyRequired:    "rack",
				v1alpha1.AnnotationGPUCount:            "1",
			},
			wantLabels: map[string]string{v1alpha1.LabelKAISubGroup: "r0", v1alpha1.LabelSubGroup: "r0"},
			wantMilli:  map[string]int64{"main": 1000},
		},
		"Kueue's levels get Partita's keys beside them": {
			pod: pt.MakePod("p", "ns").GPUFraction("0.5").Annotation(v1alpha1.AnnotationKueueTopologyPreferred, "zone").Obj(),
			wantAnnotations: map[string]string{
				v1alpha1.AnnotationKueueTopologyPreferred: "zone",
				v1alpha1.AnnotationTopologyPreferred:      "zone",
				v1alpha1.AnnotationGPUFraction:            "0.5",
				v1alpha1.AnnotationGPUCount:               "1",
			},
			wantMilli: map[string]int64{"main": 500},
		},
		"fraction 1 becomes a count of whole GPUs": {
			pod:             pt.MakePod("p", "ns").GPUFraction("1").Placement("spread").PodGroup("g").Obj(),
			wantAnnotations: map[string]string{v1alpha1.AnnotationGPUCount: "1", v1alpha1.AnnotationPlacement: "spread"},
			wantLabels:      map[string]string{v1alpha1.LabelPodGroup: "g"},
			wantMilli:       map[string]int64{"main": 1000},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			r, errs := gpu.ParsePod(tc.pod)
			if len(errs) > 0 {
				t.Fatalf("ParsePod: %v", errs)
			}
			before := tc.pod.DeepCopy()
			got := gpu.ApplyCanonical(tc.pod, r, 81920)
			if diff := cmp.Diff(before, tc.pod); diff != "" {
				t.Errorf("ApplyCanonical changed its input (-before,+after):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantAnnotations, got.Annotations); diff != "" {
				t.Errorf("annotations (-want,+got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantLabels, got.Labels); diff != "" {
				t.Errorf("labels (-want,+got):\n%s", diff)
			}
			gotMilli := map[string]int64{}
			for _, c := range got.Spec.Containers {
				req, hasReq := c.Resources.Requests[gpuMilli]
				lim, hasLim := c.Resources.Limits[gpuMilli]
				if hasReq != hasLim || req.Cmp(lim) != 0 {
					t.Errorf("container %s: gpu-milli request %v and limit %v differ", c.Name, req, lim)
				}
				if hasLim {
					gotMilli[c.Name] = lim.Value()
				}
			}
			if diff := cmp.Diff(tc.wantMilli, gotMilli); diff != "" {
				t.Errorf("gpu-milli (-want,+got):\n%s", diff)
			}
			again, errs := gpu.ParsePod(got)
			if len(errs) > 0 {
				t.Fatalf("ParsePod(ApplyCanonical(pod)): %v", errs)
			}
			want := *r
			if want.Dialect == gpu.DialectHAMi || want.Dialect == gpu.DialectWholeGPU {
				// Their resources are translated and removed.
				want.Dialect = gpu.DialectPartita
			}
			if diff := cmp.Diff(&want, again); diff != "" {
				t.Errorf("ParsePod(ApplyCanonical(pod)) (-want,+got):\n%s", diff)
			}
			for _, c := range got.Spec.Containers {
				for name := range c.Resources.Limits {
					if strings.HasPrefix(string(name), "nvidia.com/") {
						t.Errorf("container %s still asks for %s, which Partita's nodes do not advertise", c.Name, name)
					}
				}
				for name := range c.Resources.Requests {
					if strings.HasPrefix(string(name), "nvidia.com/") {
						t.Errorf("container %s still requests %s, which Partita's nodes do not advertise", c.Name, name)
					}
				}
			}
			if diff := cmp.Diff(got, gpu.ApplyCanonical(got, again, 81920)); diff != "" {
				t.Errorf("ApplyCanonical twice (-once,+twice):\n%s", diff)
			}
		})
	}
}

func TestFormatMilli(t *testing.T) {
	cases := map[string]struct {
		milli int64
		want  string
	}{
		"whole":    {milli: 1000, want: "1"},
		"half":     {milli: 500, want: "0.5"},
		"quarter":  {milli: 250, want: "0.25"},
		"one":      {milli: 1, want: "0.001"},
		"over one": {milli: 1500, want: "1.5"},
		"zero":     {milli: 0, want: "0"},
		"negative": {milli: -250, want: "-0.25"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, gpu.FormatMilli(tc.milli)); diff != "" {
				t.Errorf("FormatMilli(%d) (-want,+got):\n%s", tc.milli, diff)
			}
		})
	}
}

func TestFormatHours(t *testing.T) {
	cases := map[string]struct {
		hours float64
		want  string
	}{
		"none":            {0, "0"},
		"a trace":         {0.0432, "0.04"},
		"one decimal":     {12.34, "12.3"},
		"whole below 100": {7, "7"},
		"whole from 100":  {410.6, "411"},
		"just below 100":  {99.96, "100"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := gpu.FormatHours(tc.hours); got != tc.want {
				t.Errorf("FormatHours(%v) = %q, want %q", tc.hours, got, tc.want)
			}
		})
	}
}
