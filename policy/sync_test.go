package policy

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/internal/partitatest"
)

func clockReal() clock.Clock { return clock.RealClock{} }

// TestStateSync: the state follows the cluster, and the policy's decisions
// with it.
func TestStateSync(t *testing.T) {
	cl := newFakeClient(t, interceptor.Funcs{},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}},
		partitatest.MakeQueue("team-a").Namespaces("team-a").GPU("1", "2", 1).Obj())
	e, err := NewEngine(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	s := NewStateSync(cl, e, WithBatchInterval(time.Millisecond), WithSyncClock(clockReal()))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() { _ = s.Start(ctx) }()
	waitFor(t, s.Synced)
	decide := func() []string {
		d, err := e.Admission(ctx, input("team-a", "team-a", 3000))
		if err != nil {
			t.Fatal(err)
		}
		return d.Deny
	}
	if len(decide()) != 1 {
		t.Fatalf("3 GPUs over a limit of 2 were allowed")
	}
	var q v1alpha1.Queue
	if err := cl.Get(ctx, client.ObjectKey{Name: "team-a"}, &q); err != nil {
		t.Fatal(err)
	}
	q.Spec.Resources.GPU = partitatest.MakeQueue("x").GPU("1", "4", 1).Obj().Spec.Resources.GPU
	if err := cl.Update(ctx, &q); err != nil {
		t.Fatal(err)
	}
	s.Trigger()
	waitFor(t, func() bool { return len(decide()) == 0 })
}
