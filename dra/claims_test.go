package dra

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
	"github.com/partita-dev/partita/internal/partitatest"
)

const (
	h100 = int64(81559)
	l4   = int64(23034)
)

// alternative is what one firstAvailable entry asks for, in short.
type alternative struct {
	Name     string
	Selector string
	Count    int64
	Compute  string
	Memory   string
}

func alternatives(t *testing.T, spec resourceapi.ResourceClaimSpec) []alternative {
	t.Helper()
	if len(spec.Devices.Requests) != 1 {
		t.Fatalf("requests = %d, want 1", len(spec.Devices.Requests))
	}
	r := spec.Devices.Requests[0]
	var out []alternative
	short := func(name string, sel []resourceapi.DeviceSelector, count int64, cap *resourceapi.CapacityRequirements) alternative {
		a := alternative{Name: name, Count: count}
		if len(sel) > 0 {
			a.Selector = sel[0].CEL.Expression
		}
		if cap != nil {
			if q, ok := cap.Requests[CapacityCompute]; ok {
				a.Compute = q.String()
			}
			if q, ok := cap.Requests[CapacityMemory]; ok {
				a.Memory = q.String()
			}
		}
		return a
	}
	if r.Exactly != nil {
		if r.Exactly.DeviceClassName != DeviceClassName {
			t.Errorf("device class %q, want %q", r.Exactly.DeviceClassName, DeviceClassName)
		}
		out = append(out, short(r.Name, r.Exactly.Selectors, r.Exactly.Count, r.Exactly.Capacity))
	}
	for _, s := range r.FirstAvailable {
		if s.DeviceClassName != DeviceClassName {
			t.Errorf("device class %q, want %q", s.DeviceClassName, DeviceClassName)
		}
		out = append(out, short(s.Name, s.Selectors, s.Count, s.Capacity))
	}
	return out
}

func TestTemplate(t *testing.T) {
	sel := func(size int64) string {
		return `device.attributes["gpu.partita.dev"].memoryMiB == ` + resource.NewQuantity(size, resource.DecimalSI).String()
	}
	cases := map[string]struct {
		req      gpu.ContainerRequest
		sizes    []int64
		want     []alternative
		wantName string
		wantErr  error
	}{
		"a quarter on one size takes a quarter of both capacities": {
			req:      gpu.ContainerRequest{Count: 1, Milli: 250},
			sizes:    []int64{h100, h100},
			want:     []alternative{{Name: "mib81559", Selector: sel(h100), Count: 1, Compute: "250", Memory: "20389Mi"}},
			wantName: "partita-gpu-1x250m-",
		},
		"memory takes its share of compute, per size, smallest first": {
			req:   gpu.ContainerRequest{Count: 2, MemoryMiB: 20480},
			sizes: []int64{h100, l4},
			want: []alternative{
				{Name: "mib23034", Selector: sel(l4), Count: 2, Compute: "890", Memory: "20Gi"},
				{Name: "mib81559", Selector: sel(h100), Count: 2, Compute: "252", Memory: "20Gi"},
			},
			wantName: "partita-gpu-2x20480mi-",
		},
		"memory that fits only the large devices": {
			req:   gpu.ContainerRequest{Count: 1, MemoryMiB: 40960},
			sizes: []int64{h100, l4},
			want:  []alternative{{Name: "mib81559", Selector: sel(h100), Count: 1, Compute: "503", Memory: "40Gi"}},
		},
		"memory that fits no device waits for one": {
			req:   gpu.ContainerRequest{Count: 1, MemoryMiB: 200 << 10},
			sizes: []int64{h100},
			want:  []alternative{{Name: "gpu", Count: 1, Compute: "1k", Memory: "200Gi"}},
		},
		"whole devices ask for no capacity, so take all of it": {
			req:      gpu.ContainerRequest{Count: 4, Milli: 1000},
			want:     []alternative{{Name: "gpu", Count: 4}},
			wantName: "partita-gpu-4xwhole-",
		},
		"a fraction before any node reported": {
			req:     gpu.ContainerRequest{Count: 1, Milli: 500},
			wantErr: ErrNoDeviceSizes,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			tmpl, err := Template("team-a", tc.req, tc.sizes)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("err = %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, alternatives(t, tmpl.Spec.Spec)); diff != "" {
				t.Errorf("alternatives (-want,+got):\n%s", diff)
			}
			if !strings.HasPrefix(tmpl.Name, tc.wantName) || tmpl.Namespace != "team-a" {
				t.Errorf("template %s/%s, want name prefix %q in team-a", tmpl.Namespace, tmpl.Name, tc.wantName)
			}
			again, _ := Template("team-b", tc.req, tc.sizes)
			if again.Name != tmpl.Name {
				t.Errorf("same request, names %s and %s", tmpl.Name, again.Name)
			}
		})
	}
}

