package usage

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// t0 is a bucket boundary for every width the tests use.
var t0 = time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC) // a Monday

func config(halfLife, window time.Duration, windowType string) Config {
	return Config{Weight: 1, HalfLife: halfLife, Window: window, WindowType: windowType}
}

// closedForm is ∫ x × 0.5^((now−s)/h) ds over [now−T, now]: a constant
// rate x held for T up to now.
func closedForm(x float64, held, halfLife time.Duration) float64 {
	h := halfLife.Seconds()
	return x * h / math.Ln2 * (1 - math.Exp2(-held.Seconds()/h))
}

var approx = cmpopts.EquateApprox(1e-9, 1e-9)

// observeEvery feeds held for queue "a" from start to end every step.
func observeEvery(tr *Tracker, start, end time.Time, step time.Duration, held Amounts) {
	for now := start; !now.After(end); now = now.Add(step) {
		tr.Observe(now, map[string]Amounts{"a": held})
	}
}

func TestDecayMatchesClosedForm(t *testing.T) {
	cases := map[string]struct {
		halfLife, window time.Duration
		held             time.Duration
		step             time.Duration
		idleAfter        time.Duration
	}{
		"within one bucket":             {halfLife: time.Hour, window: 24 * time.Hour, held: 10 * time.Minute, step: 7 * time.Second},
		"across many buckets":           {halfLife: time.Hour, window: 24 * time.Hour, held: 5 * time.Hour, step: 13 * time.Second},
		"irregular cycles, short life":  {halfLife: 20 * time.Second, window: 10 * time.Minute, held: 3 * time.Minute, step: 1700 * time.Millisecond},
		"then idle: decays by halves":   {halfLife: time.Hour, window: 24 * time.Hour, held: 2 * time.Hour, step: time.Minute, idleAfter: 3 * time.Hour},
		"half-life longer than window":  {halfLife: 100 * time.Hour, window: 24 * time.Hour, held: 6 * time.Hour, step: time.Minute},
		"held exactly one whole window": {halfLife: time.Hour, window: 6 * time.Hour, held: 6 * time.Hour, step: time.Minute},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			tr := NewTracker(config(tc.halfLife, tc.window, v1alpha1.UsageWindowSliding))
			held := Amounts{GPU: 8, CPU: 64, Memory: 512 << 30}
			end := t0.Add(tc.held)
			observeEvery(tr, t0, end, tc.step, held)
			tr.Observe(end, map[string]Amounts{"a": {}}) // the last stretch, then nothing
			now := end.Add(tc.idleAfter)
			tr.Observe(now, nil)
			got := tr.Usage(now, map[string]string{"a": ""}, held)["a"]
			f := math.Exp2(-tc.idleAfter.Seconds() / tc.halfLife.Seconds())
			want := Amounts{
				GPU:    closedForm(8, tc.held, tc.halfLife) * f,
				CPU:    closedForm(64, tc.held, tc.halfLife) * f,
				Memory: closedForm(512<<30, tc.held, tc.halfLife) * f,
			}
			if diff := cmp.Diff(want, got.Used, approx); diff != "" {
				t.Errorf("used (-want,+got):\n%s", diff)
			}
			// Share: over what the capacity (held) gives over the window.
			p := closedForm(1, tc.window, tc.halfLife)
			wantShare := want.GPU / (8 * p)
			if diff := cmp.Diff(wantShare, got.Share.GPU, approx); diff != "" {
				t.Errorf("share (-want,+got):\n%s", diff)
			}
		})
	}
}

func TestHoldingAllTheWindowIsShareOne(t *testing.T) {
	tr := NewTracker(config(30*time.Minute, 4*time.Hour, v1alpha1.UsageWindowSliding))
	observeEvery(tr, t0, t0.Add(9*time.Hour), time.Minute, Amounts{GPU: 4})
	now := t0.Add(9 * time.Hour)
	got := tr.Usage(now, map[string]string{"a": ""}, Amounts{GPU: 4})["a"]
	if math.Abs(got.Share.GPU-1) > 1e-9 {
		t.Errorf("share %v, want 1", got.Share.GPU)
	}
	if n := len(tr.history["a"]); n > int(4*time.Hour/tr.width)+2 {
		t.Errorf("%d buckets kept, want at most the window's %d + 2", n, 4*time.Hour/tr.width)
	}
}

