package devcluster

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
)

// WaitJobComplete waits until the Job has completed. When the Job fails or the
// timeout passes, the error describes what was seen: the Job's conditions,
// its pods' phases and nodes, and the recent events of those pods.
func WaitJobComplete(ctx context.Context, cs kubernetes.Interface, namespace, name string, timeout time.Duration) (*batchv1.Job, error) {
	var job *batchv1.Job
	var failed string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		j, err := cs.BatchV1().Jobs(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil //nolint:nilerr // transient: keep polling until the timeout
		}
		job = j
		for _, c := range j.Status.Conditions {
			if c.Status != corev1.ConditionTrue {
				continue
			}
			switch c.Type {
			case batchv1.JobComplete:
				return true, nil
			case batchv1.JobFailed:
				failed = c.Reason + ": " + c.Message
				return true, nil
			}
		}
		return false, nil
	})
	if err == nil && failed == "" {
		return job, nil
	}
	// Describe with a fresh context: the caller's may be the one that expired.
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	what := "did not complete within " + timeout.String()
	if failed != "" {
		what = "failed (" + failed + ")"
	}
	return job, fmt.Errorf("job %s/%s %s\n%s", namespace, name, what, DescribePods(dctx, cs, namespace, "job-name="+name))
}

// DescribePods summarises the pods matching selector for a person reading a
// failed test or demo: phase, node, waiting reasons and recent events.
func DescribePods(ctx context.Context, cs kubernetes.Interface, namespace, selector string) string {
	pods, err := cs.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return "  (could not list pods: " + err.Error() + ")"
	}
	if len(pods.Items) == 0 {
		return "  no pods match " + selector + " (is kube-controller-manager running?)"
	}
	var b strings.Builder
	for _, p := range pods.Items {
		node := p.Spec.NodeName
		if node == "" {
			node = "<not scheduled>"
		}
		fmt.Fprintf(&b, "  pod %s: phase %s, node %s", p.Name, p.Status.Phase, node)
		for _, c := range p.Status.Conditions {
			if c.Status != corev1.ConditionTrue && c.Reason != "" {
				fmt.Fprintf(&b, ", %s=%s (%s: %s)", c.Type, c.Status, c.Reason, c.Message)
			}
		}
		if len(p.Spec.SchedulingGates) > 0 {
			gates := make([]string, 0, len(p.Spec.SchedulingGates))
			for _, g := range p.Spec.SchedulingGates {
				gates = append(gates, g.Name)
			}
			fmt.Fprintf(&b, ", gated by %s", strings.Join(gates, ","))
		}
		b.WriteString("\n")
		for _, e := range PodEvents(ctx, cs, &p, 5) {
			fmt.Fprintf(&b, "    event %s %s: %s\n", e.Type, e.Reason, e.Message)
		}
	}
	return strings.TrimRight(b.String(), "\n")
}

// PodEvents returns the last n events about a pod, oldest first.
func PodEvents(ctx context.Context, cs kubernetes.Interface, pod *corev1.Pod, n int) []corev1.Event {
	evs, err := cs.CoreV1().Events(pod.Namespace).List(ctx, metav1.ListOptions{
		FieldSelector: "involvedObject.kind=Pod,involvedObject.name=" + pod.Name,
	})
	if err != nil {
		return nil
	}
	items := evs.Items
	sort.Slice(items, func(i, j int) bool { return eventTime(&items[i]).Before(eventTime(&items[j])) })
	if len(items) > n {
		items = items[len(items)-n:]
	}
	return items
}

func eventTime(e *corev1.Event) time.Time {
	if !e.LastTimestamp.IsZero() {
		return e.LastTimestamp.Time
	}
	if !e.EventTime.IsZero() {
		return e.EventTime.Time
	}
	return e.CreationTimestamp.Time
}
