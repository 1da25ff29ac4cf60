package gpu

import (
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// canonicalClaim reads the partita.dev/* request annotations. Present
// canonical keys make a complete request: without gpu-fraction or
// gpu-memory they ask for whole devices, without gpu-count for one device.
func (p *parser) canonicalClaim() (*claim, bool) {
	fr := p.annotation(v1alpha1.AnnotationGPUFraction)
	mem := p.annotation(v1alpha1.AnnotationGPUMemory)
	cnt := p.annotation(v1alpha1.AnnotationGPUCount)
	cores := p.annotation(v1alpha1.AnnotationGPUCores)
	if !fr.set() && !mem.set() && !cnt.set() && !cores.set() {
		return nil, p.hasEmptyKey(v1alpha1.AnnotationGPUFraction, v1alpha1.AnnotationGPUMemory, v1alpha1.AnnotationGPUCount, v1alpha1.AnnotationGPUCores)
	}
	c := &claim{dialect: DialectPartita, milli: MilliPerGPU, count: 1}
	ok := true
	switch {
	case fr.set() && mem.set():
		p.invalid(fr.path, fr.raw, "set either partita.dev/gpu-fraction or partita.dev/gpu-memory, not both: a slice is a share of a GPU or an amount of its memory")
		ok = false
	case fr.set():
		milli, detail := parseFraction(fr.raw, "ask for whole GPUs with partita.dev/gpu-count")
		if detail != "" {
			p.invalid(fr.path, fr.raw, detail)
			ok = false
		}
		c.milli, c.amountFrom = milli, fr
	case mem.set():
		memMiB, detail := parseMemoryQuantity(mem.raw)
		if detail != "" {
			p.invalid(mem.path, mem.raw, detail)
			ok = false
		}
		c.milli, c.memMiB, c.amountFrom = 0, memMiB, mem
	case cnt.set():
		c.amountFrom = cnt
	default:
		c.amountFrom = cores
	}
	c.countFrom = c.amountFrom
	if cnt.set() {
		n, detail := parseSmallInt(cnt.raw, 1, MaxCount, "the number of GPUs")
		if detail != "" {
			p.invalid(cnt.path, cnt.raw, detail)
			ok = false
		}
		c.count, c.countFrom = int(n), cnt
	}
	if cores.set() {
		n, detail := parseSmallInt(cores.raw, 1, 100, "percent of each GPU's compute")
		if detail != "" {
			p.invalid(cores.path, cores.raw, detail)
			ok = false
		}
		c.cores, c.coresFrom = int32(n), cores
	}
	if !ok {
		return nil, true
	}
	return c, true
}

// hasEmptyKey reports (and refuses) request annotations present with an
// empty value: a pod that writes the key means to ask for something.
func (p *parser) hasEmptyKey(keys ...string) bool {
	found := false
	for _, k := range keys {
		if v, ok := p.pod.Annotations[k]; ok && v == "" {
			p.invalid(annotationsPath().Key(k), v, "must not be empty; give a value or leave the annotation out")
			found = true
		}
	}
	return found
}

// parseMemoryQuantity reads a Kubernetes quantity of GPU memory per device
// into MiB, rounding up.
func parseMemoryQuantity(s string) (int64, string) {
	const syntax = `must be an amount of memory per GPU, such as "20Gi"`
	if len(s) > maxValueLen {
		return 0, syntax + "; this value is too long"
	}
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return 0, syntax
	}
	switch {
	case q.Sign() <= 0:
		return 0, syntax + "; it must be greater than 0"
	case q.Cmp(resource.MustParse("1Mi")) < 0:
		return 0, syntax + `; it is less than 1Mi: did you leave out the unit ("Gi")?`
	case q.Cmp(*resource.NewQuantity(MaxMemoryMiB<<20, resource.BinarySI)) > 0:
		return 0, syntax + "; it must be at most 1Ti; ask for whole GPUs with partita.dev/gpu-count"
	}
	return (q.Value() + 1<<20 - 1) >> 20, ""
}
