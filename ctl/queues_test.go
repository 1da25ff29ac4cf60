package ctl

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/partita-dev/partita/report"

	corev1 "k8s.io/api/core/v1"

	"github.com/partita-dev/partita/api/v1alpha1"

	pt "github.com/partita-dev/partita/internal/partitatest"
)

func TestQueuesTable(t *testing.T) {
	cases := map[string]struct {
		queues []v1alpha1.Queue
		pods   []corev1.Pod
		want   string
	}{
		"no queues": {want: "No queues.\n"},
		"a tree with status, pods summed up the tree, an orphan": {
			queues: []v1alpha1.Queue{
				*pt.MakeQueue("team-b").Parent("research").GPU("2", "-1", 1).GPUStatus("0", "3", "1", 1).Obj(),
				*pt.MakeQueue("research").Priority(50).GPU("-1", "8", 1).GPUStatus("3.5", "8", "5", 1).Obj(),
				*pt.MakeQueue("team-a").Parent("research").GPU("4", "4", 2).GPUStatus("3.5", "5", "4", 0).Obj(),
				*pt.MakeQueue("lost").Parent("gone").Obj(),
			},
			pods: []corev1.Pod{
				*pt.MakePod("a1", "team-a").Queue("team-a").GPUFraction("0.5").BoundTo("n", 0).Obj(),
				*pt.MakePod("a2", "team-a").Queue("team-a").Resource("", "nvidia.com/gpu", "3").BoundTo("n", 1, 2, 3).Obj(),
				*pt.MakePod("a3", "team-a").Queue("team-a").GPUFraction("0.5").Obj(),
				*pt.MakePod("b1", "team-b").Queue("team-b").GPUFraction("0.5").SchedulingGates(v1alpha1.SchedulingGateAdmission).Obj(),
				*pt.MakePod("old", "team-b").Queue("team-b").GPUFraction("0.5").BoundTo("n", 4).Phase(corev1.PodSucceeded).Obj(),
			},
			want: `QUEUE                                PRIORITY  QUOTA  LIMIT  ALLOCATED  FAIR SHARE  REQUESTED  PENDING  RUNNING  ADMITTED  GATED
lost (parent "gone" does not exist)  100       0      none   -          -           -          0        0        0         0
research                             50        all    8      3.5        8           5          1        2        1         1
  team-a                             100       4      4      3.5        5           4          0        2        1         0
  team-b                             100       2      none   0          3           1          1        0        0         1
(- : not reported yet by the admission loop in the queue's status)
`,
		},
		"CPU and memory, once a queue sets them": {
			queues: []v1alpha1.Queue{
				*pt.MakeQueue("team-a").GPU("4", "-1", 1).CPU("16", "32", 1).Memory("64Gi", "-1", 1).GPUStatus("2", "4", "2", 0).
					ResourceStatus(v1alpha1.ResourceCPU, "12500m", "16", "20").ResourceStatus(v1alpha1.ResourceMemory, "48Gi", "64Gi", "80Gi").Obj(),
				*pt.MakeQueue("team-b").GPUStatus("0", "0", "0", 0).Obj(),
			},
			want: `QUEUE   PRIORITY  QUOTA  LIMIT  ALLOCATED  FAIR SHARE  REQUESTED  PENDING  RUNNING  ADMITTED  GATED
team-a  100       4      none   2          4           2          0        0        0         0
team-b  100       0      none   0          0           0          0        0        0         0

QUEUE   CPU QUOTA  CPU LIMIT  CPU ALLOCATED  CPU FAIR SHARE  CPU REQUESTED  MEMORY QUOTA  MEMORY LIMIT  MEMORY ALLOCATED  MEMORY FAIR SHARE  MEMORY REQUESTED
team-a  16         32         12.5           16              20             64Gi          none          48Gi              64Gi               80Gi
team-b  0          none       -              -               -              0             none          -                 -                  -
(- : not reported yet by the admission loop in the queue's status)
`,
		},
		"usage: a column, the window, and the fair share without usage where history changed it": {
			queues: []v1alpha1.Queue{
				*pt.MakeQueue("research").GPU("-1", "-1", 1).GPUStatus("8", "8", "10", 0).UsageStatus("512.34", "0.42", "8").Obj(),
				*pt.MakeQueue("team-a").Parent("research").GPU("2", "-1", 1).GPUStatus("6", "3", "7", 1).UsageStatus("410.2", "0.34", "5").Obj(),
				*pt.MakeQueue("team-b").Parent("research").GPU("2", "-1", 1).GPUStatus("2", "5", "3", 1).UsageStatus("12.34", "0.01", "3").Obj(),
				*pt.MakeQueue("team-c").Parent("research").GPUStatus("0", "0", "0", 0).UsageStatus("0.04", "0", "0").Obj(),
				// Made after the loop's last cycle: nothing reported yet.
				*pt.MakeQueue("team-d").Parent("research").Obj(),
			},
			want: `QUEUE     PRIORITY  QUOTA  LIMIT  ALLOCATED  FAIR SHARE           USAGE (GPU-H)  REQUESTED  PENDING  RUNNING  ADMITTED  GATED
research  100       all    none   8          8                    512            10         0        0        0         0
  team-a  100       2      none   6          3 (5 without usage)  410            7          1        0        0         0
  team-b  100       2      none   2          5 (3 without usage)  12.3           3          1        0        0         0
  team-c  100       0      none   0          0                    0.04           0          0        0        0         0
  team-d  100       0      none   -          -                    -              -          0        0        0         0
usage: sliding 168h window, half-life 24h
(- : not reported yet by the admission loop in the queue's status)
`,
		},
		"usage counted with settings that changed: each window with its queues": {
			queues: []v1alpha1.Queue{
				*pt.MakeQueue("team-a").GPUStatus("1", "1", "1", 0).UsageStatus("1.5", "0.1", "1").Obj(),
				*pt.MakeQueue("team-b").GPUStatus("1", "1", "1", 0).UsageStatus("0.25", "0.02", "1").
					UsageWindow(v1alpha1.UsageWindowTumbling, 24*time.Hour, 90*time.Minute).Obj(),
			},
			want: `QUEUE   PRIORITY  QUOTA  LIMIT  ALLOCATED  FAIR SHARE  USAGE (GPU-H)  REQUESTED  PENDING  RUNNING  ADMITTED  GATED
team-a  100       0      none   1          1           1.5            1          0        0        0         0
team-b  100       0      none   1          1           0.3            1          0        0        0         0
usage: sliding 168h window, half-life 24h (team-a); tumbling 24h window, half-life 1h30m (team-b)
`,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var b bytes.Buffer
			if err := WriteQueues(&b, report.Queues(&report.Cluster{Queues: tc.queues, Pods: tc.pods}), OutputTable); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, b.String()); diff != "" {
				t.Errorf("queues table (-want,+got):\n%s", diff)
			}
		})
	}
}

