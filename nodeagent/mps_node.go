package nodeagent

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// Event reasons of mps mode, on GPUNodes.
const (
	// ReasonMPSNotReady: MPSReady turned False (a daemon not running, a
	// device not in EXCLUSIVE_PROCESS, devices left without MPS).
	ReasonMPSNotReady = "MPSNotReady"
	// ReasonMPSReady: MPSReady turned True again.
	ReasonMPSReady = "MPSReady"
	// ReasonMPSLimitsRepaired: a daemon's limits had been changed through
	// its control pipe, by one of its clients; the agent set them again.
	ReasonMPSLimitsRepaired = "MPSLimitsRepaired"
)

// exclusiveRecord is the content of mps-exclusive.json.
type exclusiveRecord struct {
	Node  string   `json:"node"`
	UUIDs []string `json:"uuids"`
}

// gpuNodeRef names a node's GPUNode for events.
func gpuNodeRef(name string) *v1alpha1.GPUNode {
	return &v1alpha1.GPUNode{ObjectMeta: metav1.ObjectMeta{Name: name}}
}

// loadExclusive reads, once, the devices an earlier agent put in
// EXCLUSIVE_PROCESS.
func (a *Agent) loadExclusive(ctx context.Context, st *nodeState, stateDir string) {
	if st.exclusive != nil {
		return
	}
	st.exclusive = map[string]bool{}
	if stateDir == "" {
		return
	}
	var rec exclusiveRecord
	ok, err := readStateFile(filepath.Join(stateDir, mpsExclusiveFile), &rec)
	switch {
	case err != nil:
		logr.FromContextOrDiscard(ctx).Error(err, "Could not read the devices put in EXCLUSIVE_PROCESS; only those this agent sets are put back")
	case ok && (rec.Node == "" || rec.Node == st.name):
		for _, u := range rec.UUIDs {
			st.exclusive[u] = true
		}
	}
}

// saveExclusive records the devices the agent put in EXCLUSIVE_PROCESS.
func (a *Agent) saveExclusive(ctx context.Context, st *nodeState, stateDir string) {
	if stateDir == "" {
		return
	}
	rec := exclusiveRecord{Node: st.name, UUIDs: []string{}}
	for u := range st.exclusive {
		rec.UUIDs = append(rec.UUIDs, u)
	}
	slices.Sort(rec.UUIDs)
	if err := writeStateFile(filepath.Join(stateDir, mpsExclusiveFile), rec); err != nil {
		logr.FromContextOrDiscard(ctx).Error(err, "Could not record the devices put in EXCLUSIVE_PROCESS")
	}
}

// holdExclusive puts each target's device in EXCLUSIVE_PROCESS, before its
// daemon starts, so that only the daemon's MPS server holds a context on
// it: a process that skips MPS (no pipe directory, another one) cannot
// create a context of its own beside it. It returns the devices it could
// not, with why. A backend without compute modes (none but NVML and the
// simulated one) has nothing to hold.
func (a *Agent) holdExclusive(ctx context.Context, st *nodeState, stateDir string, targets []mpsTarget) map[int32]string {
	cm, ok := st.backend.(ComputeModeSetter)
	if !ok {
		return nil
	}
	a.loadExclusive(ctx, st, stateDir)
	log := logr.FromContextOrDiscard(ctx)
	failed := map[int32]string{}
	changed := false
	for _, t := range targets {
		mode, err := cm.ComputeMode(ctx, t.Index)
		if err == nil && mode != ComputeModeExclusiveProcess {
			err = cm.SetComputeMode(ctx, t.Index, ComputeModeExclusiveProcess)
			if err == nil {
				log.V(2).Info("Put GPU in EXCLUSIVE_PROCESS compute mode for its MPS daemon", "device", t.Index, "uuid", t.UUID, "was", mode)
			}
		}
		if err != nil {
			failed[t.Index] = err.Error()
			if st.exclusiveErrs[t.Index] != err.Error() {
				log.Error(err, "Could not put GPU in EXCLUSIVE_PROCESS compute mode: a process that skips MPS can use it beside the daemon", "device", t.Index)
			}
			continue
		}
		if !st.exclusive[t.UUID] {
			st.exclusive[t.UUID] = true
			changed = true
		}
	}
	st.exclusiveErrs = failed
	if changed {
		a.saveExclusive(ctx, st, stateDir)
	}
	return failed
}

// releaseExclusive puts back to DEFAULT the devices the agent put in
// EXCLUSIVE_PROCESS that no daemon serves any more (the device is held
// whole, a slice spans it, the node left mps mode), after their daemons
// stopped: a whole-device pod may run several processes. A device an
// operator set to another mode since is left as it is.
func (a *Agent) releaseExclusive(ctx context.Context, st *nodeState, stateDir string, devices []v1alpha1.GPUDevice, targets []mpsTarget) {
	cm, ok := st.backend.(ComputeModeSetter)
	if !ok {
		return
	}
	a.loadExclusive(ctx, st, stateDir)
	log := logr.FromContextOrDiscard(ctx)
	changed := false
	for uuid := range st.exclusive {
		if slices.ContainsFunc(targets, func(t mpsTarget) bool { return t.UUID == uuid }) {
			continue
		}
		i := slices.IndexFunc(devices, func(d v1alpha1.GPUDevice) bool { return d.UUID == uuid })
		if i < 0 {
			continue // not seen now (NVML unavailable, or gone): try later
		}
		d := devices[i]
		mode, err := cm.ComputeMode(ctx, d.Index)
		if err == nil && mode == ComputeModeExclusiveProcess {
			err = cm.SetComputeMode(ctx, d.Index, ComputeModeDefault)
		}
		if err != nil {
			log.Error(err, "Could not put GPU back in DEFAULT compute mode; retrying at the next sync", "device", d.Index)
			continue
		}
		log.V(2).Info("Put GPU back in DEFAULT compute mode: no MPS daemon serves it", "device", d.Index, "uuid", uuid)
		delete(st.exclusive, uuid)
		changed = true
	}
	if changed {
		a.saveExclusive(ctx, st, stateDir)
	}
}

