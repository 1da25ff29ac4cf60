package gpu

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// Reservation is what the admission loop holds for a pod it let go and that
// is not bound yet: the node and, per GPU container, the devices and what
// the container will hold on each of them, until Expires. It travels as the
// pod annotation partita.dev/reservation (FormatReservation), written in
// the same write that pins the pod and removes its admission gate, so that
// every ledger, in every process and after any restart, holds the devices
// for the pod until it binds, goes or the reservation expires (DESIGN §3).
//
// The annotation is a JSON object; fields a reader does not know are
// ignored, so that a newer writer's reservations still hold:
//
//	{"workload":"team-a/train","node":"gpu-2","expires":"2026-12-01T10:05:00.000Z",
//	 "containers":[{"name":"main","devices":["GPU-8f3c..."],"milli":1000}]}
type Reservation struct {
	// Workload names the gang (or single pod) the reservation is for, as
	// namespace/name; informational.
	Workload string `json:"workload,omitempty"`
	// Node is the node the devices are on; the pod is pinned there.
	Node string `json:"node"`
	// Expires is when the reservation lapses: the gang's schedule timeout
	// after its admission, or a single pod's hold.
	Expires time.Time `json:"expires"`
	// Containers are the GPU containers' devices, in spec order.
	Containers []ReservedContainer `json:"containers"`
}

// ReservedContainer is one container's reserved devices.
type ReservedContainer struct {
	// Name is the container's name.
	Name string `json:"name"`
	// Devices are the devices' UUIDs.
	Devices []string `json:"devices"`
	// Milli is the share of each device, in milli-GPUs (1000 for whole
	// devices).
	Milli int64 `json:"milli"`
	// MemoryMiB is the memory limit on each device, 0 for none.
	MemoryMiB int64 `json:"memoryMiB,omitempty"`
	// SMPercent is the compute limit in percent, 0 for none.
	SMPercent int32 `json:"smPercent,omitempty"`
}

// maxReservationBytes bounds the annotation a ledger reads: a pod has at
// most a few GPU containers of MaxCount devices each.
const maxReservationBytes = 16 << 10

// ReservationOf is the reservation of allocation a for workload until
// expires.
func ReservationOf(a *PodAllocation, workload string, expires time.Time) Reservation {
	r := Reservation{Workload: workload, Node: a.Node, Expires: expires.UTC()}
	for _, c := range a.Containers {
		r.Containers = append(r.Containers, ReservedContainer{
			Name: c.Container, Devices: slices.Clone(c.DeviceUUIDs), Milli: c.Milli, MemoryMiB: c.MemoryMiB, SMPercent: c.SMPercent,
		})
	}
	return r
}

// FormatReservation is r as the value of partita.dev/reservation.
func FormatReservation(r Reservation) (string, error) {
	if err := r.validate(); err != nil {
		return "", err
	}
	b, err := json.Marshal(r)
	if err != nil {
		return "", fmt.Errorf("write reservation: %w", err)
	}
	return string(b), nil
}

// ParseReservation reads the value of partita.dev/reservation.
func ParseReservation(s string) (*Reservation, error) {
	if len(s) > maxReservationBytes {
		return nil, fmt.Errorf("read reservation: %d bytes, more than %d", len(s), maxReservationBytes)
	}
	var r Reservation
	if err := json.Unmarshal([]byte(s), &r); err != nil {
		return nil, fmt.Errorf("read reservation: %w", err)
	}
	if err := r.validate(); err != nil {
		return nil, err
	}
	return &r, nil
}

