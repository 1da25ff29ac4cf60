package e2e

import (
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// restartingCounters sums counters that start again at zero when their
// process is replaced: the CPU seconds of a killed extender's successor,
// the request counts of a restarted kube-apiserver. Readings are taken
// every interval; the last reading of a replaced process is kept, so a
// phase's total is the sum over every process that served it, less what
// was counted before it began. What a process counted between its last
// reading and its death is lost (at most one interval).
type restartingCounters struct {
	mu sync.Mutex
	// base is the first reading; last the latest, by key; owner the
	// process each key's last reading came from; gone the sum of the last
	// readings of processes since replaced.
	base, last, gone map[string]float64
	owner            map[string]string
	stop             func()
}

// newRestartingCounters reads once now and, when interval > 0, again every
// interval until stop. read returns the counters by key and, for each
// key, the process that counts it (a pid); a key whose process changed,
// or whose value went down, was counted again from zero.
func newRestartingCounters(read func() (map[string]float64, map[string]string), interval time.Duration) *restartingCounters {
	c := &restartingCounters{base: map[string]float64{}, last: map[string]float64{}, gone: map[string]float64{}, owner: map[string]string{}, stop: func() {}}
	v, o := read()
	c.observe(v, o)
	for k, x := range v {
		c.base[k] = x
	}
	if interval > 0 {
		done := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			tick := time.NewTicker(interval)
			defer tick.Stop()
			for {
				select {
				case <-done:
					return
				case <-tick.C:
					c.observe(read())
				}
			}
		})
		c.stop = func() { close(done); wg.Wait() }
	}
	return c
}

// observe takes one reading. A key missing from it (its process down
// for the moment) keeps its last reading.
func (c *restartingCounters) observe(values map[string]float64, owners map[string]string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, v := range values {
		prev, seen := c.last[k]
		if seen && (owners[k] != c.owner[k] || v < prev) {
			c.gone[k] += prev
		}
		c.last[k], c.owner[k] = v, owners[k]
	}
}

// since stops the readings, takes a last one and returns each key's total
// since the first.
func (c *restartingCounters) since(read func() (map[string]float64, map[string]string)) map[string]float64 {
	c.stop()
	c.observe(read())
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]float64, len(c.last))
	for k, v := range c.last {
		out[k] = c.gone[k] + v - c.base[k]
	}
	return out
}

func TestRestartingCountersSumReplacedProcesses(t *testing.T) {
	type reading struct {
		values map[string]float64
		owners map[string]string
	}
	cases := map[string]struct {
		readings []reading
		want     map[string]float64
	}{
		"one process: the difference": {
			readings: []reading{
				{map[string]float64{"extender": 10}, map[string]string{"extender": "1"}},
				{map[string]float64{"extender": 25}, map[string]string{"extender": "1"}},
			},
			want: map[string]float64{"extender": 15},
		},
		"a killed process's successor: both counted": {
			readings: []reading{
				{map[string]float64{"extender": 10}, map[string]string{"extender": "1"}},
				{map[string]float64{"extender": 30}, map[string]string{"extender": "1"}},
				{map[string]float64{}, map[string]string{}}, // down for a moment
				{map[string]float64{"extender": 4}, map[string]string{"extender": "2"}},
				{map[string]float64{"extender": 7}, map[string]string{"extender": "2"}},
			},
			want: map[string]float64{"extender": 20 + 7},
		},
		"a counter gone down under the same owner started again": {
			readings: []reading{
				{map[string]float64{"POST pods": 100}, map[string]string{"POST pods": "9"}},
				{map[string]float64{"POST pods": 180}, map[string]string{"POST pods": "9"}},
				{map[string]float64{"POST pods": 5}, map[string]string{"POST pods": "9"}},
			},
			want: map[string]float64{"POST pods": 80 + 5},
		},
		"a key first seen later counts from zero": {
			readings: []reading{
				{map[string]float64{}, map[string]string{}},
				{map[string]float64{"POST pods/eviction": 12}, map[string]string{"POST pods/eviction": "9"}},
			},
			want: map[string]float64{"POST pods/eviction": 12},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			i := 0
			read := func() (map[string]float64, map[string]string) {
				r := tc.readings[i]
				i++
				return r.values, r.owners
			}
			c := newRestartingCounters(read, 0)
			for i < len(tc.readings)-1 {
				c.observe(read())
			}
			if diff := cmp.Diff(tc.want, c.since(read)); diff != "" {
				t.Errorf("totals (-want +got):\n%s", diff)
			}
		})
	}
}