// runningDaemons are the devices (by UUID) whose daemon is known to run:
// the agent's own, or those the keeper recorded in mps-daemons.json.
func (a *Agent) runningDaemons(ctx context.Context, st *nodeState, cfg MPSConfig) map[string]bool {
	out := map[string]bool{}
	if !cfg.Keeper {
		if st.mps != nil {
			st.mps.lock.Lock()
			for u := range st.mps.records {
				out[u] = true
			}
			st.mps.lock.Unlock()
		}
		return out
	}
	var rec mpsState
	ok, err := readStateFile(filepath.Join(cfg.StateDir, mpsStateFile), &rec)
	if err != nil {
		logr.FromContextOrDiscard(ctx).V(2).Info("Could not read the MPS keeper's record of its daemons", "err", err)
	}
	if ok && (rec.Node == "" || rec.Node == st.name) {
		for _, d := range rec.Daemons {
			out[d.UUID] = true
		}
	}
	return out
}

// mpsCondition says whether mps mode is in force on every shared device.
// interposer says whether the interposer caps the slices that span
// devices (interposer.SliceMode: installed, and a container path that
// mounts it).
func mpsCondition(plan mpsPlan, running map[string]bool, notExclusive map[int32]string, keeper, interposer bool) metav1.Condition {
	var stopped, loose []string
	for _, t := range plan.targets {
		if !running[t.UUID] {
			stopped = append(stopped, fmt.Sprint(t.Index))
		}
		if why, ok := notExclusive[t.Index]; ok {
			loose = append(loose, fmt.Sprintf("%d (%s)", t.Index, why))
		}
	}
	var spanned []string
	for _, i := range plan.spanned {
		spanned = append(spanned, fmt.Sprint(i))
	}
	c := metav1.Condition{Type: v1alpha1.ConditionMPSReady, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonMPSRunning}
	var msgs []string
	if len(stopped) > 0 {
		where := "the agent's log"
		if keeper {
			where = "that the node's mps-keeper pod runs, and its log"
		}
		msgs = append(msgs, fmt.Sprintf("no MPS control daemon runs for devices %s: their slices run without MPS, limited by the watchdog alone; check %s", strings.Join(stopped, ","), where))
	}
	if len(loose) > 0 {
		msgs = append(msgs, "devices not in EXCLUSIVE_PROCESS, where a process that skips MPS can create a context beside the daemon's: "+strings.Join(loose, ", "))
	}
	if len(spanned) > 0 {
		capped := "limited by the watchdog alone"
		if interposer {
			capped = "capped by the interposer (HAMi-core) when they span devices, else by the watchdog alone"
		}
		msgs = append(msgs, fmt.Sprintf("devices %s run without MPS: a slice spans them, which one daemon per device cannot serve; their slices are %s", strings.Join(spanned, ","), capped))
	}
	switch {
	case len(stopped) > 0:
		c.Status, c.Reason = metav1.ConditionFalse, v1alpha1.ReasonMPSNotRunning
	case len(loose) > 0:
		c.Status, c.Reason = metav1.ConditionFalse, v1alpha1.ReasonComputeModeNotExclusive
	case len(spanned) > 0:
		c.Status, c.Reason = metav1.ConditionFalse, v1alpha1.ReasonSlicesSpanDevices
	default:
		msgs = append(msgs, fmt.Sprintf("an MPS control daemon runs for each of the %d shared devices, in EXCLUSIVE_PROCESS where the backend sets compute modes", len(plan.targets)))
	}
	c.Message = truncate(strings.Join(msgs, "; "), 1024)
	return c
}

// statusConditions are the conditions to publish: prev with MPSReady set to
// mps (nil removes it), keeping its transition time while its status
// holds; an event marks each change of its reason.
func (a *Agent) statusConditions(st *nodeState, prev []metav1.Condition, mps *metav1.Condition) []metav1.Condition {
	out := slices.Clone(prev)
	if mps == nil {
		apimeta.RemoveStatusCondition(&out, v1alpha1.ConditionMPSReady)
		st.mpsReason = ""
	} else {
		mps.LastTransitionTime = metav1.NewTime(a.opts.Clock.Now())
		apimeta.SetStatusCondition(&out, *mps)
		if mps.Reason != st.mpsReason {
			switch {
			case mps.Status == metav1.ConditionFalse:
				a.recorder.Eventf(gpuNodeRef(st.name), nil, corev1.EventTypeWarning, ReasonMPSNotReady, "ApplyMPS", "%s", mps.Message)
			case st.mpsReason != "":
				a.recorder.Eventf(gpuNodeRef(st.name), nil, corev1.EventTypeNormal, ReasonMPSReady, "ApplyMPS", "%s", mps.Message)
			}
			st.mpsReason = mps.Reason
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}
