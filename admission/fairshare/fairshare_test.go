package fairshare

import (
	"math"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// gpuQueue makes a queue that configures only gpu.
func gpuQueue(name, parent string, priority int32, quota, limit, weight float64) Queue {
	return Queue{
		Name:      name,
		Parent:    parent,
		Priority:  priority,
		Resources: map[Resource]Settings{GPU: {Quota: quota, Limit: limit, OverQuotaWeight: weight}},
	}
}

// created sets each queue's CreationOrder to its index, as if created in list order.
func created(qs ...Queue) []Queue {
	for i := range qs {
		qs[i].CreationOrder = i
	}
	return qs
}

func gpuDemand(d map[string]float64) map[string]map[Resource]float64 {
	out := make(map[string]map[Resource]float64, len(d))
	for name, v := range d {
		out[name] = map[Resource]float64{GPU: v}
	}
	return out
}

func fairShares(d Division, r Resource) map[string]float64 {
	out := make(map[string]float64, len(d.Queues))
	for _, q := range d.Queues {
		out[q.Name] = q.FairShare[r]
	}
	return out
}

// Expected values are worked out by hand from design §6; "left" is what the
// level still has to give, "offer" is pool × weight / Σweight.
func TestDivideGPU(t *testing.T) {
	const (
		none = Unlimited
		all  = Unlimited
	)
	cases := map[string]struct {
		capacity float64
		queues   []Queue
		demand   map[string]float64
		want     map[string]float64
	}{
		"equal weights share what is left equally": {
			// Quotas 0, left 9; offers 3 each; all want 10, take 3.
			capacity: 9,
			queues: created(
				gpuQueue("a", "", 100, 0, none, 1),
				gpuQueue("b", "", 100, 0, none, 1),
				gpuQueue("c", "", 100, 0, none, 1),
			),
			demand: map[string]float64{"a": 10, "b": 10, "c": 10},
			want:   map[string]float64{"a": 3, "b": 3, "c": 3},
		},
		"quotas are given in full even when they add up to more than the capacity": {
			// 1. a min(8,8)=8, b min(6,10)=6, c 0: 14 > 10, left ≤ 0, stop.
			capacity: 10,
			queues: created(
				gpuQueue("a", "", 100, 8, none, 1),
				gpuQueue("b", "", 100, 6, none, 1),
				gpuQueue("c", "", 100, 0, none, 1),
			),
			demand: map[string]float64{"a": 8, "b": 10, "c": 5},
			want:   map[string]float64{"a": 8, "b": 6, "c": 0},
		},
		"quota -1 is the whole capacity of the level": {
			// 1. a min(6,10)=6, b 0; left 0, stop.
			capacity: 6,
			queues: created(
				gpuQueue("a", "", 100, all, none, 1),
				gpuQueue("b", "", 100, 0, none, 1),
			),
			demand: map[string]float64{"a": 10, "b": 3},
			want:   map[string]float64{"a": 6, "b": 0},
		},
		"weight 0 gets nothing over quota and the rest stays unassigned": {
			// 1. a 2, b 2, left 6. 2. Σweight 1 (a adds 0): b offered 6, wants
			// 2, takes 2; round 2: only a wants more, Σweight 0, stop. 4 unassigned.
			capacity: 10,
			queues: created(
				gpuQueue("a", "", 100, 2, none, 0),
				gpuQueue("b", "", 100, 2, none, 1),
			),
			demand: map[string]float64{"a": 8, "b": 4},
			want:   map[string]float64{"a": 2, "b": 4},
		},
		"whole units first, then one unit to the largest fraction": {
			// 1. 2+2, left 7. 2. a offered 7×1/5=1.4, takes 1 (0.4); b offered
			// 7×4/5=5.6, takes 5 (0.6); nobody wanted less, left 1.
			// 3. b (0.6) gets 1.
			capacity: 11,
			queues: created(
				gpuQueue("a", "", 100, 2, none, 1),
				gpuQueue("b", "", 100, 2, none, 4),
			),
			demand: map[string]float64{"a": 10, "b": 10},
			want:   map[string]float64{"a": 3, "b": 8},
		},
		"equal fractions go to the earlier-created queue": {
			// 1. 2+2, left 7. 2. offers 3.5, both take 3 (0.5), left 1.
			// 3. zeta was created first (order 0) though listed second: zeta +1.
			capacity: 11,
			queues: []Queue{
				{Name: "alpha", Priority: 100, CreationOrder: 1, Resources: map[Resource]Settings{GPU: {Quota: 2, Limit: none, OverQuotaWeight: 2}}},
				{Name: "zeta", Priority: 100, CreationOrder: 0, Resources: map[Resource]Settings{GPU: {Quota: 2, Limit: none, OverQuotaWeight: 2}}},
			},
			demand: map[string]float64{"alpha": 6, "zeta": 6},
			want:   map[string]float64{"alpha": 5, "zeta": 6},
		},
		"equal fractions and creation order go to the smaller name": {
			// As above with the same creation order: alpha < zeta gets the unit.
			capacity: 11,
			queues: []Queue{
				gpuQueue("zeta", "", 100, 2, none, 2),
				gpuQueue("alpha", "", 100, 2, none, 2),
			},
			demand: map[string]float64{"alpha": 6, "zeta": 6},
			want:   map[string]float64{"alpha": 6, "zeta": 5},
		},
		"quota plus over-quota weights 2:1": {
			// 1. 3+3, left 6. 2. a offered 6×2/3=4, b 6×1/3=2; both want more.
			capacity: 12,
			queues: created(
				gpuQueue("a", "", 100, 3, none, 2),
				gpuQueue("b", "", 100, 3, none, 1),
			),
			demand: map[string]float64{"a": 20, "b": 20},
			want:   map[string]float64{"a": 7, "b": 5},
		},
		"the higher priority tier takes what it wants first, quota still comes first": {
			// 1. hi 1, lo 1 (quota ignores priority), left 8.
			// 2. tier 200: hi offered 8, wants 9, takes 8; left 0.
			capacity: 10,
			queues: created(
				gpuQueue("lo", "", 100, 1, none, 1),
				gpuQueue("hi", "", 200, 1, none, 1),
			),
			demand: map[string]float64{"hi": 10, "lo": 10},
			want:   map[string]float64{"hi": 9, "lo": 1},
		},
		"a satisfied tier passes the rest to the next": {
			// 1. 1+1, left 8. 2. tier 200: hi offered 8, wants 4, takes 4; left 4.
			// tier 100: lo offered 4, wants 9, takes 4.
			capacity: 10,
			queues: created(
				gpuQueue("hi", "", 200, 1, none, 1),
				gpuQueue("lo", "", 100, 1, none, 1),
			),
			demand: map[string]float64{"hi": 5, "lo": 10},
			want:   map[string]float64{"hi": 5, "lo": 5},
		},
		"whole units made of a tier's fractions go to the next tier before step 3": {
			// 1. hi 1, low 1, left 8. 2. tier 200: hi wants 5, offered 8, takes
			// 5; left 3. tier 100: m1, m2 offered 1.5, take 1 (0.5 each); left 1.
			// tier 50: low wants 3, offered 1, takes 1; left 0. 3. nothing left.
			capacity: 10,
			queues: created(
				gpuQueue("hi", "", 200, 1, none, 1),
				gpuQueue("m1", "", 100, 0, none, 1),
				gpuQueue("m2", "", 100, 0, none, 1),
				gpuQueue("low", "", 50, 1, none, 1),
			),
			demand: map[string]float64{"hi": 6, "m1": 10, "m2": 10, "low": 4},
			want:   map[string]float64{"hi": 6, "m1": 1, "m2": 1, "low": 2},
		},
		"limits cap the share and limit 0 means nothing": {
			// requestable: a 4, b 10, c 0. 1. a 2, b 2, c min(2,0)=0, left 6.
			// 2. a offered 3, wants 2, takes 2; b offered 3, takes 3; left 1.
			// round 2: b offered 1, takes 1.
			capacity: 10,
			queues: created(
				gpuQueue("a", "", 100, 2, 4, 1),
				gpuQueue("b", "", 100, 2, none, 1),
				gpuQueue("c", "", 100, 2, 0, 1),
			),
			demand: map[string]float64{"a": 10, "b": 10, "c": 5},
			want:   map[string]float64{"a": 4, "b": 6, "c": 0},
		},
		"queues with no demand get nothing, not even their quota": {
			// 1. a min(4,0)=0, b 0, c 0 (no demand entry), left 8.
			// 2. only b wants: offered 8, takes 6. 2 unassigned.
			capacity: 8,
			queues: created(
				gpuQueue("a", "", 100, 4, none, 1),
				gpuQueue("b", "", 100, 0, none, 1),
				gpuQueue("c", "", 100, 2, none, 1),
			),
			demand: map[string]float64{"a": 0, "b": 6},
			want:   map[string]float64{"a": 0, "b": 6, "c": 0},
		},
		"more demand than capacity": {
			// 1. 1+1, left 2. 2. offers 1 each.
			capacity: 4,
			queues: created(
				gpuQueue("a", "", 100, 1, none, 1),
				gpuQueue("b", "", 100, 1, none, 1),
			),
			demand: map[string]float64{"a": 100, "b": 100},
			want:   map[string]float64{"a": 2, "b": 2},
		},
		"capacity that does not divide evenly": {
			// 2. offers 10/3, all take 3 (1/3 each), left 1. 3. a, created first, +1.
			capacity: 10,
			queues: created(
				gpuQueue("a", "", 100, 0, none, 1),
				gpuQueue("b", "", 100, 0, none, 1),
				gpuQueue("c", "", 100, 0, none, 1),
			),
			demand: map[string]float64{"a": 10, "b": 10, "c": 10},
			want:   map[string]float64{"a": 4, "b": 3, "c": 3},
		},
		"step 3 never gives a queue more than it still wants": {
			// 2. offers 2/3, all want 0.8, take 0 (2/3 each), left 2.
			// 3. a gets min(1, 2, 0.8)=0.8, b 0.8, c what is left, 0.4.
			// KAI gives min(1, left) alone: a 1, b 1, c 0.
			capacity: 2,
			queues: created(
				gpuQueue("a", "", 100, 0, none, 1),
				gpuQueue("b", "", 100, 0, none, 1),
				gpuQueue("c", "", 100, 0, none, 1),
			),
			demand: map[string]float64{"a": 0.8, "b": 0.8, "c": 0.8},
			want:   map[string]float64{"a": 0.8, "b": 0.8, "c": 0.4},
		},
		"step 3 ranks by the fraction of the last round, not the sum over rounds": {
			// 2. round 1 (pool 6.2, Σw 4): s offered 1.55, wants 1, takes 1;
			// x offered 3.1, takes 3 (0.1); y offered 1.55, takes 1 (0.55); left 1.2.
			// round 2 (Σw 3): x offered 0.8, y 0.4; both take 0 (0.8, 0.4).
			// 3. x (0.8) +1, y (0.4) the last 0.2. Summed fractions (0.9 < 0.95)
			// would have put y first.
			capacity: 6.2,
			queues: created(
				gpuQueue("s", "", 100, 0, none, 1),
				gpuQueue("x", "", 100, 0, none, 2),
				gpuQueue("y", "", 100, 0, none, 1),
			),
			demand: map[string]float64{"s": 1, "x": 10, "y": 10},
			want:   map[string]float64{"s": 1, "x": 4, "y": 1.2},
		},
		"a round with a whole offer keeps the earlier fraction": {
			// 1. 2+3+0, left 5.5. 2. round 1 (Σw 4): research offered 2.75, takes
			// 2 (0.75); prod offered 1.375, wants 1, takes 1; dev offered 1.375,
			// takes 1 (0.375); left 1.5. round 2 (Σw 3): research offered 1,
			// takes 1 and keeps 0.75; dev offered 0.5, takes 0 (0.5); left 0.5.
			// 3. research (0.75) before dev (0.5) gets 0.5.
			capacity: 10.5,
			queues: created(
				gpuQueue("research", "", 100, 2, none, 2),
				gpuQueue("prod", "", 100, 3, none, 1),
				gpuQueue("dev", "", 100, 0, none, 1),
			),
			demand: map[string]float64{"research": 8, "prod": 4, "dev": 6},
			want:   map[string]float64{"research": 5.5, "prod": 4, "dev": 1},
		},
		"exact arithmetic: 5 − 0.4 − 0.6 is 4 whole units": {
			// 1. a 0.4, b 0.6, left 4 (3.9999999999999996 in float64).
			// 2. tier 100: c and d offered 2 each, take 2; nothing for tier 50.
			// In float64 c and d would take 1 each, e the unit their fractions
			// add up to, and step 3 the rest.
			capacity: 5,
			queues: created(
				gpuQueue("a", "", 100, 0.4, none, 1),
				gpuQueue("b", "", 100, 0.6, none, 1),
				gpuQueue("c", "", 100, 0, none, 1),
				gpuQueue("d", "", 100, 0, none, 1),
				gpuQueue("e", "", 50, 0, none, 1),
			),
			demand: map[string]float64{"a": 0.4, "b": 0.6, "c": 10, "d": 10, "e": 10},
			want:   map[string]float64{"a": 0.4, "b": 0.6, "c": 2, "d": 2, "e": 0},
		},
		"the worked example of the package doc": {
			capacity: 10,
			queues: created(
				gpuQueue("research", "", 100, 2, none, 2),
				gpuQueue("prod", "", 100, 2, none, 1),
				gpuQueue("dev", "", 100, 0, none, 1),
				gpuQueue("batch", "", 50, 1, none, 1),
			),
			demand: map[string]float64{"research": 8, "prod": 3, "dev": 6, "batch": 1.5},
			want:   map[string]float64{"research": 4.5, "prod": 3, "dev": 1, "batch": 1.5},
		},
		"three levels": {
			// requests: team-a 9, org 12, lab 12.
			// level 1 (16): org 8, lab 4, left 4; offers 2 and 2: org 10, lab 6.
			// level 2 (org's 10): team-a 4, team-b 2, left 4; team-a offered
			// 8/3, takes 2; team-b offered 4/3, wants 1, takes 1; left 1;
			// round 2: team-a offered 1, takes 1: team-a 7, team-b 3.
			// level 3 (team-a's 7): a-train 1, a-infer 2, left 4; only a-train
			// wants more: offered 4, takes 4: a-train 5.
			capacity: 16,
			queues: created(
				gpuQueue("org", "", 100, 8, none, 1),
				gpuQueue("team-a", "org", 100, 4, none, 2),
				gpuQueue("a-train", "team-a", 100, 1, none, 1),
				gpuQueue("a-infer", "team-a", 100, 2, none, 1),
				gpuQueue("team-b", "org", 100, 2, none, 1),
				gpuQueue("lab", "", 100, 4, none, 1),
			),
			demand: map[string]float64{"a-train": 7, "a-infer": 2, "team-b": 3, "lab": 12},
			want: map[string]float64{
				"org": 10, "team-a": 7, "a-train": 5, "a-infer": 2, "team-b": 3, "lab": 6,
			},
		},
		"a parent's limit caps what its children divide": {
			// level 1: org requestable min(10, 4)=4. offers 5 and 5: org wants 4,
			// takes 4; other takes 5; round 2: other offered 1, takes 1.
			// level 2 (org's 4): x and y offered 2 each.
			capacity: 10,
			queues: created(
				gpuQueue("org", "", 100, 0, 4, 1),
				gpuQueue("x", "org", 100, 0, none, 1),
				gpuQueue("y", "org", 100, 0, none, 1),
				gpuQueue("other", "", 100, 0, none, 1),
			),
			demand: map[string]float64{"x": 5, "y": 5, "other": 10},
			want:   map[string]float64{"org": 4, "x": 2, "y": 2, "other": 6},
		},
		"children listed before their parent": {
			// Same tree as above in another order; the result keeps the input order.
			capacity: 10,
			queues: created(
				gpuQueue("y", "org", 100, 0, none, 1),
				gpuQueue("other", "", 100, 0, none, 1),
				gpuQueue("x", "org", 100, 0, none, 1),
				gpuQueue("org", "", 100, 0, 4, 1),
			),
			demand: map[string]float64{"x": 5, "y": 5, "other": 10},
			want:   map[string]float64{"org": 4, "x": 2, "y": 2, "other": 6},
		},
		"priority tiers are per level": {
			// Level 1: prio-parent (200) wants 10 over quota and takes all 10;
			// level 2: its children split the parent's 10, low (50) gets its
			// quota 2, high (300) the other 8.
			capacity: 10,
			queues: created(
				gpuQueue("prio-parent", "", 200, 0, none, 1),
				gpuQueue("high", "prio-parent", 300, 0, none, 1),
				gpuQueue("low", "prio-parent", 50, 2, none, 1),
				gpuQueue("plain", "", 100, 0, none, 1),
			),
			demand: map[string]float64{"high": 10, "low": 10, "plain": 10},
			want:   map[string]float64{"prio-parent": 10, "high": 8, "low": 2, "plain": 0},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := Divide(map[Resource]float64{GPU: tc.capacity}, tc.queues, gpuDemand(tc.demand))
			if err != nil {
				t.Fatalf("Divide: %v", err)
			}
			if diff := cmp.Diff(tc.want, fairShares(got, GPU)); diff != "" {
				t.Errorf("fair shares (-want,+got):\n%s", diff)
			}
			var gotOrder, wantOrder []string
			for i, q := range got.Queues {
				gotOrder = append(gotOrder, q.Name)
				wantOrder = append(wantOrder, tc.queues[i].Name)
			}
			if diff := cmp.Diff(wantOrder, gotOrder); diff != "" {
				t.Errorf("queue order (-want,+got):\n%s", diff)
			}
		})
	}
}

