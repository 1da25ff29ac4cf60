package gpu

import "fmt"

// wholeClaim reads nvidia.com/gpu on its own (no HAMi resource in the pod):
// whole devices. Every such container must ask for the same number.
func (p *parser) wholeClaim(ctrs []*containerInfo) *claim {
	var first *claim
	var firstCtr *containerInfo
	ok := true
	for _, ci := range ctrs {
		if ci.bad {
			ok = false
			continue
		}
		c := &claim{dialect: DialectWholeGPU, milli: MilliPerGPU, count: ci.count, countFrom: ci.gpu, amountFrom: ci.gpu}
		if first == nil {
			first, firstCtr = c, ci
			continue
		}
		if c.count != first.count {
			p.invalid(ci.gpu.path, ci.gpu.raw, fmt.Sprintf("container %q asks for %d GPUs, but container %q asks for %d; Partita gives every GPU container the same request: ask the same in each container, or split the pod",
				ci.name, c.count, firstCtr.name, first.count))
			ok = false
		}
	}
	if !ok {
		return nil
	}
	return first
}
