package demo

import (
	"bytes"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/partita-dev/partita/report"
)

// twoNodes has notebooks sharing a device, a whole-GPU pod, and an idle
// device.
func twoNodes() report.NodesReport {
	nb := func(pod string, milli int64) report.SliceReport {
		return report.SliceReport{Namespace: TeamA, Pod: pod, Container: "main", Milli: milli}
	}
	return report.NodesReport{
		Nodes: []report.NodeReport{
			{Name: "n0", Devices: []report.DeviceReport{
				{Index: 0, Health: "Healthy", UsedMilli: 750, Slices: []report.SliceReport{nb("nb-1", 500), nb("nb-2", 250)}},
				{Index: 1, Health: "Healthy", UsedMilli: 1000, Slices: []report.SliceReport{{Namespace: TeamB, Pod: "train-0", Milli: 1000, Whole: true}}},
			}},
			{Name: "n1", Devices: []report.DeviceReport{
				{Index: 0, Health: "Healthy", UsedMilli: 250, Slices: []report.SliceReport{nb("nb-3", 250)}},
				{Index: 1, Health: "Healthy", Slices: []report.SliceReport{}},
			}},
		},
		Total: report.NodeTotals{GPUs: 4, Healthy: 4, UsedMilli: 2000, FreeMilli: 2000, Pods: 4},
	}
}

func TestUsageOf(t *testing.T) {
	cases := map[string]struct {
		keep func(report.SliceReport) bool
		want usage
	}{
		"notebooks": {
			keep: isNotebook,
			want: usage{pods: 3, milli: 1000, devices: 2, whole: 3, devs: []deviceUse{
				{node: "n0", index: 0, usedMilli: 750, slices: []string{"nb-1 0.5", "nb-2 0.25"}},
				{node: "n1", index: 0, usedMilli: 250, slices: []string{"nb-3 0.25"}},
			}},
		},
		"every demo pod": {
			keep: isDemo,
			want: usage{pods: 4, milli: 2000, devices: 3, whole: 4, devs: []deviceUse{
				{node: "n0", index: 0, usedMilli: 750, slices: []string{"nb-1 0.5", "nb-2 0.25"}},
				{node: "n0", index: 1, usedMilli: 1000, slices: []string{"train-0 whole"}},
				{node: "n1", index: 0, usedMilli: 250, slices: []string{"nb-3 0.25"}},
			}},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := usageOf(twoNodes(), tc.keep)
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(usage{}, deviceUse{})); diff != "" {
				t.Errorf("usageOf (-want,+got):\n%s", diff)
			}
		})
	}
	if got := idleDevices(twoNodes()); got != 1 {
		t.Errorf("idleDevices = %d, want 1", got)
	}
}

func TestWriteDeviceMap(t *testing.T) {
	var b bytes.Buffer
	if err := writeDeviceMap(indent(&b), twoNodes()); err != nil {
		t.Fatal(err)
	}
	want := `    NODE \ GPU  0          1
    n0          nb-1+nb-2  train-0
    n1          nb-3       -
    4 GPUs on 2 nodes: 2 allocated, 2 free (4 pods)
`
	if diff := cmp.Diff(want, b.String()); diff != "" {
		t.Errorf("writeDeviceMap (-want,+got):\n%s", diff)
	}
}

func TestTimes(t *testing.T) {
	cases := map[string]struct {
		a, b int
		want string
	}{
		"whole":    {6, 2, "3×"},
		"fraction": {36, 32, "1.1×"},
		"none":     {1, 0, "∞×"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := times(tc.a, tc.b); got != tc.want {
				t.Errorf("times(%d, %d) = %q, want %q", tc.a, tc.b, got, tc.want)
			}
		})
	}
}