// TestDivideResources checks that resources are divided independently, in
// KAI's units, and the Request, Allocatable and Depth of each queue.
func TestDivideResources(t *testing.T) {
	capacity := map[Resource]float64{GPU: 8, CPU: 1, Memory: 1e9}
	queues := created(
		Queue{Name: "org", Priority: 100, Resources: map[Resource]Settings{
			GPU: {Quota: 0, Limit: 6, OverQuotaWeight: 1},
		}},
		Queue{Name: "t1", Parent: "org", Priority: 100},
		Queue{Name: "t2", Parent: "org", Priority: 100, Resources: map[Resource]Settings{
			GPU: {Quota: 0, Limit: 2, OverQuotaWeight: 1},
		}},
		Queue{Name: "other", Priority: 100, Resources: map[Resource]Settings{
			CPU: {Quota: 0, Limit: Unlimited, OverQuotaWeight: 2},
		}},
	)
	demand := map[string]map[Resource]float64{
		"t1":    {GPU: 5, CPU: 1, Memory: 1e9},
		"t2":    {GPU: 5},
		"other": {GPU: 1, CPU: 1, Memory: 1e9},
	}
	// gpu, level 1: org requestable min(10, 6)=6, other 1. Offers 4 and 4: org
	// takes 4 (wants 6), other takes 1 (wants 1) so round 2 offers org 3:
	// takes 2. org 6, other 1. Level 2 (6): t2 requestable 2; offers 3 and 3:
	// t2 takes 2, t1 takes 3; round 2: t1 offered 1, takes 1: t1 4.
	// cpu (whole unit 0.001): org and other want 1 core each, weights 1:2.
	// Offers 1/3 and 2/3 core: 333.33m and 666.67m, so 0.333 and 0.666
	// (1/3000 and 2/3000 core remembered); left 0.001 goes to other
	// (larger fraction): org 0.333, other 0.667. Level 2: t1 takes all 0.333.
	// memory (whole unit a byte): 1e9 split 1:1, 5e8 each; t1 takes org's 5e8.
	// Allocatable: org min(6, 8)=6, t1 6, t2 min(2, 6)=2, other 8; cpu and
	// memory have no limits: the capacity.
	want := []QueueShare{
		{
			Queue: queues[0], Depth: 0,
			Request:     map[Resource]float64{GPU: 10, CPU: 1, Memory: 1e9},
			FairShare:   map[Resource]float64{GPU: 6, CPU: 0.333, Memory: 5e8},
			Allocatable: map[Resource]float64{GPU: 6, CPU: 1, Memory: 1e9},
		},
		{
			Queue: queues[1], Depth: 1,
			Request:     map[Resource]float64{GPU: 5, CPU: 1, Memory: 1e9},
			FairShare:   map[Resource]float64{GPU: 4, CPU: 0.333, Memory: 5e8},
			Allocatable: map[Resource]float64{GPU: 6, CPU: 1, Memory: 1e9},
		},
		{
			Queue: queues[2], Depth: 1,
			Request:     map[Resource]float64{GPU: 5, CPU: 0, Memory: 0},
			FairShare:   map[Resource]float64{GPU: 2, CPU: 0, Memory: 0},
			Allocatable: map[Resource]float64{GPU: 2, CPU: 1, Memory: 1e9},
		},
		{
			Queue: queues[3], Depth: 0,
			Request:     map[Resource]float64{GPU: 1, CPU: 1, Memory: 1e9},
			FairShare:   map[Resource]float64{GPU: 1, CPU: 0.667, Memory: 5e8},
			Allocatable: map[Resource]float64{GPU: 8, CPU: 1, Memory: 1e9},
		},
	}
	got, err := Divide(capacity, queues, demand)
	if err != nil {
		t.Fatalf("Divide: %v", err)
	}
	if diff := cmp.Diff(want, got.Queues); diff != "" {
		t.Errorf("queues (-want,+got):\n%s", diff)
	}
	if diff := cmp.Diff([]Resource{GPU, CPU, Memory}, got.Resources()); diff != "" {
		t.Errorf("Resources() (-want,+got):\n%s", diff)
	}
}

