package cycle

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// A room withholds devices, but a head of line can also wait for quota: in
// a queue limited to 2 GPUs that runs two 1-GPU pods, a 2-GPU head fits the
// limit only once both have ended, and each GPU that frees goes to the next
// 1-GPU pod of the queue, which does fit. So a head past StarvationBound
// also holds its queue's headroom: the quota policy is asked about every
// other workload that its queue or an ancestor would charge as if the head
// already held what it asks for there. What running pods free then adds up
// until the head fits, and whatever only fits in the head's share waits.
// The policy is asked twice for a workload that the held headroom turns
// away, so that its wait can say whether it is held back or over a limit
// anyway.
//
// As for rooms, a queue below its fair share is not held back for the head
// of a queue at or above its own (entitled), and a head is held back only
// by the headroom of heads that waited longer (else two heads under one
// limited parent would hold each other back for ever). A head that the
// policy turns away even with nothing running in its queue and its
// ancestors never fits, and holds nothing.

// headroom is quota held in a cycle for a head of line.
type headroom struct {
	head *Workload
	// chain is the head's queue, then its ancestors up to the root: where
	// admitting the head would charge.
	chain []*queueState
	// milli, cpu and memory are what the head asks for; need says it in
	// words.
	milli, cpu, memory int64
	need               string
	// rank is the head's place among the heads by how long they waited.
	rank int
	// consumed: the head was admitted, and holds what it asked for.
	consumed bool
}

// holdHeadroom holds the headroom for head w of queue q, the rank-th head
// by age, asking for members and milli milli-GPUs, unless w never fits
// the quota. allowed is whether the policy lets it in now.
func (c *cycle) holdHeadroom(q *queueState, w *Workload, members []*Member, milli int64, rank int, allowed bool) {
	if c.quota == nil {
		return
	}
	if !allowed && !c.everFits(q, w, members, milli) {
		return
	}
	h := &headroom{head: w, milli: milli, need: describeMembers(members), rank: rank}
	for a := q; a != nil; a = a.parent {
		h.chain = append(h.chain, a)
	}
	for _, m := range members {
		h.cpu += m.CPUMilli
		h.memory += m.Memory
	}
	c.headrooms = append(c.headrooms, h)
	if c.headroomOf == nil {
		c.headroomOf = map[*Workload]*headroom{}
	}
	c.headroomOf[w] = h
}

// everFits reports whether the quota policy would let q take members of w
// with nothing held by q and its ancestors.
func (c *cycle) everFits(q *queueState, w *Workload, members []*Member, milli int64) bool {
	req := c.quotaRequest(q, w, members, milli)
	empty := func(u *QueueUsage) {
		u.AllocatedMilli, u.CPU.Allocated, u.Memory.Allocated = 0, 0, 0
	}
	empty(&req.Queue)
	for i := range req.Ancestors {
		empty(&req.Ancestors[i])
	}
	v, err := c.quota.CheckQuota(c.ctx, req)
	return err == nil && v.Allowed
}

// headroomAgainst is the headroom held against w of queue q: that of the
// heads not yet admitted that charge a queue q's workloads charge too,
// other than w, older than w if w is a head, and not of a queue that q
// goes before.
func (c *cycle) headroomAgainst(q *queueState, w *Workload) []*headroom {
	if len(c.headrooms) == 0 {
		return nil
	}
	own := c.headroomOf[w]
	var out []*headroom
	for _, h := range c.headrooms {
		if h.consumed || h.head == w || (own != nil && h.rank > own.rank) || entitled(q, h.chain[0]) {
			continue
		}
		for a := q; a != nil; a = a.parent {
			if slices.Contains(h.chain, a) {
				out = append(out, h)
				break
			}
		}
	}
	return out
}

// holding adds to req, a question about a workload of q, the headroom of
// holds as held by the queues it charges.
func holding(req *QuotaRequest, q *queueState, holds []*headroom) *QuotaRequest {
	held := *req
	held.Ancestors = slices.Clone(req.Ancestors)
	u := &held.Queue
	for a, i := q, 0; a != nil && i <= len(held.Ancestors); a, i = a.parent, i+1 {
		if i > 0 {
			u = &held.Ancestors[i-1]
		}
		for _, h := range holds {
			if slices.Contains(h.chain, a) {
				u.AllocatedMilli += h.milli
				u.CPU.Allocated += h.cpu
				u.Memory.Allocated += h.memory
			}
		}
	}
	return &held
}

