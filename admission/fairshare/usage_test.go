package fairshare

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// withUsage sets q's normalized GPU usage.
func withUsage(q Queue, gpu float64) Queue {
	q.Usage = map[Resource]float64{GPU: gpu}
	return q
}

// KAI-Scheduler has no test of its time-based division to serve as an
// oracle (every case of its resource_division_test passes kValue 0, and its
// env tests assert no numbers), so the expected values are worked out by
// hand with KAI's share weight (calcShareWeights; see shareWeights): w = weight / Σweight of the wanting siblings, share
// weight = max(0, w + k×(w − usage)), offer = pool × share weight / Σ.
func TestDivideWithUsage(t *testing.T) {
	const none = Unlimited
	cases := map[string]struct {
		capacity float64
		queues   []Queue
		demand   map[string]float64
		k        float64
		want     map[string]float64
	}{
		"usage off: equal split": {
			capacity: 8,
			queues:   created(withUsage(gpuQueue("a", "", 100, 0, none, 1), 0.875), gpuQueue("b", "", 100, 0, none, 1)),
			demand:   map[string]float64{"a": 8, "b": 8},
			k:        0,
			want:     map[string]float64{"a": 4, "b": 4},
		},
		"the queue that used the cluster gets less": {
			// a: 0.5 + (0.5 − 0.875) = 0.125, b: 0.5 + 0.5 = 1; Σ 1.125.
			// Offers: a 8/9 takes 0 (fraction 0.889), b 64/9 takes 7
			// (fraction 0.111); the last GPU goes to the larger fraction, a.
			capacity: 8,
			queues:   created(withUsage(gpuQueue("a", "", 100, 0, none, 1), 0.875), gpuQueue("b", "", 100, 0, none, 1)),
			demand:   map[string]float64{"a": 8, "b": 8},
			k:        1,
			want:     map[string]float64{"a": 1, "b": 7},
		},
		"a smaller usage weight counts history less": {
			// a: 0.5 + 0.5×(0.5 − 0.875) = 0.3125, b: 0.75; Σ 1.0625.
			// Offers: a 2.353 takes 2, b 5.647 takes 5; the last to b.
			capacity: 8,
			queues:   created(withUsage(gpuQueue("a", "", 100, 0, none, 1), 0.875), gpuQueue("b", "", 100, 0, none, 1)),
			demand:   map[string]float64{"a": 8, "b": 8},
			k:        0.5,
			want:     map[string]float64{"a": 2, "b": 6},
		},
		"quota comes before history": {
			// Quotas 4 + 0; left 4: a's share weight is 0, b takes all 4.
			capacity: 8,
			queues:   created(withUsage(gpuQueue("a", "", 100, 4, none, 1), 1), gpuQueue("b", "", 100, 0, none, 1)),
			demand:   map[string]float64{"a": 8, "b": 8},
			k:        1,
			want:     map[string]float64{"a": 4, "b": 4},
		},
		"a queue that used no more than its weight gains": {
			// Weights 3 and 1: w 0.75 and 0.25; usage 0.25 and 0.25.
			// a: 0.75 + 0.5 = 1.25, b: 0.25; Σ 1.5. Offers: a 10/1.5×1.25 =
			// 8.333 takes 8, b 1.667 takes 1; the last to b (0.667).
			capacity: 10,
			queues:   created(withUsage(gpuQueue("a", "", 100, 0, none, 3), 0.25), withUsage(gpuQueue("b", "", 100, 0, none, 1), 0.25)),
			demand:   map[string]float64{"a": 10, "b": 10},
			k:        1,
			want:     map[string]float64{"a": 8, "b": 2},
		},
		"weight 0 stays 0 however little it used": {
			capacity: 4,
			queues:   created(gpuQueue("a", "", 100, 0, none, 0), withUsage(gpuQueue("b", "", 100, 0, none, 1), 1)),
			demand:   map[string]float64{"a": 4, "b": 4},
			k:        1,
			want:     map[string]float64{"a": 0, "b": 4},
		},
		"when usage leaves every share weight 0, plain weights divide": {
			capacity: 4,
			queues:   created(withUsage(gpuQueue("a", "", 100, 0, none, 1), 1), withUsage(gpuQueue("b", "", 100, 0, none, 1), 1)),
			demand:   map[string]float64{"a": 4, "b": 4},
			k:        1,
			want:     map[string]float64{"a": 2, "b": 2},
		},
		"a parent's usage is its children's, weighed against its siblings": {
			// Top: p1 used 0.5 + 0.25 = 0.75, p2 0. p1: 0.25, p2: 1; Σ 1.25.
			// Offers: p1 1.6 takes 1, p2 6.4 takes 6; the last to p1 (0.6).
			// In p1 (2 of 8): a1 used 0.5 × 8/2 = 2 of it, a2 1: both share
			// weights are 0, so plain weights split 1 and 1.
			capacity: 8,
			queues: created(
				gpuQueue("p1", "", 100, 0, none, 1), gpuQueue("p2", "", 100, 0, none, 1),
				withUsage(gpuQueue("a1", "p1", 100, 0, none, 1), 0.5), withUsage(gpuQueue("a2", "p1", 100, 0, none, 1), 0.25),
				gpuQueue("b1", "p2", 100, 0, none, 1)),
			demand: map[string]float64{"a1": 8, "a2": 8, "b1": 8},
			k:      1,
			want:   map[string]float64{"p1": 2, "p2": 6, "a1": 1, "a2": 1, "b1": 6},
		},
		"below the top, usage counts against the parent's share": {
			// p (limit 8) gets 8 of 40. a used 0.175 of the cluster, 7 GPUs'
			// worth: 0.875 of p's 8. a: 0.5 + (0.5 − 0.875) = 0.125, b: 1,
			// as if p were the cluster. (Against the cluster, as KAI does,
			// a would count 0.175, weigh 0.825 against 1, and get 4.)
			capacity: 40,
			queues: created(
				gpuQueue("p", "", 100, 0, 8, 1),
				withUsage(gpuQueue("a", "p", 100, 0, none, 1), 0.175), gpuQueue("b", "p", 100, 0, none, 1)),
			demand: map[string]float64{"a": 8, "b": 8},
			k:      1,
			want:   map[string]float64{"p": 8, "a": 1, "b": 7},
		},
		"a parent's own usage overrides its children's sum": {
			// p1 says 0: the two parents are even, 4 and 4.
			capacity: 8,
			queues: created(
				withUsage(gpuQueue("p1", "", 100, 0, none, 1), 0), gpuQueue("p2", "", 100, 0, none, 1),
				withUsage(gpuQueue("a1", "p1", 100, 0, none, 1), 0.5),
				gpuQueue("b1", "p2", 100, 0, none, 1)),
			demand: map[string]float64{"a1": 8, "b1": 8},
			k:      1,
			want:   map[string]float64{"p1": 4, "p2": 4, "a1": 4, "b1": 4},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			d, err := DivideWith(map[Resource]float64{GPU: tc.capacity}, tc.queues, gpuDemand(tc.demand), Options{UsageWeight: tc.k})
			if err != nil {
				t.Fatalf("DivideWith: %v", err)
			}
			if diff := cmp.Diff(tc.want, fairShares(d, GPU)); diff != "" {
				t.Errorf("fair shares (-want,+got):\n%s", diff)
			}
		})
	}
}

