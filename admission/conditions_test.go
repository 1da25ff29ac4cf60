package admission

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/partita-dev/partita/internal/partitatest"
)

func TestConditionQueueKeepsTheLatestPerPodInOrder(t *testing.T) {
	q := newConditionQueue()
	put := func(pod, reason string) {
		q.put(podCondition{pod: partitatest.MakePod(pod, "ns").Obj(), cond: corev1.PodCondition{Reason: reason}})
	}
	put("a", "WaitingForCapacity")
	put("b", "WaitingForQuota")
	put("a", "Admitted") // replaces a's first, keeps a's place
	var got []string
	for {
		c, ok := q.take()
		if !ok {
			break
		}
		got = append(got, c.pod.Name+" "+c.cond.Reason)
	}
	if diff := cmp.Diff([]string{"a Admitted", "b WaitingForQuota"}, got); diff != "" {
		t.Errorf("written (-want +got):\n%s", diff)
	}
	queues := []*conditionQueue{newConditionQueue(), newConditionQueue(), newConditionQueue()}
	pod := partitatest.MakePod("p", "ns").Obj()
	first := conditionQueueFor(queues, pod.UID)
	for range 3 {
		if conditionQueueFor(queues, pod.UID) != first {
			t.Fatal("one pod went to two writers: its writes could overtake each other")
		}
	}
}