func TestTemplateNamesFollowContent(t *testing.T) {
	a, _ := Template("ns", gpu.ContainerRequest{Count: 1, Milli: 250}, []int64{h100})
	b, _ := Template("ns", gpu.ContainerRequest{Count: 1, Milli: 250}, []int64{h100, l4})
	c, _ := Template("ns", gpu.ContainerRequest{Count: 1, Milli: 250, CoresPercent: 30}, []int64{h100})
	if a.Name == b.Name || a.Name == c.Name {
		t.Errorf("different specs share a name: %s %s %s", a.Name, b.Name, c.Name)
	}
	if len(c.Spec.Spec.Devices.Config) != 1 || !strings.Contains(string(c.Spec.Spec.Devices.Config[0].Opaque.Parameters.Raw), `"smLimitPercent":30`) {
		t.Errorf("a compute limit is not in the config: %+v", c.Spec.Spec.Devices.Config)
	}
}

func TestApplyClaims(t *testing.T) {
	pod := partitatest.MakePod("p", "team-a").Obj()
	pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{Name: "side"}, corev1.Container{Name: "train"})
	pod.Spec.Containers[2].Resources.Limits = corev1.ResourceList{
		v1alpha1.ResourceGPUMilli: resource.MustParse("500"), corev1.ResourceCPU: resource.MustParse("1"),
	}
	pod.Spec.Containers[2].Resources.Requests = corev1.ResourceList{v1alpha1.ResourceGPUMilli: resource.MustParse("500")}
	// A claim of the user's own stays; one under Partita's prefix is
	// replaced.
	pod.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "mine", ResourceClaimName: ptrTo("mine")}, {Name: "partita-gpu-0", ResourceClaimName: ptrTo("stolen")}}
	pod.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "partita-gpu-0"}}
	req := &gpu.PodRequest{Namespace: "team-a", Containers: []gpu.ContainerRequest{{Name: "train", Index: 2, Count: 1, Milli: 500}}}

	out, tmpls, err := ApplyClaims(pod, req, []int64{h100})
	if err != nil {
		t.Fatal(err)
	}
	if len(tmpls) != 1 {
		t.Fatalf("templates = %d, want 1", len(tmpls))
	}
	wantClaims := []corev1.PodResourceClaim{{Name: "mine", ResourceClaimName: ptrTo("mine")}, {Name: "partita-gpu-2", ResourceClaimTemplateName: &tmpls[0].Name}}
	if diff := cmp.Diff(wantClaims, out.Spec.ResourceClaims); diff != "" {
		t.Errorf("pod claims (-want,+got):\n%s", diff)
	}
	if out.Spec.Containers[0].Resources.Claims != nil {
		t.Errorf("container 0 still uses %v", out.Spec.Containers[0].Resources.Claims)
	}
	train := out.Spec.Containers[2].Resources
	if diff := cmp.Diff([]corev1.ResourceClaim{{Name: "partita-gpu-2"}}, train.Claims); diff != "" {
		t.Errorf("train's claims (-want,+got):\n%s", diff)
	}
	if _, ok := train.Limits[v1alpha1.ResourceGPUMilli]; ok || train.Requests != nil {
		t.Errorf("gpu-milli stays: %v %v", train.Limits, train.Requests)
	}
	if _, ok := train.Limits[corev1.ResourceCPU]; !ok {
		t.Errorf("cpu was removed: %v", train.Limits)
	}
	twice, _, err := ApplyClaims(out, req, []int64{h100})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(out, twice); diff != "" {
		t.Errorf("applying twice changed (-once,+twice):\n%s", diff)
	}
	// The pod still reads as the same request, with the claim's container
	// as its GPU container.
	canon := gpu.ApplyCanonical(pod, req, h100)
	canonClaims, _, _ := ApplyClaims(canon, req, []int64{h100})
	got, errs := gpu.ParsePod(canonClaims)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	if len(got.Containers) != 1 || got.Containers[0].Name != "train" || got.Containers[0].Milli != 500 {
		t.Errorf("reads as %+v", got.Containers)
	}
}

func ptrTo[T any](v T) *T { return &v }