func TestDivideErrors(t *testing.T) {
	gpu := func(quota, limit, weight float64) map[Resource]Settings {
		return map[Resource]Settings{GPU: {Quota: quota, Limit: limit, OverQuotaWeight: weight}}
	}
	cases := map[string]struct {
		capacity map[Resource]float64
		queues   []Queue
		demand   map[string]map[Resource]float64
		want     string
	}{
		"unknown parent": {
			queues: []Queue{{Name: "a", Parent: "nope"}},
			want:   `divide fair share: queue "a": has unknown parent "nope"`,
		},
		"cycle": {
			queues: []Queue{{Name: "top"}, {Name: "c", Parent: "b"}, {Name: "a", Parent: "b"}, {Name: "b", Parent: "a"}},
			want:   `divide fair share: queue "c": is in a parent cycle: b -> a -> b`,
		},
		"own parent": {
			queues: []Queue{{Name: "a", Parent: "a"}},
			want:   `divide fair share: queue "a": is in a parent cycle: a -> a`,
		},
		"duplicate name": {
			queues: []Queue{{Name: "a"}, {Name: "b"}, {Name: "a"}},
			want:   `divide fair share: queue "a": is defined twice; queue names must be unique`,
		},
		"no name": {
			queues: []Queue{{Name: "a"}, {}},
			want:   `divide fair share: queue #2: has no name`,
		},
		"negative capacity": {
			capacity: map[Resource]float64{GPU: -1},
			want:     `divide fair share: capacity gpu: must be at least 0, got -1`,
		},
		"NaN capacity": {
			capacity: map[Resource]float64{GPU: math.NaN()},
			want:     `divide fair share: capacity gpu: must be a number, got NaN`,
		},
		"quota below -1": {
			queues: []Queue{{Name: "a", Resources: gpu(-2, Unlimited, 1)}},
			want:   `divide fair share: queue "a" gpu quota: must be -1 or at least 0, got -2`,
		},
		"negative limit other than -1": {
			queues: []Queue{{Name: "a", Resources: gpu(0, -0.5, 1)}},
			want:   `divide fair share: queue "a" gpu limit: must be -1 or at least 0, got -0.5`,
		},
		"negative weight": {
			queues: []Queue{{Name: "a", Resources: gpu(0, Unlimited, -1)}},
			want:   `divide fair share: queue "a" gpu overQuotaWeight: must be at least 0, got -1`,
		},
		"negative demand": {
			queues: []Queue{{Name: "a"}},
			demand: map[string]map[Resource]float64{"a": {GPU: -3}},
			want:   `divide fair share: demand "a" gpu: must be at least 0, got -3`,
		},
		"demand for a queue with children": {
			queues: []Queue{{Name: "org"}, {Name: "a", Parent: "org"}},
			demand: map[string]map[Resource]float64{"org": {GPU: 1}},
			want:   `divide fair share: demand "org": names a queue with children; only leaf queues have workloads, so give the demand to its leaves`,
		},
		"demand for an unknown queue": {
			queues: []Queue{{Name: "a"}},
			demand: map[string]map[Resource]float64{"b": {GPU: 1}},
			want:   `divide fair share: demand "b": names no queue`,
		},
		"queue setting for a resource without capacity": {
			queues: []Queue{{Name: "a", Resources: map[Resource]Settings{CPU: DefaultSettings()}}},
			want:   `divide fair share: queue "a" cpu: is not in the capacity; add it there (0 if the cluster has none)`,
		},
		"demand for a resource without capacity": {
			queues: []Queue{{Name: "a"}},
			demand: map[string]map[Resource]float64{"a": {Memory: 1}},
			want:   `divide fair share: demand "a" memory: is not in the capacity; add it there (0 if the cluster has none)`,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			capacity := tc.capacity
			if capacity == nil {
				capacity = map[Resource]float64{GPU: 4}
			}
			_, err := Divide(capacity, tc.queues, tc.demand)
			if err == nil {
				t.Fatalf("Divide returned no error, want %q", tc.want)
			}
			if diff := cmp.Diff(tc.want, err.Error()); diff != "" {
				t.Errorf("error (-want,+got):\n%s", diff)
			}
			if !IsInvalid(err) {
				t.Errorf("IsInvalid(%v) = false, want true", err)
			}
		})
	}
}
