package demo

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/devcluster"
)

// notYet is what a check returns while the cluster is not there yet;
// the message says what it saw.
type notYet struct{ seen string }

func (n notYet) Error() string { return n.seen }

// seen makes a check's "not yet" with what it saw.
func seen(format string, args ...any) error { return notYet{fmt.Sprintf(format, args...)} }

// waitFor polls check until it returns nil, for at most timeout. check
// returns a notYet error (seen) while it waits, or another error to give
// up at once. On timeout the error names what did not happen and what was
// last seen.
func waitFor(ctx context.Context, timeout time.Duration, what string, check func(context.Context) error) error {
	var last error
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		last = check(ctx)
		var ny notYet
		switch {
		case last == nil:
			return true, nil
		case errors.As(last, &ny):
			return false, nil
		case apierrors.IsNotFound(last) || apierrors.IsTimeout(last) || apierrors.IsServerTimeout(last) || apierrors.IsTooManyRequests(last):
			return false, nil // transient, or not created yet: keep polling
		}
		return false, last
	})
	if err == nil {
		return nil
	}
	if last != nil {
		return fmt.Errorf("%s did not happen within %s: last seen: %w", what, timeout, last)
	}
	return fmt.Errorf("%s did not happen within %s: %w", what, timeout, err)
}

// createPods creates the pods in order.
func (s *story) createPods(ctx context.Context, pods ...*corev1.Pod) error {
	for _, p := range pods {
		if _, err := s.cs.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create pod %s/%s: %w", p.Namespace, p.Name, err)
		}
	}
	return nil
}

// pods lists the pods of namespace with a role, by name.
func (s *story) pods(ctx context.Context, namespace, role string) ([]corev1.Pod, error) {
	list, err := s.cs.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: LabelRole + "=" + role})
	if err != nil {
		return nil, fmt.Errorf("list %s pods of %s: %w", role, namespace, err)
	}
	items := list.Items
	sort.Slice(items, func(i, j int) bool { return items[i].Name < items[j].Name })
	return items, nil
}

// waitBound waits until every pod named is bound to a node, and returns
// them. When it gives up it describes the pods that were not.
func (s *story) waitBound(ctx context.Context, namespace string, names []string) ([]corev1.Pod, error) {
	var got []corev1.Pod
	err := waitFor(ctx, waitTimeout, fmt.Sprintf("all %d pods bound to a node", len(names)), func(ctx context.Context) error {
		got = got[:0]
		var unbound []string
		for _, n := range names {
			p, err := s.cs.CoreV1().Pods(namespace).Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if p.Spec.NodeName == "" {
				unbound = append(unbound, n)
			}
			got = append(got, *p)
		}
		if len(unbound) > 0 {
			return seen("%d not bound: %s", len(unbound), strings.Join(unbound, ", "))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("%w\n%s", err, s.describe(ctx, namespace))
	}
	return got, nil
}

// waitCondition waits until the pod's partita.dev/Admitted condition has
// the reason and a message that contains want, and returns the message.
func (s *story) waitCondition(ctx context.Context, namespace, name, reason, want string) (string, error) {
	var msg string
	what := fmt.Sprintf("pod %s/%s waiting with reason %s (%q)", namespace, name, reason, want)
	err := waitFor(ctx, waitTimeout, what, func(ctx context.Context) error {
		p, err := s.cs.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		c := podCondition(p, v1alpha1.PodConditionAdmitted)
		switch {
		case p.Spec.NodeName != "":
			return fmt.Errorf("pod %s/%s was bound to %s instead", namespace, name, p.Spec.NodeName)
		case c == nil:
			return seen("no %s condition yet", v1alpha1.PodConditionAdmitted)
		case c.Status != corev1.ConditionFalse || c.Reason != reason || !strings.Contains(c.Message, want):
			return seen("condition %s=%s, %s: %s", c.Type, c.Status, c.Reason, c.Message)
		case !gated(p):
			return seen("the pod is no longer gated")
		}
		msg = c.Message
		return nil
	})
	return msg, err
}

// waitGone waits until get says NotFound.
func waitGone(ctx context.Context, what string, get func(context.Context) error) error {
	return waitFor(ctx, 2*waitTimeout, what+" deleted", func(ctx context.Context) error {
		err := get(ctx)
		switch {
		case apierrors.IsNotFound(err):
			return nil
		case err == nil:
			return seen("%s still exists", what)
		}
		return seen("%v", err)
	})
}

// waitQueueKnown waits until the webhook's policy knows queue q: it
// refuses pods that name a queue it has not seen yet, and it learns of
// queues in batches. A dry-run create asks it without creating anything.
func (s *story) waitQueueKnown(ctx context.Context, q string) error {
	probe := fractionPod(q, "queue-probe", roleNotebook, "0.25")
	return waitFor(ctx, waitTimeout, "the webhook knowing queue "+q, func(ctx context.Context) error {
		_, err := s.cs.CoreV1().Pods(q).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			return seen("%v", err)
		}
		return nil
	})
}

// getQueue reads a queue.
func (s *story) getQueue(ctx context.Context, name string) (*v1alpha1.Queue, error) {
	var q v1alpha1.Queue
	if err := s.cl.Get(ctx, client.ObjectKey{Name: name}, &q); err != nil {
		return nil, fmt.Errorf("get queue %s: %w", name, err)
	}
	return &q, nil
}

// describe summarises the demo's pods of a namespace for an error message.
func (s *story) describe(ctx context.Context, namespace string) string {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	return devcluster.DescribePods(dctx, s.cs, namespace, LabelRole)
}

// eventsOf lists the events of namespace with reason, oldest first.
func (s *story) eventsOf(ctx context.Context, namespace, reason string) ([]corev1.Event, error) {
	list, err := s.cs.CoreV1().Events(namespace).List(ctx, metav1.ListOptions{FieldSelector: "reason=" + reason})
	if err != nil {
		return nil, fmt.Errorf("list %s events of %s: %w", reason, namespace, err)
	}
	items := list.Items
	sort.SliceStable(items, func(i, j int) bool {
		if items[i].InvolvedObject.Name != items[j].InvolvedObject.Name {
			return items[i].InvolvedObject.Name < items[j].InvolvedObject.Name
		}
		return items[i].CreationTimestamp.Before(&items[j].CreationTimestamp)
	})
	return items, nil
}
