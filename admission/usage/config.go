package usage

import (
	"fmt"
	"math"
	"time"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// Defaults of the extender's --fair-share-usage-* flags and the chart's
// fairShare.usage values.
const (
	DefaultHalfLife   = 24 * time.Hour
	DefaultWindow     = 7 * 24 * time.Hour
	DefaultWindowType = v1alpha1.UsageWindowSliding
)

// Config is how usage is counted and how much it weighs.
type Config struct {
	// Weight is how much usage counts in fair share (KAI's kValue); 0 turns
	// time-based fair share off.
	Weight float64
	// HalfLife is the age at which usage counts half.
	HalfLife time.Duration
	// Window is how far back usage counts, and WindowType whether it slides
	// or starts afresh every Window (v1alpha1.UsageWindow*).
	Window     time.Duration
	WindowType string
}

// DefaultConfig returns the defaults: off, with a one-week sliding window
// and a one-day half-life once a weight is set.
func DefaultConfig() Config {
	return Config{HalfLife: DefaultHalfLife, Window: DefaultWindow, WindowType: DefaultWindowType}
}

// Enabled reports whether usage counts.
func (c Config) Enabled() bool { return c.Weight > 0 }

// Validate refuses settings that would make usage meaningless, rather than
// turn it off silently: a weight below 0, and, when the weight is above 0, a
// half-life of 0 or less, a window of less than a second or shorter than
// one admission cycle (interval), or an unknown window type.
func (c Config) Validate(interval time.Duration) error {
	if math.IsNaN(c.Weight) || math.IsInf(c.Weight, 0) || c.Weight < 0 {
		return fmt.Errorf("--fair-share-usage-weight must be 0 (off) or more, got %v", c.Weight)
	}
	if !c.Enabled() {
		return nil
	}
	if c.HalfLife <= 0 {
		return fmt.Errorf("--fair-share-usage-half-life must be above 0, got %v: usage would not decay at all or count nothing; to count all usage in the window alike, set a half-life much longer than the window", c.HalfLife)
	}
	if c.Window < time.Second {
		return fmt.Errorf("--fair-share-usage-window must be at least 1s, got %v", c.Window)
	}
	if c.Window < interval {
		return fmt.Errorf("--fair-share-usage-window %v is shorter than one admission cycle (--admission-interval %v): no usage would ever count", c.Window, interval)
	}
	switch c.WindowType {
	case v1alpha1.UsageWindowSliding, v1alpha1.UsageWindowTumbling:
	default:
		return fmt.Errorf("--fair-share-usage-window-type must be %s or %s, got %q", v1alpha1.UsageWindowSliding, v1alpha1.UsageWindowTumbling, c.WindowType)
	}
	return nil
}

// String says what the usage covers, for messages: "sliding 168h window,
// half-life 24h".
func (c Config) String() string {
	return v1alpha1.DescribeUsageWindow(c.WindowType, c.Window, c.HalfLife)
}

// bucketWidth is the smaller of window/24 and half-life/2, in whole
// seconds, at least one.
func (c Config) bucketWidth() time.Duration {
	w := min(c.Window/24, c.HalfLife/2).Truncate(time.Second)
	return max(w, time.Second)
}

// anchor is where tumbling windows and buckets start counting: Monday
// 1970-01-05 00:00 UTC.
var anchor = time.Date(1970, 1, 5, 0, 0, 0, 0, time.UTC)

// windowStart is the start of the window that ends at now.
func (c Config) windowStart(now time.Time) time.Time {
	if c.WindowType == v1alpha1.UsageWindowTumbling {
		return floorTo(now, c.Window)
	}
	return now.Add(-c.Window)
}

// floorTo rounds t down to a multiple of d counted from anchor.
func floorTo(t time.Time, d time.Duration) time.Time {
	since := t.Sub(anchor)
	return anchor.Add(since - since%d)
}

// PersistEvery is how often a queue's history is written to its status:
// every bucket, but at least every 10 seconds and at most every 5 minutes,
// so that usage costs at most 6 writes per queue a minute (short windows)
// and 0.2 at the default week, and a new leader has at most one period to
// count with what it sees held.
func (c Config) PersistEvery() time.Duration {
	return min(max(c.bucketWidth(), 10*time.Second), 5*time.Minute)
}
