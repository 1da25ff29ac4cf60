package nodeagent

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/partita-dev/partita/api/v1alpha1"
)

func TestBuildStatus(t *testing.T) {
	devices := []v1alpha1.GPUDevice{
		{Index: 1, UUID: "GPU-1", MemoryMiB: 100, Health: v1alpha1.DeviceUnhealthy, HealthReason: strings.Repeat("x", 2000)},
		{Index: 0, UUID: "GPU-0", MemoryMiB: 100, Health: v1alpha1.DeviceHealthy},
		{Index: 2, UUID: "GPU-2", MemoryMiB: 100, Health: v1alpha1.DeviceHealthy, MIGMode: v1alpha1.MIGEnabled},
	}
	sl := []v1alpha1.GPUSlice{{Namespace: "ns", Pod: "a", Container: "main", DeviceIndex: 0, Milli: 250}, {Namespace: "ns", Pod: "b", Container: "main", DeviceIndex: 0, Milli: 500}}
	now := metav1.NewTime(time.Unix(1000, 0))
	st := buildStatus(devices, sl, v1alpha1.IsolationMPS, "v1", now)
	got := struct {
		Indexes        []int32
		Count, Healthy int32
		Allocated      int64
		ReasonLen      int
		Capacity       int64
		Mode           v1alpha1.IsolationMode
		Version        string
	}{
		Count: st.DeviceCount, Healthy: st.HealthyDevices, Allocated: st.AllocatedMilli,
		ReasonLen: len(st.Devices[1].HealthReason), Capacity: capacityMilli(st.Devices), Mode: st.Isolation, Version: st.AgentVersion,
	}
	for _, d := range st.Devices {
		got.Indexes = append(got.Indexes, d.Index)
	}
	want := got
	want.Indexes, want.Count, want.Healthy, want.Allocated, want.ReasonLen = []int32{0, 1, 2}, 3, 2, 750, maxReasonLen
	want.Capacity, want.Mode, want.Version = 1000, v1alpha1.IsolationMPS, "v1"
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("status (-want,+got):\n%s", diff)
	}
	if devices[0].HealthReason == st.Devices[1].HealthReason {
		t.Error("buildStatus changed its input")
	}
}

func TestSameInventory(t *testing.T) {
	base := func() *v1alpha1.GPUNodeStatus {
		return &v1alpha1.GPUNodeStatus{
			Devices:   []v1alpha1.GPUDevice{{Index: 0, UUID: "GPU-0", MemoryMiB: 100, Health: v1alpha1.DeviceHealthy}},
			Slices:    []v1alpha1.GPUSlice{{Namespace: "ns", Pod: "a", Container: "main", Milli: 500, MemoryLimitMiB: 50, ObservedMemoryMiB: 10}},
			Isolation: v1alpha1.IsolationTimeSlicing,
			Heartbeat: &metav1.Time{Time: time.Unix(1000, 0)},
		}
	}
	cases := map[string]struct {
		change func(*v1alpha1.GPUNodeStatus)
		want   bool
	}{
		"identical":               {change: func(*v1alpha1.GPUNodeStatus) {}, want: true},
		"heartbeat only":          {change: func(s *v1alpha1.GPUNodeStatus) { s.Heartbeat = &metav1.Time{Time: time.Unix(2000, 0)} }, want: true},
		"usage under the limit":   {change: func(s *v1alpha1.GPUNodeStatus) { s.Slices[0].ObservedMemoryMiB = 40 }, want: true},
		"usage over the limit":    {change: func(s *v1alpha1.GPUNodeStatus) { s.Slices[0].ObservedMemoryMiB = 60 }},
		"device unhealthy":        {change: func(s *v1alpha1.GPUNodeStatus) { s.Devices[0].Health = v1alpha1.DeviceUnhealthy }},
		"slice gone":              {change: func(s *v1alpha1.GPUNodeStatus) { s.Slices = nil }},
		"mode":                    {change: func(s *v1alpha1.GPUNodeStatus) { s.Isolation = v1alpha1.IsolationMPS }},
		"agent version":           {change: func(s *v1alpha1.GPUNodeStatus) { s.AgentVersion = "v2" }},
		"no heartbeat in the old": {change: func(s *v1alpha1.GPUNodeStatus) { s.Heartbeat = nil }, want: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			b := base()
			tc.change(b)
			if got := sameInventory(base(), b); got != tc.want {
				t.Errorf("sameInventory = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestIdentifyDevices(t *testing.T) {
	unknown := func(i int32) DeviceState {
		return DeviceState{GPUDevice: v1alpha1.GPUDevice{Index: i, Health: v1alpha1.DeviceUnhealthy, HealthReason: "NVML cannot open device"}}
	}
	known := func(i int32, uuid string) DeviceState {
		return DeviceState{GPUDevice: v1alpha1.GPUDevice{Index: i, UUID: uuid, Health: v1alpha1.DeviceHealthy}}
	}
	cases := map[string]struct {
		devices   []DeviceState
		published []v1alpha1.GPUDevice
		want      []string
	}{
		"all known": {
			devices: []DeviceState{known(0, "GPU-a"), known(1, "GPU-b")},
			want:    []string{"GPU-a", "GPU-b"},
		},
		"never published": {
			devices: []DeviceState{known(0, "GPU-a"), unknown(1)},
			want:    []string{"GPU-a", "unknown-1"},
		},
		"published before": {
			devices:   []DeviceState{known(0, "GPU-a"), unknown(1)},
			published: []v1alpha1.GPUDevice{{Index: 0, UUID: "GPU-a"}, {Index: 1, UUID: "GPU-b"}},
			want:      []string{"GPU-a", "GPU-b"},
		},
		"its old UUID is another device's now": {
			devices:   []DeviceState{known(0, "GPU-b"), unknown(1)},
			published: []v1alpha1.GPUDevice{{Index: 1, UUID: "GPU-b"}},
			want:      []string{"GPU-b", "unknown-1"},
		},
		"published unknown stays unknown": {
			devices:   []DeviceState{unknown(0)},
			published: []v1alpha1.GPUDevice{{Index: 0, UUID: "unknown-0"}},
			want:      []string{"unknown-0"},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			identifyDevices(tc.devices, tc.published)
			var got []string
			for _, d := range tc.devices {
				got = append(got, d.UUID)
				if d.UUID != "GPU-a" && d.UUID != "GPU-b" || d.HealthReason != "" {
					if d.Health != v1alpha1.DeviceUnhealthy {
						t.Errorf("device %d (%s) is %s, want Unhealthy", d.Index, d.UUID, d.Health)
					}
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("UUIDs (-want,+got):\n%s", diff)
			}
		})
	}
}

func TestParseDeviceSelector(t *testing.T) {
	cases := map[string]struct {
		in      string
		want    DeviceSelector
		wantErr bool
	}{
		"all":             {in: "all", want: DeviceSelector{All: true}},
		"indexes":         {in: "0, 3", want: DeviceSelector{Indexes: []int32{0, 3}}},
		"UUIDs and index": {in: "GPU-8c1f,2", want: DeviceSelector{UUIDs: []string{"GPU-8c1f"}, Indexes: []int32{2}}},
		"empty":           {in: " , ", wantErr: true},
		"word":            {in: "five", wantErr: true},
		"negative":        {in: "-1", wantErr: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := ParseDeviceSelector(tc.in)
			if (err != nil) != tc.wantErr {
				t.Fatalf("ParseDeviceSelector(%q) error = %v, want error %v", tc.in, err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("selector (-want,+got):\n%s", diff)
			}
		})
	}
}
