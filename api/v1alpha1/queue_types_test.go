package v1alpha1

import (
	"testing"
	"time"
)

func TestDescribeUsageWindow(t *testing.T) {
	cases := map[string]struct {
		windowType       string
		window, halfLife time.Duration
		want             string
	}{
		"defaults":          {UsageWindowSliding, 168 * time.Hour, 24 * time.Hour, "sliding 168h window, half-life 24h"},
		"tumbling day":      {UsageWindowTumbling, 24 * time.Hour, 90 * time.Minute, "tumbling 24h window, half-life 1h30m"},
		"seconds":           {UsageWindowSliding, 90 * time.Second, 45 * time.Second, "sliding 1m30s window, half-life 45s"},
		"hours and seconds": {UsageWindowSliding, 2 * time.Hour, time.Hour + time.Second, "sliding 2h window, half-life 1h0m1s"},
		"no type recorded":  {"", 10 * time.Minute, time.Minute, "10m window, half-life 1m"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := DescribeUsageWindow(tc.windowType, tc.window, tc.halfLife); got != tc.want {
				t.Errorf("DescribeUsageWindow() = %q, want %q", got, tc.want)
			}
		})
	}
}
