package extender

import (
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
)

// ReleasedPods are the pods the admission loop released, as the API server
// returned them from the release, until bind takes them. kube-scheduler
// binds a pod as soon as its own informer shows it ungated, usually before
// the extender's informer does; bind then read the pod from the API server
// (0.5–0.7 reads a GPU pod in the throughput benchmark). The release's
// answer is the pod at that write, as fresh as an informer's copy can be.
type ReleasedPods struct {
	clock clock.PassiveClock
	// ttl bounds how long a pod that is never bound (deleted, or bound by
	// another scheduler) stays.
	ttl time.Duration

	lock  sync.Mutex
	pods  map[types.NamespacedName]releasedPod
	swept time.Time
}

type releasedPod struct {
	pod *corev1.Pod
	at  time.Time
}

// NewReleasedPods keeps each released pod for at most ttl.
func NewReleasedPods(clk clock.PassiveClock, ttl time.Duration) *ReleasedPods {
	return &ReleasedPods{clock: clk, ttl: ttl, pods: map[types.NamespacedName]releasedPod{}, swept: clk.Now()}
}

// Put keeps pod, which the caller no longer changes.
func (r *ReleasedPods) Put(pod *corev1.Pod) {
	if r == nil {
		return
	}
	now := r.clock.Now()
	r.lock.Lock()
	defer r.lock.Unlock()
	if now.Sub(r.swept) >= r.ttl {
		for k, p := range r.pods {
			if now.Sub(p.at) >= r.ttl {
				delete(r.pods, k)
			}
		}
		r.swept = now
	}
	r.pods[types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}] = releasedPod{pod: pod, at: now}
}

// Take returns and forgets the released pod key with uid (any UID when
// uid is empty); nil when there is none, or it is older than the TTL.
func (r *ReleasedPods) Take(key types.NamespacedName, uid types.UID) *corev1.Pod {
	if r == nil {
		return nil
	}
	r.lock.Lock()
	defer r.lock.Unlock()
	p, ok := r.pods[key]
	if !ok {
		return nil
	}
	delete(r.pods, key)
	if (uid != "" && p.pod.UID != uid) || r.clock.Since(p.at) >= r.ttl {
		return nil
	}
	return p.pod
}

// Forget drops the released pod key, which bind read from its informer.
func (r *ReleasedPods) Forget(key types.NamespacedName) {
	if r == nil {
		return
	}
	r.lock.Lock()
	defer r.lock.Unlock()
	delete(r.pods, key)
}
