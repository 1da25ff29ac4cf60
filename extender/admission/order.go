package admission

import (
	"cmp"
	"container/heap"
	"fmt"
	"hash/fnv"
	"math"
	"slices"
	"strings"

	"github.com/partita-dev/partita/extender/fairshare"
)

// divide computes every queue's GPU fair share (DESIGN §6) for what the
// queues hold and wait for. A division the fairshare package refuses (it
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
			q.fairShare = memo.shares[name]
		}
		return
	}
	defer func() {
		if memo != nil {
			memo.key = key
			memo.shares = make(map[string]int64, len(c.queues))
			for name, q := range c.queues {
				memo.shares[name] = q.fairShare
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
			Resources: map[fairshare.Resource]fairshare.Settings{fairshare.GPU: {
				Quota: gpus(q.QuotaMilli), Limit: gpus(q.LimitMilli), OverQuotaWeight: float64(q.Weight),
			}},
		}
		if len(q.Children) == 0 && q.allocated+q.pending > 0 {
			demand[q.Name] = map[fairshare.Resource]float64{fairshare.GPU: float64(q.allocated+q.pending) / 1000}
		}
	}
	// Children that name a parent outside the tree were made top-level by
	// newCycle; a parent whose children all vanished is a leaf.
	for _, q := range ordered {
		if len(q.Children) > 0 {
			delete(demand, q.Name)
		}
	}
	d, err := fairshare.Divide(map[fairshare.Resource]float64{fairshare.GPU: float64(c.clusterMilli) / 1000}, in, demand)
	if err != nil {
		return
	}
	for i, s := range d.Queues {
		ordered[i].fairShare = int64(math.Round(s.FairShare[fairshare.GPU] * 1000))
	}
}

// gpus converts milli-GPUs to GPUs, keeping -1 (unlimited).
func gpus(milli int64) float64 {
	if milli < 0 {
		return fairshare.Unlimited
	}
	return float64(milli) / 1000
}

// queueLess is the admission order of queues (DESIGN §6): below fair share
// first, then higher priority, then the smallest share of its fair share,
// then the older queue.
func queueLess(a, b *queueState) bool {
	if ab, bb := a.allocated < a.fairShare, b.allocated < b.fairShare; ab != bb {
		return ab
	}
	if a.Priority != b.Priority {
		return a.Priority > b.Priority
	}
	if sa, sb := share(a), share(b); sa != sb {
		return sa < sb
	}
	if !a.Created.Equal(b.Created) {
		return a.Created.Before(b.Created)
	}
	return a.Name < b.Name
}

// share is allocated / fair share; a queue with no fair share that holds
// something comes last.
func share(q *queueState) float64 {
	if q.fairShare <= 0 {
		if q.allocated > 0 {
			return math.Inf(1)
		}
		return 0
	}
	return float64(q.allocated) / float64(q.fairShare)
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
	key    uint64
	shares map[string]int64
}

// divisionKey fingerprints what the division depends on: capacity, and per
// queue its place in the tree, settings, creation and demand. Queue hashes
// are summed, so map order does not matter.
func (c *cycle) divisionKey() uint64 {
	sum := uint64(c.clusterMilli) * 0x9e3779b97f4a7c15
	for _, q := range c.queues {
		h := fnv.New64a()
		parent := ""
		if q.parent != nil {
			parent = q.parent.Name
		}
		fmt.Fprintf(h, "%s\x00%s\x00%d\x00%d\x00%d\x00%d\x00%d\x00%d\x00%d", q.Name, parent, q.Priority, q.QuotaMilli, q.LimitMilli, q.Weight,
			q.Created.UnixNano(), q.allocated+q.pending, len(q.Children))
		sum += h.Sum64()
	}
	return sum
}
