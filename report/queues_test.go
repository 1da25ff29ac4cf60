package report

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/partita-dev/partita/api/v1alpha1"
	pt "github.com/partita-dev/partita/internal/partitatest"
)

func TestQueuesLoop(t *testing.T) {
	got := Queues(&Cluster{Queues: []v1alpha1.Queue{
		*pt.MakeQueue("a").Parent("b").Obj(), *pt.MakeQueue("b").Parent("a").Obj(),
	}})
	var names, notes []string
	for _, q := range got.Queues {
		names = append(names, q.Name)
		notes = append(notes, q.Note)
	}
	if diff := cmp.Diff([]string{"a", "b"}, names); diff != "" {
		t.Errorf("queues (-want,+got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"in a loop of parents", "in a loop of parents"}, notes); diff != "" {
		t.Errorf("notes (-want,+got):\n%s", diff)
	}
}

func TestQueuesUsage(t *testing.T) {
	type fields struct {
		GPUHours, Share *float64
		WithoutUsage    *int64
		Window          string
		HistoryDecided  bool
	}
	f := func(v float64) *float64 { return &v }
	m := func(v int64) *int64 { return &v }
	cases := map[string]struct {
		queue *v1alpha1.Queue
		want  fields
	}{
		"time-based fair share off": {
			queue: pt.MakeQueue("team-a").GPUStatus("2", "3", "4", 0).Obj(),
		},
		"history decided": {
			queue: pt.MakeQueue("team-a").GPUStatus("2", "3", "4", 0).UsageStatus("410.123456", "0.341", "5").Obj(),
			want:  fields{GPUHours: f(410.123456), Share: f(0.341), WithoutUsage: m(5000), Window: "sliding 168h window, half-life 24h", HistoryDecided: true},
		},
		"usage changed nothing": {
			queue: pt.MakeQueue("team-a").GPUStatus("2", "3", "4", 0).UsageStatus("1.5", "0.01", "3").Obj(),
			want:  fields{GPUHours: f(1.5), Share: f(0.01), WithoutUsage: m(3000), Window: "sliding 168h window, half-life 24h"},
		},
		"fair share not reported yet": {
			queue: pt.MakeQueue("team-a").UsageStatus("1.5", "", "3").UsageWindow(v1alpha1.UsageWindowTumbling, 24*time.Hour, 90*time.Minute).Obj(),
			want:  fields{GPUHours: f(1.5), WithoutUsage: m(3000), Window: "tumbling 24h window, half-life 1h30m"},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			r := Queues(&Cluster{Queues: []v1alpha1.Queue{*tc.queue}}).Queues[0]
			got := fields{GPUHours: r.UsageGPUHours, Share: r.UsageShare, WithoutUsage: r.FairShareWithoutUsageMilli, Window: r.UsageWindow, HistoryDecided: r.HistoryDecided()}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("usage (-want,+got):\n%s", diff)
			}
		})
	}
}
