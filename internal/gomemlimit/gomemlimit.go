// Package gomemlimit sets the Go runtime's soft memory limit of a
// long-running Partita process, so that its garbage collector works harder
// as the heap nears what the process may use, rather than letting the heap
// double past it between collections (GOGC=100) and the kernel kill it. At
// 50,000 pending pods the extender's heap was a third of its RSS.
package gomemlimit

import (
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/resource"
)

// Ratio is the share of the container's memory limit the soft limit is set
// at: the rest is for what the runtime does not count (stacks outside the
// heap, cgo, the binary) and a margin.
const Ratio = 0.9

// Set sets the soft limit: to flag (a quantity, e.g. 900Mi) when given,
// else to Ratio of the cgroup's memory limit (a container's
// resources.limits.memory), unless GOMEMLIMIT is set, which the runtime
// already follows. Without a flag or a cgroup limit it leaves the runtime
// as it is. It returns the limit set, 0 for none.
func Set(log logr.Logger, flag string) (int64, error) {
	if flag != "" {
		q, err := resource.ParseQuantity(flag)
		if err != nil {
			return 0, fmt.Errorf("--memory-limit %q: %w", flag, err)
		}
		if q.Value() <= 0 {
			return 0, fmt.Errorf("--memory-limit %q: want a positive size such as 900Mi", flag)
		}
		debug.SetMemoryLimit(q.Value())
		log.Info("Set the Go memory limit", "bytes", q.Value(), "from", "--memory-limit")
		return q.Value(), nil
	}
	limit, err := memlimit.Set(memlimit.WithRatio(Ratio), memlimit.WithProvider(memlimit.FromCgroup),
		memlimit.WithLogger(slog.New(logr.ToSlogHandler(log.V(1)))))
	switch {
	case errors.Is(err, memlimit.ErrNoLimit), errors.Is(err, memlimit.ErrNoCgroup), errors.Is(err, memlimit.ErrCgroupsNotSupported):
		return 0, nil
	case err != nil:
		// Not fatal: the process runs as before, with the runtime's defaults.
		log.Info("Could not read the container's memory limit; the Go runtime keeps its defaults", "err", err.Error())
		return 0, nil
	}
	if limit > 0 {
		log.Info("Set the Go memory limit", "bytes", limit, "from", "the container's memory limit", "ratio", Ratio)
	}
	return limit, nil
}
