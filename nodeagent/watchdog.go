package nodeagent

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// EnforceMode is what the watchdog does about a slice that uses more GPU
// memory than its limit.
type EnforceMode string

// Enforce modes.
const (
	// EnforceOff only measures: metrics, no event, no action.
	EnforceOff EnforceMode = "off"
	// EnforceReport emits a GPUOveruse Warning event on the pod and counts it.
	EnforceReport EnforceMode = "report"
	// EnforceKill also ends the container's processes on that device, the
	// largest first, until the slice is back under its limit. The agent must
	// run with hostPID: true to reach them.
	EnforceKill EnforceMode = "kill"
)

// ParseEnforceMode reads an --enforce value.
func ParseEnforceMode(s string) (EnforceMode, error) {
	switch m := EnforceMode(s); m {
	case EnforceOff, EnforceReport, EnforceKill:
		return m, nil
	}
	return "", fmt.Errorf("parse enforce mode %q: want off, report or kill", s)
}

// ReasonGPUOveruse is the reason of the watchdog's Warning events.
const ReasonGPUOveruse = "GPUOveruse"

// EventRecorder records events about objects; events.EventRecorder from
// client-go satisfies it.
type EventRecorder interface {
	Eventf(regarding runtime.Object, related runtime.Object, eventtype, reason, action, note string, args ...any)
}

// watchdog compares what each slice's processes use with the slice's limit,
// for one node. It is used by one sync at a time.
type watchdog struct {
	node        string
	enforce     EnforceMode
	reportEvery time.Duration
	clock       clock.PassiveClock
	recorder    EventRecorder
	killer      ProcessKiller // nil when the backend cannot end processes
	metrics     *Metrics

	// reported is when each slice over its limit was last acted on.
	reported map[sliceKey]time.Time
	// series are the slices that have metric series, with their pod.
	series map[sliceKey]types.NamespacedName
}

func newWatchdog(node string, enforce EnforceMode, reportEvery time.Duration, clk clock.PassiveClock, rec EventRecorder, killer ProcessKiller, m *Metrics) *watchdog {
	return &watchdog{
		node: node, enforce: enforce, reportEvery: reportEvery, clock: clk, recorder: rec, killer: killer, metrics: m,
		reported: map[sliceKey]time.Time{}, series: map[sliceKey]types.NamespacedName{},
	}
}

// attribute adds each process's memory to the slice it belongs to. It
// returns the bytes in use per slice and, per device, the bytes of
// processes that belong to no slice (another pod, a process on the host, or
// a pod the agent cannot see without hostPID).
func attribute(held []boundPod, procs []Process) (used map[sliceKey]int64, byKey map[sliceKey][]Process, unattributed map[int32]int64) {
	used, byKey, unattributed = map[sliceKey]int64{}, map[sliceKey][]Process{}, map[int32]int64{}
	type podInfo struct {
		containers map[string]string // container ID → name
		slices     map[sliceKey]bool
		byDevice   map[int32][]string // device → GPU containers on it
	}
	pods := make(map[types.UID]*podInfo, len(held))
	for _, h := range held {
		pi := &podInfo{containers: map[string]string{}, slices: map[sliceKey]bool{}, byDevice: map[int32][]string{}}
		for _, cs := range h.pod.Status.ContainerStatuses {
			if _, id, ok := strings.Cut(cs.ContainerID, "://"); ok {
				pi.containers[id] = cs.Name
			}
		}
		for _, c := range h.alloc.Containers {
			for _, dev := range c.DeviceIndexes {
				pi.slices[sliceKey{UID: h.pod.UID, Container: c.Container, Device: dev}] = true
				pi.byDevice[dev] = append(pi.byDevice[dev], c.Container)
			}
		}
		pods[h.pod.UID] = pi
	}
	for _, p := range procs {
		pi := pods[p.PodUID]
		if pi == nil {
			unattributed[p.DeviceIndex] += p.MemoryBytes
			continue
		}
		name := p.Container
		if name == "" {
			name = pi.containers[p.ContainerID]
		}
		// The container's status may lag its start; a pod with one GPU
		// container on the device leaves no doubt.
		if name == "" && len(pi.byDevice[p.DeviceIndex]) == 1 {
			name = pi.byDevice[p.DeviceIndex][0]
		}
		k := sliceKey{UID: p.PodUID, Container: name, Device: p.DeviceIndex}
		if !pi.slices[k] {
			unattributed[p.DeviceIndex] += p.MemoryBytes
			continue
		}
		used[k] += p.MemoryBytes
		byKey[k] = append(byKey[k], p)
	}
	return used, byKey, unattributed
}