func TestDivideWithUsageErrors(t *testing.T) {
	cases := map[string]struct {
		queues []Queue
		k      float64
		want   string
	}{
		"negative usage": {
			queues: []Queue{withUsage(gpuQueue("a", "", 100, 0, Unlimited, 1), -0.1)},
			k:      1,
			want:   `divide fair share: queue "a" usage gpu: must be at least 0, got -0.1`,
		},
		"usage of a resource without capacity": {
			queues: []Queue{{Name: "a", Usage: map[Resource]float64{CPU: 0.1}}},
			k:      1,
			want:   `divide fair share: queue "a" usage cpu: is not in the capacity; add it there (0 if the cluster has none)`,
		},
		"negative weight": {
			queues: []Queue{gpuQueue("a", "", 100, 0, Unlimited, 1)},
			k:      -1,
			want:   `divide fair share: usage weight: must be at least 0, got -1`,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := DivideWith(map[Resource]float64{GPU: 4}, tc.queues, nil, Options{UsageWeight: tc.k})
			if err == nil {
				t.Fatalf("DivideWith returned no error, want %q", tc.want)
			}
			if diff := cmp.Diff(tc.want, err.Error()); diff != "" {
				t.Errorf("error (-want,+got):\n%s", diff)
			}
		})
	}
}

func TestLoadUsage(t *testing.T) {
	in, err := Load(strings.NewReader(`
capacity: {gpu: 8}
usageWeight: 1
queues:
- {name: a, usage: {gpu: 0.875}}
- {name: b}
demand: {a: {gpu: 8}, b: {gpu: 8}}
`))
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	d, err := in.Divide()
	if err != nil {
		t.Fatalf("Divide: %v", err)
	}
	if diff := cmp.Diff(map[string]float64{"a": 1, "b": 7}, fairShares(d, GPU)); diff != "" {
		t.Errorf("fair shares (-want,+got):\n%s", diff)
	}
	var table strings.Builder
	if err := WriteTable(&table, d); err != nil {
		t.Fatal(err)
	}
	want := `gpu: capacity 8, usage weight 1
QUEUE  PRIORITY  QUOTA  LIMIT  WEIGHT  USAGE  DEMAND  FAIR SHARE  ALLOCATABLE
a      100       0      none   1       0.875  8       1           8
b      100       0      none   1       0      8       7           8
`
	if diff := cmp.Diff(want, table.String()); diff != "" {
		t.Errorf("table (-want,+got):\n%s", diff)
	}
}
