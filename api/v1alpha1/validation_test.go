package v1alpha1_test

import (
	"context"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/internal/envtestutil"
)

func q(s string) *resource.Quantity { v := resource.MustParse(s); return &v }

func queue(name string, mutate func(*v1alpha1.Queue)) *v1alpha1.Queue {
	obj := &v1alpha1.Queue{ObjectMeta: metav1.ObjectMeta{Name: name}}
	mutate(obj)
	return obj
}

func gpuNode(name string, devices ...v1alpha1.GPUDevice) *v1alpha1.GPUNode {
	return &v1alpha1.GPUNode{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: v1alpha1.GPUNodeStatus{Devices: devices}}
}

func device(index int32, uuid string) v1alpha1.GPUDevice {
	return v1alpha1.GPUDevice{Index: index, UUID: uuid, Product: "NVIDIA H100 80GB HBM3", MemoryMiB: 81559, Health: v1alpha1.DeviceHealthy}
}

// TestCRDValidation checks that the real API server refuses invalid objects
// with a message that names the field, and accepts valid ones unchanged.
func TestCRDValidation(t *testing.T) {
	_, c := envtestutil.Start(t)
	ctx := context.Background()

	invalid := map[string]struct {
		obj        client.Object
		status     bool // the invalid part is in status: create, then update status
		wantInErrs []string
	}{
		"queue limit below quota": {
			obj: queue("limit-below-quota", func(q0 *v1alpha1.Queue) {
				q0.Spec.Resources.GPU = &v1alpha1.ResourceQuota{Quota: q("4"), Limit: q("2")}
			}),
			wantInErrs: []string{"spec.resources.gpu", "limit must be at least quota"},
		},
		"queue quota below -1": {
			obj: queue("quota-negative", func(q0 *v1alpha1.Queue) {
				q0.Spec.Resources.CPU = &v1alpha1.ResourceQuota{Quota: q("-2")}
			}),
			wantInErrs: []string{"spec.resources.cpu", "quota must be -1"},
		},
		"queue limit below -1": {
			obj: queue("limit-negative", func(q0 *v1alpha1.Queue) {
				q0.Spec.Resources.Memory = &v1alpha1.ResourceQuota{Limit: q("-5Gi")}
			}),
			wantInErrs: []string{"spec.resources.memory", "limit must be -1"},
		},
		"queue is its own parent": {
			obj:        queue("loop", func(q0 *v1alpha1.Queue) { q0.Spec.Parent = "loop" }),
			wantInErrs: []string{"spec.parent", "cannot be its own parent"},
		},
		"queue negative over-quota weight": {
			obj: queue("weight", func(q0 *v1alpha1.Queue) {
				q0.Spec.Resources.GPU = &v1alpha1.ResourceQuota{OverQuotaWeight: ptr.To[int32](-1)}
			}),
			wantInErrs: []string{"spec.resources.gpu.overQuotaWeight"},
		},
		"podgroup minMember zero": {
			obj:        &v1alpha1.PodGroup{ObjectMeta: metav1.ObjectMeta{Name: "pg0", Namespace: "default"}, Spec: v1alpha1.PodGroupSpec{MinMember: 0}},
			wantInErrs: []string{"spec.minMember", "greater than or equal to 1"},
		},
		"podgroup timeout zero": {
			obj: &v1alpha1.PodGroup{ObjectMeta: metav1.ObjectMeta{Name: "pg1", Namespace: "default"},
				Spec: v1alpha1.PodGroupSpec{MinMember: 2, ScheduleTimeoutSeconds: ptr.To[int32](0)}},
			wantInErrs: []string{"spec.scheduleTimeoutSeconds"},
		},
		"gpunode unknown isolation": {
			obj:        &v1alpha1.GPUNode{ObjectMeta: metav1.ObjectMeta{Name: "iso"}, Spec: v1alpha1.GPUNodeSpec{Isolation: "magic"}},
			wantInErrs: []string{"spec.isolation", "supported values"},
		},
		"gpunode duplicate device uuid": {
			obj:        gpuNode("dup", device(0, "GPU-a"), device(1, "GPU-a")),
			status:     true,
			wantInErrs: []string{"status", "device UUIDs must be unique"},
		},
		"gpunode duplicate device index": {
			obj:        gpuNode("dupidx", device(0, "GPU-a"), device(0, "GPU-b")),
			status:     true,
			wantInErrs: []string{"status.devices[1]", "Duplicate value"},
		},
	}
	for name, tc := range invalid {
		t.Run("refused/"+name, func(t *testing.T) {
			var err error
			if tc.status {
				withStatus := tc.obj.DeepCopyObject().(client.Object)
				if err := c.Create(ctx, tc.obj); err != nil {
					t.Fatalf("create without status: %v", err)
				}
				withStatus.SetResourceVersion(tc.obj.GetResourceVersion())
				err = c.Status().Update(ctx, withStatus)
			} else {
				err = c.Create(ctx, tc.obj)
			}
			if err == nil {
				t.Fatalf("API server accepted an invalid object")
			}
			for _, want := range tc.wantInErrs {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error does not mention %q:\n%v", want, err)
				}
			}
		})
	}

	valid := map[string]client.Object{
		"queue with decimals and no limit": queue("team-a", func(q0 *v1alpha1.Queue) {
			q0.Spec.Parent = "research"
			q0.Spec.Priority = ptr.To[int32](100)
			q0.Spec.Namespaces = []string{"team-a"}
			q0.Spec.Resources.GPU = &v1alpha1.ResourceQuota{Quota: q("4.5"), Limit: q("-1"), OverQuotaWeight: ptr.To[int32](2)}
			q0.Spec.Resources.CPU = &v1alpha1.ResourceQuota{Quota: q("64"), Limit: q("128")}
		}),
		"top-level queue with whole-capacity quota": queue("everything", func(q0 *v1alpha1.Queue) {
			q0.Spec.Resources.GPU = &v1alpha1.ResourceQuota{Quota: q("-1"), Limit: q("-1")}
		}),
		"podgroup": &v1alpha1.PodGroup{ObjectMeta: metav1.ObjectMeta{Name: "train-1", Namespace: "default"},
			Spec: v1alpha1.PodGroupSpec{MinMember: 8, Queue: "team-a", PriorityClassName: "train",
				ScheduleTimeoutSeconds: ptr.To[int32](300), TopologyKey: "topology.kubernetes.io/zone"}},
		"gpunode": &v1alpha1.GPUNode{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}, Spec: v1alpha1.GPUNodeSpec{Isolation: v1alpha1.IsolationMPS}},
	}
	for name, obj := range valid {
		t.Run("accepted/"+name, func(t *testing.T) {
			want := obj.DeepCopyObject().(client.Object)
			if err := c.Create(ctx, obj); err != nil {
				t.Fatalf("create: %v", err)
			}
			got := want.DeepCopyObject().(client.Object)
			if err := c.Get(ctx, client.ObjectKeyFromObject(obj), got); err != nil {
				t.Fatalf("get: %v", err)
			}
			ignoreMeta := cmp.FilterPath(func(p cmp.Path) bool {
				s := p.String()
				return strings.HasPrefix(s, "ObjectMeta") || strings.HasPrefix(s, "TypeMeta")
			}, cmp.Ignore())
			quantities := cmp.Comparer(func(a, b resource.Quantity) bool { return a.Cmp(b) == 0 })
			if diff := cmp.Diff(want, got, ignoreMeta, quantities); diff != "" {
				t.Errorf("object changed on its way through the API server (-want,+got):\n%s", diff)
			}
		})
	}

	t.Run("gpunode isolation defaults to time-slicing", func(t *testing.T) {
		gn := &v1alpha1.GPUNode{ObjectMeta: metav1.ObjectMeta{Name: "defaulted"}}
		if err := c.Create(ctx, gn); err != nil {
			t.Fatalf("create: %v", err)
		}
		if gn.Spec.Isolation != v1alpha1.IsolationTimeSlicing {
			t.Errorf("isolation = %q, want %q", gn.Spec.Isolation, v1alpha1.IsolationTimeSlicing)
		}
	})
}
