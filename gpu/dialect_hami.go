package gpu

import "fmt"

// hamiClaim reads HAMi's container resources: nvidia.com/gpu devices, each
// holding nvidia.com/gpumem MiB or nvidia.com/gpumem-percentage of its
// memory (the whole device when neither is set), with an optional
// nvidia.com/gpucores compute limit. Every HAMi container must ask the same.
func (p *parser) hamiClaim(ctrs []*containerInfo) *claim {
	var first *claim
	var firstCtr *containerInfo
	ok := true
	for _, ci := range ctrs {
		if !ci.hami() && !ci.gpu.set() {
			continue
		}
		if ci.bad {
			ok = false
			continue
		}
		if !ci.gpu.set() {
			o := ci.firstHAMi()
			p.invalid(o.path, o.raw, "needs nvidia.com/gpu on the same container: HAMi's resources describe each of its nvidia.com/gpu devices")
			ok = false
			continue
		}
		c := &claim{dialect: DialectHAMi, milli: MilliPerGPU, count: ci.count, countFrom: ci.gpu, amountFrom: ci.gpu}
		switch {
		case ci.mem.set() && ci.pct.set():
			p.invalid(ci.pct.path, ci.pct.raw, "set either nvidia.com/gpumem or nvidia.com/gpumem-percentage, not both: a slice is a share of a GPU or an amount of its memory")
			ok = false
			continue
		case ci.mem.set():
			c.milli, c.memMiB, c.amountFrom = 0, ci.memMiB, ci.mem
		case ci.pct.set():
			c.milli, c.amountFrom = ci.pctValue*10, ci.pct
		}
		if ci.cores.set() {
			c.cores, c.coresFrom = int32(ci.coresPct), ci.cores
		}
		if first == nil {
			first, firstCtr = c, ci
			continue
		}
		if first.milli != c.milli || first.memMiB != c.memMiB || first.count != c.count || first.cores != c.cores {
			p.invalid(c.amountFrom.path, c.amountFrom.raw, fmt.Sprintf("container %q asks for %s, but container %q asks for %s; Partita gives every GPU container the same request: ask the same in each container, or split the pod",
				ci.name, describeClaim(c), firstCtr.name, describeClaim(first)))
			ok = false
		}
	}
	if !ok {
		return nil
	}
	return first
}

func describeClaim(c *claim) string {
	s := fmt.Sprintf("%d × %s", c.count, c.describeAmount())
	if c.cores > 0 {
		s += fmt.Sprintf(" with %d%% of the cores", c.cores)
	}
	return s
}
