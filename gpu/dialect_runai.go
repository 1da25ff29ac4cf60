package gpu

// runaiClaim reads Run:ai/KAI's pod annotations: gpu-fraction or gpu-memory
// (MiB), with gpu-fraction-num-devices for the number of devices.
func (p *parser) runaiClaim() (*claim, bool) {
	fr := p.annotation(AnnotationRunAIGPUFraction)
	mem := p.annotation(AnnotationRunAIGPUMemory)
	num := p.annotation(AnnotationRunAIGPUFractionNumDevices)
	if !fr.set() && !mem.set() && !num.set() {
		return nil, p.hasEmptyKey(AnnotationRunAIGPUFraction, AnnotationRunAIGPUMemory, AnnotationRunAIGPUFractionNumDevices)
	}
	c := &claim{dialect: DialectRunAI, count: 1}
	ok := true
	switch {
	case fr.set() && mem.set():
		p.invalid(fr.path, fr.raw, "set either gpu-fraction or gpu-memory, not both: a slice is a share of a GPU or an amount of its memory")
		ok = false
	case fr.set():
		milli, detail := parseFraction(fr.raw, "ask for whole GPUs with the resource nvidia.com/gpu")
		if detail != "" {
			p.invalid(fr.path, fr.raw, detail)
			ok = false
		}
		c.milli, c.amountFrom = milli, fr
	case mem.set():
		memMiB, detail := parseSmallInt(mem.raw, 1, MaxMemoryMiB, `MiB of GPU memory per GPU, such as "20480"; or write partita.dev/gpu-memory: "20Gi"`)
		if detail != "" {
			p.invalid(mem.path, mem.raw, detail)
			ok = false
		}
		c.memMiB, c.amountFrom = memMiB, mem
	default:
		p.invalid(num.path, num.raw, "needs gpu-fraction or gpu-memory: it says how many GPUs hold the slice; ask for whole GPUs with the resource nvidia.com/gpu")
		ok = false
	}
	c.countFrom = c.amountFrom
	if num.set() {
		n, detail := parseSmallInt(num.raw, 1, MaxCount, "the number of GPUs")
		if detail != "" {
			p.invalid(num.path, num.raw, detail)
			ok = false
		}
		c.count, c.countFrom = int(n), num
	}
	if !ok {
		return nil, true
	}
	return c, true
}
