package policy

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/internal/partitatest"
)

// TestFreshDenials: a Queue the informer has not delivered yet (applied in
// one file with the PodGroup or pods naming it) does not get them refused,
// while a queue that exists nowhere still does, and denials share live reads.
func TestFreshDenials(t *testing.T) {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}}
	// cache is the informers' view: it has not seen the queue yet.
	cache := newFakeClient(t, interceptor.Funcs{}, ns)
	var liveLists atomic.Int32
	live := newFakeClient(t, interceptor.Funcs{
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			if _, ok := list.(*v1alpha1.QueueList); ok {
				liveLists.Add(1)
			}
			return c.List(ctx, list, opts...)
		},
	}, ns, partitatest.MakeQueue("team-a").Namespaces("team-a").Obj())
	e := newTestEngine(t)
	// A batch interval far longer than the test: only a read through can
	// bring the queue in.
	s := NewStateSync(cache, e, WithBatchInterval(time.Hour), WithSyncClock(clockReal()), WithLiveReader(live, time.Millisecond))
	if err := s.Sync(t.Context()); err != nil {
		t.Fatal(err)
	}
	stale, err := e.Admission(t.Context(), input("team-a", "team-a", 500))
	if err != nil {
		t.Fatal(err)
	}
	if len(stale.Deny) == 0 {
		t.Fatal("the engine on the stale state allowed a queue it has not seen; the test proves nothing")
	}
	f := NewFreshDenials(e, s, clockReal())

	tests := []struct {
		name      string
		decide    func() (*AdmissionDecision, error)
		wantDeny  bool
		wantLists int32
	}{
		{
			name:      "a pod naming a queue created a moment ago is allowed",
			decide:    func() (*AdmissionDecision, error) { return f.Admission(t.Context(), input("team-a", "team-a", 500)) },
			wantLists: 1,
		},
		{
			name: "a PodGroup naming it too, with no new live read",
			decide: func() (*AdmissionDecision, error) {
				return f.PodGroupAdmission(t.Context(), &PodGroupAdmissionInput{Operation: "CREATE", Namespace: "team-a", PodGroup: PodGroupInfo{Name: "train", Queue: "team-a"}})
			},
			wantLists: 1,
		},
		{
			name:      "a queue that exists nowhere is refused after one more live read",
			decide:    func() (*AdmissionDecision, error) { return f.Admission(t.Context(), input("team-a", "nope", 500)) },
			wantDeny:  true,
			wantLists: 2,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, err := tc.decide()
			if err != nil {
				t.Fatal(err)
			}
			if got := len(d.Deny) > 0; got != tc.wantDeny {
				t.Errorf("denied %v (%q), want %v", got, d.Deny, tc.wantDeny)
			}
			if diff := cmp.Diff(tc.wantLists, liveLists.Load()); diff != "" {
				t.Errorf("live lists of queues (-want +got):\n%s", diff)
			}
		})
	}

	// Denials that arrived before a live read started share it.
	before := time.Now().Add(-time.Second)
	if err := s.ReadThrough(t.Context(), before); err != nil {
		t.Fatal(err)
	}
	if got := liveLists.Load(); got != 2 {
		t.Errorf("a denial older than the last live read read again: %d lists, want 2", got)
	}
}