// quotaWithHeadroom is quotaVerdict with the headroom held against w: a
// workload that only the headroom turns away is told it is held back (and
// heldBack is set), and a head turned away is told that its headroom is
// held.
func (c *cycle) quotaWithHeadroom(q *queueState, w *Workload, members []*Member, milli int64) (v *QuotaVerdict, heldBack bool, err error) {
	req := c.quotaRequest(q, w, members, milli)
	if holds := c.headroomAgainst(q, w); len(holds) > 0 {
		v, err := c.quota.CheckQuota(c.ctx, holding(req, q, holds))
		if err != nil || v.Allowed {
			return v, false, err
		}
		free, err := c.quota.CheckQuota(c.ctx, req)
		if err != nil {
			return nil, false, err
		}
		if free.Allowed {
			return &QuotaVerdict{Reasons: []string{c.heldBackMessage(q, req, holds)}}, true, nil
		}
		return c.headNote(w, free), false, nil
	}
	v, err = c.quota.CheckQuota(c.ctx, req)
	if err != nil {
		return nil, false, err
	}
	return c.headNote(w, v), false, nil
}

// heldBackMessage says whose headroom holds back the workload of req,
// naming the first queue up from q whose limit the headroom fills (its
// "quota headroom" where the policy turns it away for something else).
func (c *cycle) heldBackMessage(q *queueState, req *QuotaRequest, holds []*headroom) string {
	var at *queueState
	kind := "quota"
	for a := q; a != nil; a = a.parent {
		var milli, cpu, memory int64
		shared := false
		for _, h := range holds {
			if slices.Contains(h.chain, a) {
				shared = true
				milli, cpu, memory = milli+h.milli, cpu+h.cpu, memory+h.memory
			}
		}
		if !shared {
			continue
		}
		if at == nil {
			at = a
		}
		if fills(a.LimitMilli, a.allocated, milli, req.GPUMilli) || fills(a.CPU.Limit, a.cpu.alloc, cpu, req.CPUMilli) ||
			fills(a.Memory.Limit, a.memory.alloc, memory, req.Memory) {
			at, kind = a, "limit"
			break
		}
	}
	var heads []string
	for _, h := range holds {
		if slices.Contains(h.chain, at) {
			heads = append(heads, fmt.Sprintf("%s, which needs %s and has waited since %s, past the starvation bound of %s",
				h.head.Name(), h.need, h.head.Created.UTC().Format(time.DateTime), c.opts.StarvationBound))
		}
	}
	return fmt.Sprintf("held back: queue %s's %s headroom is held for %s", at.Name, kind, strings.Join(heads, "; and for "))
}

// fills reports whether held, added to alloc, leaves no room for want
// under limit where without it there is.
func fills(limit, alloc, held, want int64) bool {
	return limit >= 0 && held > 0 && alloc+want <= limit && alloc+held+want > limit
}

// headNote adds to v, when it turns away a head that holds headroom, that
// the headroom is held for it.
func (c *cycle) headNote(w *Workload, v *QuotaVerdict) *QuotaVerdict {
	h := c.headroomOf[w]
	if v.Allowed || h == nil || h.consumed {
		return v
	}
	at, kind := h.chain[0], "quota"
	for _, a := range h.chain {
		if over(a.LimitMilli, a.allocated+h.milli) || over(a.CPU.Limit, a.cpu.alloc+h.cpu) || over(a.Memory.Limit, a.memory.alloc+h.memory) {
			at, kind = a, "limit"
			break
		}
	}
	note := fmt.Sprintf("it has waited since %s, past the starvation bound of %s: queue %s's %s headroom is held for it as running pods end, and workloads that would take it wait meanwhile",
		w.Created.UTC().Format(time.DateTime), c.opts.StarvationBound, at.Name, kind)
	return &QuotaVerdict{Reasons: append(slices.Clip(v.Reasons), note)}
}

// over reports whether v is over limit (-1: none).
func over(limit, v int64) bool {
	return limit >= 0 && v > limit
}
