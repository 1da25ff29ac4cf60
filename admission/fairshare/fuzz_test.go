package fairshare

import (
	"math"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// decodeFuzzInput turns bytes into a valid queue tree with gpu and cpu.
//
// Byte 0 is the gpu capacity in halves (0 to 127.5); cpu gets a tenth of it,
// so that cpu amounts are not whole millicores as often as not. Then each group
// of 6 bytes is one queue, at most 12 queues:
//
//	b[0]  parent: p = b[0] % (i+1); p == i means top level, else queue p
//	b[1]  priority 50, 100 or 150
//	b[2]  quota: b[2] % 10 in halves, 9 means -1
//	b[3]  limit: b[3] % 16 in halves below 10, -1 from 10
//	b[4]  overQuotaWeight 0 to 3
//	b[5]  gpu demand in quarters (0 to 15.75), if the queue ends up a leaf
//
// cpu uses the same settings and demand divided by 10.
func decodeFuzzInput(data []byte) (map[Resource]float64, []Queue, map[string]map[Resource]float64) {
	if len(data) == 0 {
		return map[Resource]float64{GPU: 0, CPU: 0}, nil, nil
	}
	gpuCap := float64(data[0]) / 2
	capacity := map[Resource]float64{GPU: gpuCap, CPU: gpuCap / 10}
	data = data[1:]
	var queues []Queue
	demandOf := map[string]float64{}
	hasChildren := map[string]bool{}
	for i := 0; len(data) >= 6 && i < 12; i, data = i+1, data[6:] {
		b := data[:6]
		name := string(rune('a' + i))
		parent := ""
		if p := int(b[0]) % (i + 1); p != i {
			parent = queues[p].Name
			hasChildren[parent] = true
		}
		quota := float64(b[2]%10) / 2
		if b[2]%10 == 9 {
			quota = Unlimited
		}
		limit := float64(Unlimited)
		if b[3]%16 < 10 {
			limit = float64(b[3]%16) / 2
		}
		s := Settings{Quota: quota, Limit: limit, OverQuotaWeight: float64(b[4] % 4)}
		cpu := s
		if cpu.Quota != Unlimited {
			cpu.Quota /= 10
		}
		if cpu.Limit != Unlimited {
			cpu.Limit /= 10
		}
		queues = append(queues, Queue{
			Name:          name,
			Parent:        parent,
			Priority:      50 * (1 + int32(b[1]%3)),
			CreationOrder: i,
			Resources:     map[Resource]Settings{GPU: s, CPU: cpu},
			// Usage (counted only with a usage weight) from the spare bits
			// of the priority byte: 0 to 1.25 in quarters.
			Usage: map[Resource]float64{GPU: float64(b[1]/3%6) / 4, CPU: float64(b[1]/18%6) / 4},
		})
		demandOf[name] = float64(b[5]%64) / 4
	}
	demand := map[string]map[Resource]float64{}
	for _, q := range queues {
		if !hasChildren[q.Name] {
			demand[q.Name] = map[Resource]float64{GPU: demandOf[q.Name], CPU: demandOf[q.Name] / 10}
		}
	}
	return capacity, queues, demand
}

// FuzzDivide checks, for any tree, with and without usage weighed, that
// Divide does not fail or panic, that every fair share is a number between
// the queue's quota part and its requestable, and that a level hands out no
// more than its capacity (or its quotas, when those alone exceed it: step 1
// gives them regardless).
func FuzzDivide(f *testing.F) {
	f.Add([]byte{20, 0, 0, 2, 15, 1, 32, 1, 1, 4, 15, 2, 24, 2, 0, 0, 15, 1, 24})
	f.Add([]byte{21, 0, 1, 9, 15, 1, 63, 0, 1, 0, 15, 1, 63, 1, 2, 1, 3, 2, 7, 3, 0, 4, 15, 0, 20})
	f.Add([]byte{255, 0, 2, 8, 15, 3, 63, 0, 1, 0, 4, 1, 63, 2, 0, 2, 15, 2, 1, 1, 1, 1, 1, 1, 1})
	f.Add([]byte{3, 0, 0, 0, 15, 1, 3, 0, 0, 0, 15, 1, 3, 0, 0, 0, 15, 1, 3})
	f.Fuzz(func(t *testing.T, data []byte) {
		capacity, queues, demand := decodeFuzzInput(data)
		for _, k := range []float64{0, 0.5, 1} {
			checkDivision(t, capacity, queues, demand, Options{UsageWeight: k})
		}
	})
}

func checkDivision(t *testing.T, capacity map[Resource]float64, queues []Queue, demand map[string]map[Resource]float64, opts Options) {
	got, err := DivideWith(capacity, queues, demand, opts)
	if err != nil {
		t.Fatalf("Divide: %v", err)
	}
	again, err := DivideWith(capacity, queues, demand, opts)
	if err != nil {
		t.Fatalf("Divide again: %v", err)
	}
	if diff := cmp.Diff(got, again); diff != "" {
		t.Fatalf("Divide is not deterministic (-first,+second):\n%s", diff)
	}
	byName := map[string]QueueShare{}
	children := map[string][]string{}
	for _, q := range got.Queues {
		byName[q.Name] = q
		children[q.Parent] = append(children[q.Parent], q.Name)
	}
	var request func(name string, r Resource) float64
	request = func(name string, r Resource) float64 {
		if len(children[name]) == 0 {
			return demand[name][r]
		}
		sum := 0.0
		for _, c := range children[name] {
			sum += request(c, r)
		}
		return sum
	}
	for r, c := range capacity {
		for parent, level := range children {
			levelCap := c
			if parent != "" {
				levelCap = byName[parent].FairShare[r]
			}
			var sumShares, sumQuotaParts float64
			for _, name := range level {
				q := byName[name]
				s := q.settings(r)
				share := q.FairShare[r]
				requestable := request(name, r)
				if s.Limit != Unlimited {
					requestable = math.Min(requestable, s.Limit)
				}
				quota := s.Quota
				if quota == Unlimited {
					quota = levelCap
				}
				quotaPart := math.Min(quota, requestable)
				if math.IsNaN(share) || math.IsInf(share, 0) || share < 0 {
					t.Errorf("%s %s fair share %v, want a number ≥ 0", name, r, share)
				}
				if share > requestable+tolerance(requestable) {
					t.Errorf("%s %s fair share %v > requestable %v", name, r, share, requestable)
				}
				if share < quotaPart-tolerance(quotaPart) {
					t.Errorf("%s %s fair share %v < min(quota, requestable) %v", name, r, share, quotaPart)
				}
				sumShares += share
				sumQuotaParts += quotaPart
			}
			if bound := math.Max(levelCap, sumQuotaParts); sumShares > bound+tolerance(bound) {
				t.Errorf("level under %q, %s: fair shares add up to %v > max(capacity %v, quotas %v)",
					parent, r, sumShares, levelCap, sumQuotaParts)
			}
		}
	}
}

// tolerance absorbs the rounding of exact results to float64 and of the
// float64 sums above.
func tolerance(v float64) float64 { return 1e-9 * (1 + math.Abs(v)) }