// TestQueuesJSONUsage: -o json carries the usage where the admission loop
// reports it, and leaves its fields out where it does not.
func TestQueuesJSONUsage(t *testing.T) {
	r := report.Queues(&report.Cluster{Queues: []v1alpha1.Queue{
		*pt.MakeQueue("team-a").GPUStatus("6", "3", "7", 1).UsageStatus("410.25", "0.34", "5").Obj(),
		*pt.MakeQueue("team-b").GPUStatus("2", "5", "3", 1).Obj(),
	}})
	var b bytes.Buffer
	if err := WriteQueues(&b, r, OutputJSON); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Queues []map[string]any `json:"queues"`
	}
	if err := json.Unmarshal(b.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	usageKeys := []string{"usageGPUHours", "usageShare", "fairShareWithoutUsageMilli", "usageWindow"}
	want := []map[string]any{
		{"usageGPUHours": 410.25, "usageShare": 0.34, "fairShareWithoutUsageMilli": 5000.0, "usageWindow": "sliding 168h window, half-life 24h"},
		{},
	}
	var gotUsage []map[string]any
	for _, q := range got.Queues {
		m := map[string]any{}
		for _, k := range usageKeys {
			if v, ok := q[k]; ok {
				m[k] = v
			}
		}
		gotUsage = append(gotUsage, m)
	}
	if diff := cmp.Diff(want, gotUsage); diff != "" {
		t.Errorf("usage in queues -o json (-want,+got):\n%s", diff)
	}
}
