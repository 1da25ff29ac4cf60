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