func TestSlidingWindowForgets(t *testing.T) {
	// Held for an hour, then nothing: after the window has passed the
	// hour, usage is 0 and the buckets are gone.
	tr := NewTracker(config(10*time.Hour, 2*time.Hour, v1alpha1.UsageWindowSliding))
	observeEvery(tr, t0, t0.Add(time.Hour), time.Minute, Amounts{GPU: 2})
	tr.Observe(t0.Add(time.Hour), map[string]Amounts{})
	mid := t0.Add(2*time.Hour + 30*time.Minute) // the window starts at 0:30
	tr.Observe(mid, nil)
	got := tr.Usage(mid, map[string]string{"a": ""}, Amounts{GPU: 2})["a"].Used.GPU
	// The part of the hour inside the window: [0:30, 1:00] with a
	// bucket width of 5 min, aligned, so exact.
	want := closedForm(2, 30*time.Minute, 10*time.Hour) * math.Exp2(-1.5/10)
	if math.Abs(got-want) > 1e-9*want {
		t.Errorf("half inside the window: used %v, want %v", got, want)
	}
	late := t0.Add(3*time.Hour + time.Second)
	tr.Observe(late, nil)
	if got := tr.Usage(late, map[string]string{"a": ""}, Amounts{GPU: 2})["a"].Used; !got.isZero() {
		t.Errorf("after the window: used %v, want 0", got)
	}
	if len(tr.history) != 0 {
		t.Errorf("history kept after the window: %v", tr.history)
	}
}

func TestTumblingWindowStartsAfresh(t *testing.T) {
	tr := NewTracker(config(100*time.Hour, 24*time.Hour, v1alpha1.UsageWindowTumbling))
	start := t0.Add(20 * time.Hour)
	observeEvery(tr, start, t0.Add(26*time.Hour), time.Minute, Amounts{GPU: 1})
	now := t0.Add(26 * time.Hour) // 02:00 the next day: 2 hours count
	got := tr.Usage(now, map[string]string{"a": ""}, Amounts{GPU: 1})["a"]
	if want := closedForm(1, 2*time.Hour, 100*time.Hour); math.Abs(got.Used.GPU-want) > 1e-9*want {
		t.Errorf("used %v, want %v (only since midnight)", got.Used.GPU, want)
	}
	// Potential since midnight is 2 hours' too: holding all means 1.
	if math.Abs(got.Share.GPU-1) > 1e-9 {
		t.Errorf("share %v, want 1", got.Share.GPU)
	}
}

func TestUsageRollsUpToParents(t *testing.T) {
	tr := NewTracker(config(time.Hour, 24*time.Hour, v1alpha1.UsageWindowSliding))
	for now := t0; !now.After(t0.Add(time.Hour)); now = now.Add(time.Minute) {
		tr.Observe(now, map[string]Amounts{"a1": {GPU: 1}, "a2": {GPU: 3}, "b": {GPU: 4}})
	}
	now := t0.Add(time.Hour)
	tree := map[string]string{"org": "", "team-a": "org", "a1": "team-a", "a2": "team-a", "b": "org", "idle": ""}
	got := tr.Usage(now, tree, Amounts{GPU: 8})
	one := closedForm(1, time.Hour, time.Hour)
	want := map[string]float64{"org": 8 * one, "team-a": 4 * one, "a1": one, "a2": 3 * one, "b": 4 * one, "idle": 0}
	gotGPU := map[string]float64{}
	for name, r := range got {
		gotGPU[name] = r.Used.GPU
	}
	if diff := cmp.Diff(want, gotGPU, approx); diff != "" {
		t.Errorf("used GPU-seconds (-want,+got):\n%s", diff)
	}
}

func TestRestoreCarriesOn(t *testing.T) {
	cfg := config(time.Hour, 24*time.Hour, v1alpha1.UsageWindowSliding)
	tree := map[string]string{"a": "", "b": ""}
	capacity := Amounts{GPU: 8}

	// One leader all along.
	whole := NewTracker(cfg)
	for now := t0; !now.After(t0.Add(3 * time.Hour)); now = now.Add(time.Second * 10) {
		whole.Observe(now, map[string]Amounts{"a": {GPU: 6}, "b": {GPU: 2}})
	}
	end := t0.Add(3 * time.Hour)
	want := whole.Usage(end, tree, capacity)

	// The first leader writes status at 2h and dies; the next starts at
	// 2h01m and sees the same pods.
	first := NewTracker(cfg)
	for now := t0; !now.After(t0.Add(2 * time.Hour)); now = now.Add(time.Second * 10) {
		first.Observe(now, map[string]Amounts{"a": {GPU: 6}, "b": {GPU: 2}})
	}
	written := first.Usage(t0.Add(2*time.Hour), tree, capacity)
	statuses := map[string]*v1alpha1.QueueUsage{}
	for name := range tree {
		statuses[name] = roundTrip(t, first.Status(name, t0.Add(2*time.Hour), written[name]))
	}
	next := NewTracker(cfg)
	next.Restore(statuses)
	for now := t0.Add(2*time.Hour + time.Minute); !now.After(end); now = now.Add(time.Second * 10) {
		next.Observe(now, map[string]Amounts{"a": {GPU: 6}, "b": {GPU: 2}})
	}
	got := next.Usage(end, tree, capacity)
	// Statuses keep micro-GPU-hours: 3.6 ms of a GPU.
	if diff := cmp.Diff(want, got, cmpopts.EquateApprox(1e-6, 0)); diff != "" {
		t.Errorf("usage after failover (-one leader,+two):\n%s", diff)
	}
}

