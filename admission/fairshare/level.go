package fairshare

import (
	"cmp"
	"math/big"
	"slices"
	"strings"
)

// divideLevel sets the share of each sibling in level from capacity, in the
// three steps of design §6. Amounts are exact rationals: KAI works in float64,
// and exact arithmetic gives the numbers its float64 code is meant to give
// without 4.4999… or a whole unit lost to floor(3.9999999999999996).
//
// It never changes the rationals it reads (capacity, requestable), as they may
// be shared with other nodes.
func divideLevel(unit, usageWeight, capacity *big.Rat, level []*node) {
	// 1. Quota, regardless of priority and even beyond the capacity.
	left := new(big.Rat).Set(capacity)
	for _, n := range level {
		quota := capacity
		if n.quota != nil {
			quota = n.quota
		}
		n.share = new(big.Rat).Set(minRat(quota, n.requestable))
		left.Sub(left, n.share)
	}
	if left.Sign() <= 0 {
		return
	}

	// 2. Over quota, tier by tier. Each tier's fractions wait for step 3, so
	// the whole units they add up to reach the lower tiers first (as in KAI).
	tiers := tiersOf(level)
	fractions := make([]map[*node]*big.Rat, len(tiers))
	for i, tier := range tiers {
		fractions[i] = map[*node]*big.Rat{}
		overQuota(unit, usageWeight, left, tier, fractions[i])
	}

	// 3. Fractions, tier by tier, largest first.
	for i := range tiers {
		if left.Sign() <= 0 {
			return
		}
		handOutFractions(unit, left, fractions[i])
	}
}

// overQuota runs the rounds of step 2 for one tier, taking from left. It
// records in fractions the part of its offer that a queue could not take
// because only whole units are handed out. With a usageWeight each queue's
// weight is first adjusted by its usage (shareWeights).
func overQuota(unit, usageWeight, left *big.Rat, tier []*node, fractions map[*node]*big.Rat) {
	for left.Sign() > 0 {
		weights, sumWeights := shareWeights(usageWeight, tier)
		if sumWeights.Sign() == 0 {
			return
		}
		pool := new(big.Rat).Set(left)
		anotherRound := false
		for _, n := range tier {
			want := wants(n)
			if want.Sign() <= 0 || n.weight.Sign() == 0 {
				continue
			}
			offer := new(big.Rat).Mul(pool, weights[n])
			offer.Quo(offer, sumWeights)
			var take *big.Rat
			if want.Cmp(offer) <= 0 {
				take = want
				delete(fractions, n)
				// Only a queue that wanted strictly less than its offer frees
				// capacity that others can use in another round; what queues
				// held to whole units leave are fractions, for step 3.
				anotherRound = anotherRound || want.Cmp(offer) < 0
			} else {
				take = floorTo(offer, unit)
				// KAI keeps the fraction of the latest round that had one, not
				// the sum over rounds: a round with an exact whole offer leaves
				// the earlier fraction in place.
				if frac := new(big.Rat).Sub(offer, take); frac.Sign() > 0 {
					fractions[n] = frac
				}
			}
			n.share.Add(n.share, take)
			left.Sub(left, take)
		}
		if !anotherRound {
			return
		}
	}
}

// shareWeights returns the weight of each queue of tier that still wants
// more, and their sum. Weight-0 queues count as wanting but add nothing, so
// they are offered nothing.
//
// Without usage a queue's weight is its over-quota weight. With usage it is
// KAI's share weight (calcShareWeights in KAI-Scheduler's
// pkg/scheduler/plugins/proportion/resource_division): with w the queue's
// over-quota weight over the sum of the wanting queues' weights and u its
// usage as a share of the level's capacity (setLevelUsage), max(0, w +
// usageWeight×(w − u)). A queue that used less
// than its weight's share of the cluster gains, one that used more loses,
// down to nothing.
func shareWeights(usageWeight *big.Rat, tier []*node) (map[*node]*big.Rat, *big.Rat) {
	weights := make(map[*node]*big.Rat, len(tier))
	sum := new(big.Rat)
	for _, n := range tier {
		if wants(n).Sign() > 0 {
			weights[n] = n.weight
			sum.Add(sum, n.weight)
		}
	}
	if usageWeight == nil || sum.Sign() == 0 {
		return weights, sum
	}
	total := sum
	adjustedWeights := make(map[*node]*big.Rat, len(weights))
	sum = new(big.Rat)
	for n, weight := range weights {
		w := new(big.Rat).Quo(weight, total)
		adjusted := new(big.Rat).Sub(w, n.levelUsage)
		adjusted.Mul(adjusted, usageWeight)
		adjusted.Add(adjusted, w)
		if adjusted.Sign() < 0 || weight.Sign() == 0 {
			adjusted.SetInt64(0)
		}
		adjustedWeights[n] = adjusted
		sum.Add(sum, adjusted)
	}
	if sum.Sign() == 0 {
		// Every wanting queue used at least its share and more than usage
		// can account for (the capacity shrank): KAI would leave the rest
		// undivided; plain weights divide it instead.
		return weights, total
	}
	return adjustedWeights, sum
}

// handOutFractions runs step 3 for one tier: one unit each, or what is left,
// to the queues that remembered a fraction, largest fraction first.
//
// KAI gives min(unit, left) without looking at what the queue still wants, so
// a queue that wants 0.3 more can get 1. We also cap at what the queue still
// wants, so a fair share never exceeds requestable and the rest goes to the
// next queue. The two agree whenever every such queue still wants at least
// min(unit, left), which is always the case when capacity, quotas, limits and
// demand are whole units.
func handOutFractions(unit, left *big.Rat, fractions map[*node]*big.Rat) {
	order := make([]*node, 0, len(fractions))
	for n := range fractions {
		order = append(order, n)
	}
	slices.SortFunc(order, func(a, b *node) int {
		return cmp.Or(
			fractions[b].Cmp(fractions[a]),
			cmp.Compare(a.q.CreationOrder, b.q.CreationOrder),
			strings.Compare(a.q.Name, b.q.Name),
		)
	})
	for _, n := range order {
		if left.Sign() <= 0 {
			return
		}
		give := minRat(minRat(unit, left), wants(n))
		n.share.Add(n.share, give)
		left.Sub(left, give)
	}
}

// wants returns what n still wants: requestable − share, at least 0.
func wants(n *node) *big.Rat {
	w := new(big.Rat).Sub(n.requestable, n.share)
	if w.Sign() < 0 {
		return new(big.Rat)
	}
	return w
}

// tiersOf groups level by priority, highest first, keeping input order inside a tier.
func tiersOf(level []*node) [][]*node {
	sorted := slices.Clone(level)
	slices.SortStableFunc(sorted, func(a, b *node) int { return cmp.Compare(b.q.Priority, a.q.Priority) })
	var tiers [][]*node
	for i, n := range sorted {
		if i == 0 || n.q.Priority != sorted[i-1].q.Priority {
			tiers = append(tiers, nil)
		}
		tiers[len(tiers)-1] = append(tiers[len(tiers)-1], n)
	}
	return tiers
}

// floorTo rounds a non-negative x down to a whole number of units.
func floorTo(x, unit *big.Rat) *big.Rat {
	units := new(big.Rat).Quo(x, unit)
	whole := new(big.Int).Quo(units.Num(), units.Denom())
	return new(big.Rat).Mul(new(big.Rat).SetInt(whole), unit)
}
