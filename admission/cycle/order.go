package cycle

import (
	"cmp"
	"container/heap"
	"fmt"
	"hash/fnv"
	"math"
	"slices"
	"strings"

	"github.com/partita-dev/partita/admission/fairshare"
)

// divide computes every queue's fair share of GPUs, CPU and memory (DESIGN
// §6), each resource on its own, for what the queues hold and wait for. A division the fairshare package refuses (it
// cannot be, as the cycle repairs parents first) leaves every share 0, so
// that ordering falls back to priority and age.
func (c *cycle) divide() {
	if len(c.queues) == 0 {
		return
	}
	memo := c.opts.FairShares
	key := c.divisionKey()
	if memo != nil && memo.key == key && memo.shares != nil {
		for name, q := range c.queues {
			s := memo.shares[name]
			q.fairShare, q.cpu.fairShare, q.memory.fairShare = s[0], s[1], s[2]
			q.baseShare = memo.base[name]
		}
		return
	}
	defer func() {
		if memo != nil {
			memo.key = key
			memo.shares = make(map[string][3]int64, len(c.queues))
			memo.base = make(map[string][3]int64, len(c.queues))
			for name, q := range c.queues {
				memo.shares[name] = [3]int64{q.fairShare, q.cpu.fairShare, q.memory.fairShare}
				memo.base[name] = q.baseShare
			}
		}
	}()
	ordered := make([]*queueState, 0, len(c.queues))
	for _, q := range c.queues {
		ordered = append(ordered, q)
	}
	slices.SortFunc(ordered, func(a, b *queueState) int {
		return cmp.Or(a.Created.Compare(b.Created), strings.Compare(a.Name, b.Name))
	})
	in := make([]fairshare.Queue, len(ordered))
	demand := map[string]map[fairshare.Resource]float64{}
	for i, q := range ordered {
		parent := ""
		if q.parent != nil {
			parent = q.parent.Name
		}
		in[i] = fairshare.Queue{
			Name: q.Name, Parent: parent, Priority: q.Priority, CreationOrder: i,
			Resources: map[fairshare.Resource]fairshare.Settings{
				fairshare.GPU:    {Quota: gpus(q.QuotaMilli), Limit: gpus(q.LimitMilli), OverQuotaWeight: float64(q.Weight)},
				fairshare.CPU:    {Quota: gpus(q.CPU.Quota), Limit: gpus(q.CPU.Limit), OverQuotaWeight: float64(q.CPU.Weight)},
				fairshare.Memory: {Quota: bytes(q.Memory.Quota), Limit: bytes(q.Memory.Limit), OverQuotaWeight: float64(q.Memory.Weight)},
			},
		}
		if c.opts.Usage != nil {
			u := c.opts.Usage.Share[q.Name]
			in[i].Usage = map[fairshare.Resource]float64{fairshare.GPU: u[0], fairshare.CPU: u[1], fairshare.Memory: u[2]}
		}
		if len(q.Children) == 0 {
			d := map[fairshare.Resource]float64{}
			if v := q.allocated + q.pending; v > 0 {
				d[fairshare.GPU] = float64(v) / 1000
			}
			if v := q.cpu.alloc + q.cpu.pending; v > 0 {
				d[fairshare.CPU] = float64(v) / 1000
			}
			if v := q.memory.alloc + q.memory.pending; v > 0 {
				d[fairshare.Memory] = float64(v)
			}
			if len(d) > 0 {
				demand[q.Name] = d
			}
		}
	}
	// Children that name a parent outside the tree were made top-level by
	// newCycle; a parent whose children all vanished is a leaf.
	for _, q := range ordered {
		if len(q.Children) > 0 {
			delete(demand, q.Name)
		}
	}
	capacity := map[fairshare.Resource]float64{
		fairshare.GPU:    float64(c.clusterMilli) / 1000,
		fairshare.CPU:    float64(c.clusterCPU) / 1000,
		fairshare.Memory: float64(c.clusterMemory),
	}
	var opts fairshare.Options
	if c.opts.Usage != nil {
		opts.UsageWeight = c.opts.Usage.Weight
		// Without usage too, so that messages can say when history decided.
		base, err := fairshare.Divide(capacity, in, demand)
		if err != nil {
			return
		}
		for i, s := range base.Queues {
			ordered[i].baseShare = [3]int64{milli(s.FairShare[fairshare.GPU]), milli(s.FairShare[fairshare.CPU]), int64(math.Round(s.FairShare[fairshare.Memory]))}
		}
	}
	d, err := fairshare.DivideWith(capacity, in, demand, opts)
	if err != nil {
		return
	}
	for i, s := range d.Queues {
		q := ordered[i]
		q.fairShare = milli(s.FairShare[fairshare.GPU])
		q.cpu.fairShare = milli(s.FairShare[fairshare.CPU])
		q.memory.fairShare = int64(math.Round(s.FairShare[fairshare.Memory]))
	}
}

