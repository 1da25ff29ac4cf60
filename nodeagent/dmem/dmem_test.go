package dmem

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseCapacity(t *testing.T) {
	cases := map[string]struct {
		in      string
		want    []Region
		wantErr bool
	}{
		"empty": {in: ""},
		"two regions": {
			in:   "drm/0000:3b:00.0/vram0 85899345920\ndrm/0000:3b:00.0/system 0\n",
			want: []Region{{Name: "drm/0000:3b:00.0/vram0", Bytes: 85899345920}, {Name: "drm/0000:3b:00.0/system", Bytes: 0}},
		},
		"blank lines and spaces": {
			in:   "\n  drm/0000:01:00.0/vram0   1024  \n\n",
			want: []Region{{Name: "drm/0000:01:00.0/vram0", Bytes: 1024}},
		},
		"missing size":  {in: "drm/0000:01:00.0/vram0\n", wantErr: true},
		"not a number":  {in: "drm/0000:01:00.0/vram0 lots\n", wantErr: true},
		"negative size": {in: "drm/0000:01:00.0/vram0 -1\n", wantErr: true},
		"extra field":   {in: "drm/0000:01:00.0/vram0 1 2\n", wantErr: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := ParseCapacity([]byte(tc.in))
			if (err != nil) != tc.wantErr {
				t.Fatalf("ParseCapacity() error = %v, want error %v", err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("ParseCapacity() (-want +got):\n%s", diff)
			}
		})
	}
}

func TestRegionFor(t *testing.T) {
	regions := []Region{
		{Name: "drm/0000:3b:00.0/system", Bytes: 1 << 40},
		{Name: "drm/0000:3b:00.0/vram0", Bytes: 80 << 30},
		{Name: "drm/0000:86:00.0/vram0", Bytes: 80 << 30},
		{Name: "drm/0000:3b:00.01/vram0", Bytes: 1},
	}
	cases := map[string]struct {
		busID  string
		want   string
		wantOK bool
	}{
		"NVML form picks vram over the larger system region": {busID: "00000000:3B:00.0", want: "drm/0000:3b:00.0/vram0", wantOK: true},
		"kernel form":                  {busID: "0000:86:00.0", want: "drm/0000:86:00.0/vram0", wantOK: true},
		"no region":                    {busID: "0000:af:00.0"},
		"a prefix of another address":  {busID: "0000:3b:00.0", want: "drm/0000:3b:00.0/vram0", wantOK: true},
		"empty bus id matches nothing": {busID: ""},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, ok := RegionFor(regions, tc.busID)
			if ok != tc.wantOK || got.Name != tc.want {
				t.Errorf("RegionFor(%q) = %q, %v; want %q, %v", tc.busID, got.Name, ok, tc.want, tc.wantOK)
			}
		})
	}
}

func TestMaxValue(t *testing.T) {
	got := MaxValue([]Limit{{Region: "drm/0000:86:00.0/vram0", Bytes: 2048}, {Region: "drm/0000:3b:00.0/vram0", Bytes: 1024}})
	want := "drm/0000:3b:00.0/vram0 1024\ndrm/0000:86:00.0/vram0 2048"
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("MaxValue() (-want +got):\n%s", diff)
	}
}

func TestDetect(t *testing.T) {
	capacity := []byte("drm/0000:3b:00.0/vram0 85899345920\ndrm/0000:86:00.0/vram0 85899345920\n")
	two := []Device{{UUID: "GPU-a", BusID: "00000000:3B:00.0"}, {UUID: "GPU-b", BusID: "00000000:86:00.0"}}
	cases := map[string]struct {
		capacity []byte
		capErr   error
		driver   string
		devices  []Device
		want     Support
	}{
		"supported": {
			capacity: capacity, driver: "615.20", devices: two,
			want: Support{Available: true, Reason: "2 of 2 devices have a dmem region",
				Regions: map[string]string{"GPU-a": "drm/0000:3b:00.0/vram0", "GPU-b": "drm/0000:86:00.0/vram0"}},
		},
		"no controller": {
			capErr: ErrNoController, driver: "615.20", devices: two,
			want: Support{Reason: "the kernel has no dmem cgroup controller (needs cgroup v2 and Linux 6.14 or later)"},
		},
		"old driver": {
			capacity: capacity, driver: "580.95.05", devices: two,
			want: Support{Reason: "NVIDIA driver 580.95.05 does not register GPU memory with dmem (needs r615 or later)"},
		},
		"unknown driver": {
			capacity: capacity, devices: two,
			want: Support{Reason: `unknown NVIDIA driver version "" (needs r615 or later)`},
		},
		"a device without a region": {
			capacity: []byte("drm/0000:3b:00.0/vram0 1\n"), driver: "615.20", devices: two,
			want: Support{Reason: "dmem.capacity lists no region for GPU-b"},
		},
		"no devices": {capacity: capacity, driver: "615.20", want: Support{Reason: "no GPUs"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := Detect(tc.capacity, tc.capErr, tc.driver, tc.devices)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Detect() (-want +got):\n%s", diff)
			}
		})
	}
}

func TestReadCapacity(t *testing.T) {
	dir := t.TempDir()
	if _, err := ReadCapacity(dir); !errors.Is(err, ErrNoController) {
		t.Fatalf("ReadCapacity(empty root) error = %v, want ErrNoController", err)
	}
	if err := os.WriteFile(filepath.Join(dir, CapacityFile), []byte("drm/0000:3b:00.0/vram0 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := ReadCapacity(dir)
	if err != nil || string(got) != "drm/0000:3b:00.0/vram0 1\n" {
		t.Fatalf("ReadCapacity() = %q, %v", got, err)
	}
}