// roundTrip passes a status through its quantities' text, as the API does.
func roundTrip(t *testing.T, st *v1alpha1.QueueUsage) *v1alpha1.QueueUsage {
	t.Helper()
	out := st.DeepCopy()
	for i, b := range out.Buckets {
		for name, q := range b.Used {
			b.Used[name] = mustParse(t, q.String())
		}
		out.Buckets[i] = b
	}
	return out
}

func TestRestoreConvertsHalfLife(t *testing.T) {
	old := NewTracker(config(time.Hour, 24*time.Hour, v1alpha1.UsageWindowSliding))
	observeEvery(old, t0, t0.Add(2*time.Hour), time.Minute, Amounts{GPU: 1})
	now := t0.Add(2 * time.Hour)
	st := old.Status("a", now, Report{})

	next := NewTracker(config(4*time.Hour, 24*time.Hour, v1alpha1.UsageWindowSliding))
	next.Restore(map[string]*v1alpha1.QueueUsage{"a": st})
	got := next.Usage(now, map[string]string{"a": ""}, Amounts{GPU: 1})["a"].Used.GPU
	// Even use within each bucket: the conversion is exact.
	if want := closedForm(1, 2*time.Hour, 4*time.Hour); math.Abs(got-want) > 1e-6*want {
		t.Errorf("used %v, want %v as if counted with the new half-life", got, want)
	}
}

func TestRestoreKeepsNewerMemory(t *testing.T) {
	tr := NewTracker(config(time.Hour, 24*time.Hour, v1alpha1.UsageWindowSliding))
	observeEvery(tr, t0, t0.Add(time.Hour), time.Minute, Amounts{GPU: 1})
	stale := &v1alpha1.QueueUsage{UpdateTime: ptrTime(t0.Add(30 * time.Minute))}
	tr.Restore(map[string]*v1alpha1.QueueUsage{"a": stale})
	if len(tr.history["a"]) == 0 {
		t.Errorf("Restore from an older status dropped the tracker's own history")
	}
}

func TestConfigValidate(t *testing.T) {
	cases := map[string]struct {
		cfg  Config
		want string
	}{
		"off is fine whatever else":  {cfg: Config{Weight: 0}},
		"defaults with a weight":     {cfg: Config{Weight: 1, HalfLife: DefaultHalfLife, Window: DefaultWindow, WindowType: DefaultWindowType}},
		"negative weight":            {cfg: Config{Weight: -1}, want: "--fair-share-usage-weight must be 0 (off) or more, got -1"},
		"zero half-life":             {cfg: config(0, time.Hour, "sliding"), want: "--fair-share-usage-half-life must be above 0, got 0s"},
		"negative half-life":         {cfg: config(-time.Hour, time.Hour, "sliding"), want: "--fair-share-usage-half-life must be above 0, got -1h0m0s"},
		"window shorter than cycle":  {cfg: config(time.Hour, 1500*time.Millisecond, "sliding"), want: "--fair-share-usage-window 1.5s is shorter than one admission cycle (--admission-interval 2s)"},
		"window shorter than second": {cfg: config(time.Hour, time.Millisecond, "sliding"), want: "--fair-share-usage-window must be at least 1s, got 1ms"},
		"unknown window type":        {cfg: config(time.Hour, time.Hour, "rolling"), want: `--fair-share-usage-window-type must be sliding or tumbling, got "rolling"`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			err := tc.cfg.Validate(2 * time.Second)
			got := ""
			if err != nil {
				got = err.Error()
			}
			if !strings.HasPrefix(got, tc.want) || (tc.want == "") != (got == "") {
				t.Errorf("Validate() = %q, want it to start with %q", got, tc.want)
			}
		})
	}
}

func TestConfigString(t *testing.T) {
	if got, want := DefaultConfig().String(), "sliding 168h window, half-life 24h"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
}

// TestBucketsStayWithinTheCRDBound: for half-lives from a second to days and
// windows from a minute to a week, a queue that holds GPUs all along keeps
// fewer buckets than status.usage.buckets allows (128).
func TestBucketsStayWithinTheCRDBound(t *testing.T) {
	for _, h := range []time.Duration{time.Second, 3 * time.Second, 7 * time.Second, time.Minute, time.Hour, 24 * time.Hour} {
		for _, w := range []time.Duration{time.Minute, time.Hour, 168 * time.Hour} {
			tr := NewTracker(config(h, w, v1alpha1.UsageWindowSliding))
			step := max(tr.width/3, time.Second)
			end := t0.Add(min(w, 40*h) + 3*tr.width)
			observeEvery(tr, t0, end, step, Amounts{GPU: 1})
			if n := len(tr.history["a"]); n >= maxBuckets {
				t.Errorf("half-life %v, window %v: %d buckets, the CRD allows %d", h, w, n, maxBuckets)
			}
		}
	}
}