func milli(v float64) int64 { return int64(math.Round(v * 1000)) }

// gpus converts milli-units (GPUs, CPUs) to whole units, keeping -1
// (unlimited).
func gpus(milli int64) float64 {
	if milli < 0 {
		return fairshare.Unlimited
	}
	return float64(milli) / 1000
}

// bytes converts bytes to fairshare's memory amounts, keeping -1.
func bytes(b int64) float64 {
	if b < 0 {
		return fairshare.Unlimited
	}
	return float64(b)
}

// queueLess is the admission order of queues (DESIGN §6): below fair share
// first, then higher priority, then the smallest dominant share, then the
// older queue.
func queueLess(a, b *queueState) bool {
	sa, fa := share(a)
	sb, fb := share(b)
	if ab, bb := fa && sa < 1, fb && sb < 1; ab != bb {
		return ab
	}
	if a.Priority != b.Priority {
		return a.Priority > b.Priority
	}
	if sa != sb {
		return sa < sb
	}
	if !a.Created.Equal(b.Created) {
		return a.Created.Before(b.Created)
	}
	return a.Name < b.Name
}

// share is q's dominant share, max over GPUs, CPU and memory of allocated /
// fair share: a resource it holds without a fair share counts as infinite,
// one it neither holds nor deserves not at all. It reports whether any
// resource has a fair share; only then can q be below its fair share.
func share(q *queueState) (float64, bool) {
	var out float64
	some := false
	for _, r := range [3]amounts{{alloc: q.allocated, fairShare: q.fairShare}, q.cpu, q.memory} {
		switch {
		case r.fairShare > 0:
			some = true
			out = max(out, float64(r.alloc)/float64(r.fairShare))
		case r.alloc > 0:
			out = math.Inf(1)
		}
	}
	return out, some
}

// queueHeap orders the queues with workloads left to try.
type queueHeap struct{ items []*queueState }

func (h *queueHeap) Len() int           { return len(h.items) }
func (h *queueHeap) Less(i, j int) bool { return queueLess(h.items[i], h.items[j]) }
func (h *queueHeap) Swap(i, j int) {
	h.items[i], h.items[j] = h.items[j], h.items[i]
	h.items[i].index, h.items[j].index = i, j
}
func (h *queueHeap) Push(x any) {
	q := x.(*queueState)
	q.index = len(h.items)
	h.items = append(h.items, q)
}
func (h *queueHeap) Pop() any {
	q := h.items[len(h.items)-1]
	h.items = h.items[:len(h.items)-1]
	q.index = -1
	return q
}

func (h *queueHeap) len() int           { return len(h.items) }
func (h *queueHeap) push(q *queueState) { heap.Push(h, q) }
func (h *queueHeap) pop() *queueState   { return heap.Pop(h).(*queueState) }

// FairShares remembers the last division across cycles: most cycles see
// the same queues, demand and capacity, and dividing 1,000 queues in exact
// arithmetic costs more than the rest of a cycle's bookkeeping.
type FairShares struct {
	key uint64
	// shares are GPU, CPU and memory by queue; base the same without
	// usage.
	shares, base map[string][3]int64
}

// divisionKey fingerprints what the division depends on: capacity, and per
// queue its place in the tree, settings, creation and demand. Queue hashes
// are summed, so map order does not matter.
func (c *cycle) divisionKey() uint64 {
	sum := uint64(c.clusterMilli)*0x9e3779b97f4a7c15 ^ uint64(c.clusterCPU)*0xbf58476d1ce4e5b9 ^ uint64(c.clusterMemory)*0x94d049bb133111eb
	for _, q := range c.queues {
		h := fnv.New64a()
		parent := ""
		if q.parent != nil {
			parent = q.parent.Name
		}
		fmt.Fprintf(h, "%s\x00%s\x00%d\x00%d\x00%d\x00%d\x00%d\x00%d\x00%d\x00%v\x00%v\x00%d\x00%d", q.Name, parent, q.Priority, q.QuotaMilli, q.LimitMilli, q.Weight,
			q.Created.UnixNano(), q.allocated+q.pending, len(q.Children), q.CPU, q.Memory, q.cpu.alloc+q.cpu.pending, q.memory.alloc+q.memory.pending)
		if u := c.opts.Usage; u != nil {
			// To 1/10,000 of the capacity: usage moves every cycle, the
			// division need not.
			s := u.Share[q.Name]
			fmt.Fprintf(h, "\x00%d\x00%d\x00%d", int64(s[0]*1e4), int64(s[1]*1e4), int64(s[2]*1e4))
		}
		sum += h.Sum64()
	}
	if u := c.opts.Usage; u != nil {
		sum ^= uint64(u.Weight*1e6) * 0xd6e8feb86659fd93
	}
	return sum
}
