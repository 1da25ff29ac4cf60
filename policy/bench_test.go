package policy

import (
	"context"
	"syscall"
	"testing"
	"time"
)

// BenchmarkEngineAdmission is one evaluation of the default policy for a
// GPU pod, on the state of testState.
func BenchmarkEngineAdmission(b *testing.B) {
	e := newTestEngine(b)
	in := input("team-a", "team-a", 500)
	ctx := context.Background()
	b.ReportAllocs()
	n := 0
	cpu0 := cpuTime(b)
	for b.Loop() {
		if _, err := e.Admission(ctx, in); err != nil {
			b.Fatal(err)
		}
		n++
	}
	b.ReportMetric(float64((cpuTime(b)-cpu0).Microseconds())/float64(n), "cpu-µs/op")
}

// cpuTime is the CPU time (user and system, all threads, GC included) the
// process has used: on a shared machine it measures the work, where the
// wall clock also measures the neighbours.
func cpuTime(b testing.TB) time.Duration {
	b.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkEngineQuota is one evaluation of the default quota policy for a
// gang in a queue two levels down: allowed, and denied by the queue and its
// parent (the messages cost extra).
func BenchmarkEngineQuota(b *testing.B) {
	cases := map[string]*QuotaInput{
		"allowed": quotaInput(2000, quotaQueue("team-a", 8000, 3000),
			quotaQueue("research", 16000, 9000), quotaQueue("org", -1, 20000)),
		"denied": quotaInput(2000, quotaQueue("team-a", 4000, 3000),
			quotaQueue("research", 16000, 16000), quotaQueue("org", -1, 20000)),
	}
	for name, in := range cases {
		b.Run(name, func(b *testing.B) {
			e := newTestEngine(b)
			ctx := context.Background()
			b.ReportAllocs()
			n := 0
			cpu0 := cpuTime(b)
			for b.Loop() {
				if _, err := e.Quota(ctx, in); err != nil {
					b.Fatal(err)
				}
				n++
			}
			b.ReportMetric(float64((cpuTime(b)-cpu0).Microseconds())/float64(n), "cpu-µs/op")
		})
	}
}
