package admission

import (
	"hash/fnv"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// podCondition is a condition to write on a pod.
type podCondition struct {
	pod  *corev1.Pod
	cond corev1.PodCondition
	// annotations, when set, are written on the pod first.
	annotations map[string]string
}

// conditionQueue holds, for one writer, the latest condition still to be
// written for each pod, oldest pod first. A pod always goes to the same
// writer (conditionQueueFor), so its writes never overtake each other, and
// a newer condition replaces one not written yet: a burst of changes costs
// one write per pod, and the last word is the one that stays.
type conditionQueue struct {
	lock    sync.Mutex
	pending map[types.UID]podCondition
	order   []types.UID
	// wake is signalled (without blocking) when a condition is put.
	wake chan struct{}
}

func newConditionQueue() *conditionQueue {
	return &conditionQueue{pending: map[types.UID]podCondition{}, wake: make(chan struct{}, 1)}
}

// put queues c, replacing a condition of the same pod not written yet.
func (q *conditionQueue) put(c podCondition) {
	q.lock.Lock()
	if _, ok := q.pending[c.pod.UID]; !ok {
		q.order = append(q.order, c.pod.UID)
	}
	q.pending[c.pod.UID] = c
	q.lock.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// take returns the oldest pod's latest condition, false when none waits.
func (q *conditionQueue) take() (podCondition, bool) {
	q.lock.Lock()
	defer q.lock.Unlock()
	if len(q.order) == 0 {
		return podCondition{}, false
	}
	uid := q.order[0]
	q.order = q.order[1:]
	c := q.pending[uid]
	delete(q.pending, uid)
	return c, true
}

// conditionQueueFor picks the writer of a pod.
func conditionQueueFor(queues []*conditionQueue, uid types.UID) *conditionQueue {
	h := fnv.New32a()
	_, _ = h.Write([]byte(uid))
	return queues[h.Sum32()%uint32(len(queues))]
}