// validate refuses a reservation no ledger could hold.
func (r *Reservation) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("read reservation: "+format, args...)
	}
	switch {
	case r.Node == "":
		return bad("no node")
	case r.Expires.IsZero():
		return bad("no expiry")
	case len(r.Containers) == 0:
		return bad("no container")
	}
	for i, c := range r.Containers {
		switch {
		case c.Name == "":
			return bad("container %d has no name", i)
		case slices.ContainsFunc(r.Containers[:i], func(o ReservedContainer) bool { return o.Name == c.Name }):
			return bad("container %s named twice", c.Name)
		case len(c.Devices) == 0 || len(c.Devices) > MaxCount:
			return bad("container %s has %d devices", c.Name, len(c.Devices))
		case c.Milli < 1 || c.Milli > MilliPerGPU:
			return bad("container %s holds %d milli-GPUs per device", c.Name, c.Milli)
		case c.MemoryMiB < 0 || c.MemoryMiB > MaxMemoryMiB:
			return bad("container %s has a memory limit of %dMiB", c.Name, c.MemoryMiB)
		case c.SMPercent < 0 || c.SMPercent > 100:
			return bad("container %s has a compute limit of %d%%", c.Name, c.SMPercent)
		}
		for k, d := range c.Devices {
			if d == "" || slices.Contains(c.Devices[:k], d) {
				return bad("container %s names device %q twice or empty", c.Name, d)
			}
		}
	}
	return nil
}

// Allocation is the reservation as the allocation of the pod ns/name.
func (r *Reservation) Allocation(ns, name string, uid types.UID) *PodAllocation {
	a := &PodAllocation{Namespace: ns, Name: name, UID: uid, Node: r.Node}
	for _, c := range r.Containers {
		a.Containers = append(a.Containers, ContainerAllocation{
			Container: c.Name, DeviceUUIDs: slices.Clone(c.Devices), Milli: c.Milli, MemoryMiB: c.MemoryMiB, SMPercent: c.SMPercent,
		})
	}
	return a
}

// errReservationMismatch says a reservation does not match the pod's
// request: it is ignored.
var errReservationMismatch = errors.New("the reservation does not match the pod's GPU request")

// reservedEntry reads the reservation of an unbound pod: nil when it has
// none, it is unreadable, does not match the pod's request, or has expired
// by now. Only Partita writes the annotation (the webhook refuses it from
// anyone else), so a readable one is trusted like the allocation
// annotations of a bound pod.
func reservedEntry(pod *corev1.Pod, now time.Time) *podEntry {
	s, ok := pod.Annotations[v1alpha1.AnnotationReservation]
	if !ok || pod.Spec.NodeName != "" || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return nil
	}
	r, err := ParseReservation(s)
	if err != nil {
		return nil
	}
	untilTried := holdsUntilTried(pod)
	if !now.Before(r.Expires) && !untilTried {
		return nil
	}
	e, err := entryFromReservation(pod, r)
	if err != nil {
		return nil
	}
	e.untilTried = untilTried
	return e
}

// holdsUntilTried reports whether an unbound pod's reservation is a single
// pod's hold (not pinned to a node: partita.dev/node unset) that
// kube-scheduler has not tried yet (no PodScheduled=False with reason
// Unschedulable). Such a hold outlives its expiry: the pod is admitted and
// charged to its queue, and when kube-scheduler's backlog is longer than
// the hold (thousands of pods released at once), dropping it let the
// admission loop give the same device to another pod, one of the two then
// never starting. It ends when the pod binds, is refused or goes away.
// Pinned gang members keep their expiry: the loop's schedule timeout acts
// on it.
func holdsUntilTried(pod *corev1.Pod) bool {
	if pod.Annotations[v1alpha1.AnnotationNode] != "" {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return false
		}
	}
	return true
}

func entryFromReservation(pod *corev1.Pod, r *Reservation) (*podEntry, error) {
	req, errs := ParsePod(pod)
	if len(errs) > 0 || req == nil || len(req.Containers) != len(r.Containers) {
		return nil, errReservationMismatch
	}
	e := &podEntry{namespace: pod.Namespace, name: pod.Name, uid: pod.UID, node: r.Node, expires: r.Expires}
	for _, rc := range req.Containers {
		i := slices.IndexFunc(r.Containers, func(c ReservedContainer) bool { return c.Name == rc.Name })
		if i < 0 || len(r.Containers[i].Devices) != rc.Count {
			return nil, errReservationMismatch
		}
		c := r.Containers[i]
		e.containers = append(e.containers, entryContainer{
			name: c.Name, uuids: slices.Clone(c.Devices), wantCount: rc.Count, milli: c.Milli, memMiB: c.MemoryMiB, smPercent: c.SMPercent,
		})
	}
	return e, nil
}
