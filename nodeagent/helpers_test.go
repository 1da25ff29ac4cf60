package nodeagent

import (
	"context"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/partita-dev/partita/api/v1alpha1"
	pt "github.com/partita-dev/partita/internal/partitatest"
)

// refMiB is the reference device memory pods are canonicalised with.
const refMiB = 81559

// heldPod returns a running pod bound to node that holds the given devices
// of a simulated node (see partitatest.Held).
func heldPod(name, node, amount string, devices ...int) *corev1.Pod {
	uuids := make([]string, 0, len(devices))
	for _, d := range devices {
		uuids = append(uuids, SimulatedUUID(node, d))
	}
	return pt.Held(name, node, amount, refMiB, uuids...)
}

// withUID sets a pod's UID.
func withUID(p *corev1.Pod, uid string) *corev1.Pod {
	p.UID = types.UID(uid)
	return p
}

// heldOn reads the allocations of pods on a simulated node of spec.
func heldOn(node string, spec SimSpec, pods ...*corev1.Pod) []boundPod {
	held, bad := allocationsOn(NewSimulated(node, spec).inventory(), pods)
	if len(bad) > 0 {
		panic(fmt.Sprint(bad))
	}
	return held
}

// h100 is the spec of a simulated node with n H100s.
func h100(n int) SimSpec {
	s, _ := ParseSimSpec(fmt.Sprintf("%dxH100-80GB", n))
	return s
}

// recorder records events as "<type> <reason> <ns>/<name>: <note>".
type recorder struct {
	lock   sync.Mutex
	events []string
}

func (r *recorder) Eventf(regarding runtime.Object, _ runtime.Object, eventtype, reason, _, note string, args ...any) {
	r.lock.Lock()
	defer r.lock.Unlock()
	o := regarding.(metav1.Object)
	r.events = append(r.events, fmt.Sprintf("%s %s %s/%s: %s", eventtype, reason, o.GetNamespace(), o.GetName(), fmt.Sprintf(note, args...)))
}

func (r *recorder) take() []string {
	r.lock.Lock()
	defer r.lock.Unlock()
	out := r.events
	r.events = nil
	return out
}

// killer records the PIDs it is asked to end and fails for those in fail.
type killer struct {
	killed []int32
	fail   map[int32]bool
}

func (k *killer) Kill(_ context.Context, p Process) error {
	pid := p.PID
	if k.fail[pid] {
		return fmt.Errorf("kill process %d: %w", pid, ErrProcessNotFound)
	}
	k.killed = append(k.killed, pid)
	return nil
}

// devicesOf is the inventory part of a snapshot.
func devicesOf(s *Snapshot) []v1alpha1.GPUDevice {
	out := make([]v1alpha1.GPUDevice, len(s.Devices))
	for i, d := range s.Devices {
		out[i] = d.GPUDevice
	}
	return out
}