// check measures every slice, publishes its metrics and acts on those over
// their limit. It returns the bytes in use per slice and the unattributed
// bytes per device.
func (w *watchdog) check(ctx context.Context, held []boundPod, procs []Process) (used map[sliceKey]int64, unattributed map[int32]int64) {
	used, byKey, unattributed := attribute(held, procs)
	now := w.clock.Now()
	live := map[sliceKey]bool{}
	for _, h := range held {
		for _, c := range h.alloc.Containers {
			for _, dev := range c.DeviceIndexes {
				k := sliceKey{UID: h.pod.UID, Container: c.Container, Device: dev}
				live[k] = true
				w.series[k] = types.NamespacedName{Namespace: h.pod.Namespace, Name: h.pod.Name}
				w.metrics.reportSlice(w.node, h.pod.Namespace, h.pod.Name, k, used[k], c.MemoryMiB*mib)
				if c.MemoryMiB == 0 || used[k] <= c.MemoryMiB*mib {
					delete(w.reported, k)
					continue
				}
				if last, ok := w.reported[k]; ok && now.Sub(last) < w.reportEvery {
					continue
				}
				w.reported[k] = now
				if w.overuse(ctx, h.pod, k, used[k], c.MemoryMiB, byKey[k]) {
					// Ended: the next process over the limit, even one
					// that replaces it before the next check, is ended
					// at that check, not a report interval later.
					delete(w.reported, k)
				}
			}
		}
	}
	for k, pod := range w.series {
		if !live[k] {
			w.metrics.clearSlice(w.node, pod.Namespace, pod.Name, k)
			delete(w.series, k)
			delete(w.reported, k)
		}
	}
	return used, unattributed
}

// overuse acts on one slice over its limit. It reports whether it ended
// enough of its processes to bring the slice back under the limit.
func (w *watchdog) overuse(ctx context.Context, pod *corev1.Pod, k sliceKey, usedBytes, limitMiB int64, procs []Process) bool {
	log := logr.FromContextOrDiscard(ctx).WithValues("pod", klog.KObj(pod), "container", k.Container, "device", k.Device)
	w.metrics.overuse.WithLabelValues(w.node, string(w.enforce)).Inc()
	note := fmt.Sprintf("container %s uses %dMiB of GPU memory on device %d, over its limit of %dMiB", k.Container, usedBytes/mib, k.Device, limitMiB)
	switch w.enforce {
	case EnforceOff:
		log.V(4).Info("Slice over its GPU memory limit", "usedMiB", usedBytes/mib, "limitMiB", limitMiB)
		return false
	case EnforceReport:
		log.V(2).Info("Reported a slice over its GPU memory limit", "usedMiB", usedBytes/mib, "limitMiB", limitMiB)
		w.recorder.Eventf(pod, nil, corev1.EventTypeWarning, ReasonGPUOveruse, "Report", "%s", note)
		return false
	}
	var killed []string
	var failed error
	procs = slices.Clone(procs)
	slices.SortFunc(procs, func(a, b Process) int { return cmp.Compare(b.MemoryBytes, a.MemoryBytes) })
	left := usedBytes
	for _, p := range procs {
		if left <= limitMiB*mib {
			break
		}
		if w.killer == nil {
			failed = fmt.Errorf("kill process %d: this backend cannot end processes", p.PID)
			break
		}
		if err := w.killer.Kill(ctx, p); err != nil {
			failed = err
			w.metrics.killErrors.WithLabelValues(w.node).Inc()
			continue
		}
		killed = append(killed, fmt.Sprint(p.PID))
		left -= p.MemoryBytes
	}
	if len(killed) > 0 {
		note += "; ended process " + strings.Join(killed, ", ")
		log.Info("Ended processes over their slice's GPU memory limit", "pids", killed, "usedMiB", usedBytes/mib, "limitMiB", limitMiB)
	}
	if failed != nil {
		note += "; could not end a process: " + failed.Error()
		log.Error(failed, "Could not end a process over its slice's GPU memory limit")
	}
	w.recorder.Eventf(pod, nil, corev1.EventTypeWarning, ReasonGPUOveruse, "Kill", "%s", truncate(note, 1024))
	return left <= limitMiB*mib
}

// hasLimit reports whether any held slice has a memory limit the
// watchdog enforces.
func hasLimit(held []boundPod) bool {
	for _, h := range held {
		for _, c := range h.alloc.Containers {
			if c.MemoryMiB > 0 && len(c.DeviceIndexes) > 0 {
				return true
			}
		}
	}
	return false
}

// truncate shortens s to at most n bytes.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}
