package admission

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/admission/cycle"
	"github.com/partita-dev/partita/api/v1alpha1"
)

// writeQueueStatus writes each queue's allocation, request, fair share,
// usage and pending workloads where they changed.
func (a *Admitter) writeQueueStatus(ctx context.Context, st *cycle.State, res *cycle.Result, now time.Time) error {
	var jobs []func() error
	for _, r := range res.Queues {
		q := st.Queues[r.Name]
		if q == nil {
			continue
		}
		want := q.Status.DeepCopy()
		want.Allocated = resourceList(want.Allocated, r.AllocatedMilli, r.CPU.Allocated, r.Memory.Allocated)
		want.Requested = resourceList(want.Requested, r.RequestedMilli, r.CPU.Requested, r.Memory.Requested)
		want.FairShare = resourceList(want.FairShare, r.FairShareMilli, r.CPU.FairShare, r.Memory.FairShare)
		want.PendingWorkloads = r.PendingWorkloads
		want.ChildQueues = slices.Clone(r.Children)
		var freshUsage bool
		want.Usage, freshUsage = a.usageStatus(ctx, r, q.Status.Usage, now)
		a.metrics.queue(r)
		if equality.Semantic.DeepEqual(&q.Status, want) {
			continue
		}
		if freshUsage {
			a.metrics.usageWritten()
		}
		obj := &v1alpha1.Queue{ObjectMeta: metav1.ObjectMeta{Name: r.Name}, Status: q.Status}
		patched := obj.DeepCopy()
		patched.Status = *want
		jobs = append(jobs, func() error {
			if err := a.statusClient().Status().Patch(ctx, patched, client.MergeFrom(obj)); err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("write status of queue %s: %w", patched.Name, err)
			}
			return nil
		})
	}
	return errors.Join(parallel(statusWorkers, jobs)...)
}

// statusWorkers bounds the status writes in flight at once.
const statusWorkers = 8

// resourceList sets the gpu, cpu and memory entries of l: gpuMilli
// milli-GPUs, cpuMilli milli-CPUs and memory bytes.
func resourceList(l corev1.ResourceList, gpuMilli, cpuMilli, memory int64) corev1.ResourceList {
	out := corev1.ResourceList{}
	for k, v := range l {
		out[k] = v
	}
	out[v1alpha1.ResourceGPU] = *resource.NewMilliQuantity(gpuMilli, resource.DecimalSI)
	out[v1alpha1.ResourceCPU] = *resource.NewMilliQuantity(cpuMilli, resource.DecimalSI)
	out[v1alpha1.ResourceMemory] = *resource.NewQuantity(memory, resource.BinarySI)
	return out
}

// writePodGroupStatus writes each gang's phase, counts and reason where
// they changed.
func (a *Admitter) writePodGroupStatus(ctx context.Context, st *cycle.State, res *cycle.Result, now time.Time) error {
	// Only gangs have a PodGroup: thousands of single pods may wait.
	waiting := map[cycle.WorkloadKey]cycle.Wait{}
	for _, w := range res.Waiting {
		if w.Workload.HasPodGroup {
			waiting[w.Workload.Key] = w
		}
	}
	admitted := map[cycle.WorkloadKey]int{}
	for _, ad := range res.Admissions {
		if ad.Workload.HasPodGroup {
			admitted[ad.Workload.Key] = len(ad.Members)
		}
	}
	var jobs []func() error
	for _, w := range st.Gangs {
		if !w.HasPodGroup {
			continue
		}
		want := w.PodGroupStatus.DeepCopy()
		bound := int32(0)
		for _, m := range w.Active {
			if m.Bound {
				bound++
			}
		}
		// Members that ran to completion were bound: a finished gang stays
		// Running rather than seem to wait for members again.
		bound += w.Succeeded
		want.Admitted = int32(len(w.Active) + admitted[w.Key])
		want.Running = bound
		cond := metav1.Condition{Type: v1alpha1.PodGroupConditionAdmitted, Status: metav1.ConditionFalse, LastTransitionTime: metav1.NewTime(now)}
		wt, waits := waiting[w.Key]
		if waits && settling(wt, now) {
			// Still getting its members: the status is written once they
			// are in, or once the gang has stopped growing.
			continue
		}
		switch {
		case a.timedOut[w.Key].started.Equal(w.Started()) && len(w.Active) > 0 && bound < w.MinMember:
			want.Phase = v1alpha1.PodGroupFailed
			want.Reason = truncate(a.timedOut[w.Key].message, 1024)
			cond.Reason, cond.Message = v1alpha1.ReasonScheduleTimeout, want.Reason
		case bound >= w.MinMember:
			want.Phase, want.Reason = v1alpha1.PodGroupRunning, ""
			cond.Status, cond.Reason, cond.Message = metav1.ConditionTrue, v1alpha1.ReasonAdmitted, fmt.Sprintf("%d of %d members bound", bound, w.MinMember)
		case want.Admitted >= w.MinMember:
			want.Phase, want.Reason = v1alpha1.PodGroupAdmitted, ""
			cond.Status, cond.Reason, cond.Message = metav1.ConditionTrue, v1alpha1.ReasonAdmitted, fmt.Sprintf("%d members admitted; %d bound", want.Admitted, bound)
		case waits:
			want.Phase, want.Reason = v1alpha1.PodGroupPending, truncate(wt.Message, 1024)
			cond.Reason, cond.Message = wt.Reason, want.Reason
		default:
			want.Phase = v1alpha1.PodGroupPending
			cond.Reason, cond.Message = v1alpha1.ReasonWaitingForMembers, "waiting for its members"
		}
		meta.SetStatusCondition(&want.Conditions, cond)
		if equality.Semantic.DeepEqual(&w.PodGroupStatus, want) {
			continue
		}
		obj := &v1alpha1.PodGroup{ObjectMeta: metav1.ObjectMeta{Namespace: w.Key.Namespace, Name: w.Key.GangName()}, Status: w.PodGroupStatus}
		patched := obj.DeepCopy()
		patched.Status = *want
		jobs = append(jobs, func() error {
			if err := a.statusClient().Status().Patch(ctx, patched, client.MergeFrom(obj)); err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("write status of pod group %s/%s: %w", patched.Namespace, patched.Name, err)
			}
			return nil
		})
	}
	return errors.Join(parallel(statusWorkers, jobs)...)
}

// truncate cuts s to at most n bytes, ending in "..." when cut, at a rune
// boundary so that the result stays valid UTF-8.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n - 3
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}
