package report

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/partita-dev/partita/api/v1alpha1"
	pt "github.com/partita-dev/partita/internal/partitatest"
)

func TestQueuesLoop(t *testing.T) {
	got := Queues(&Cluster{Queues: []v1alpha1.Queue{
		*pt.MakeQueue("a").Parent("b").Obj(), *pt.MakeQueue("b").Parent("a").Obj(),
	}})
	var names, notes []string
	for _, q := range got.Queues {
		names = append(names, q.Name)
		notes = append(notes, q.Note)
	}
	if diff := cmp.Diff([]string{"a", "b"}, names); diff != "" {
		t.Errorf("queues (-want,+got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"in a loop of parents", "in a loop of parents"}, notes); diff != "" {
		t.Errorf("notes (-want,+got):\n%s", diff)
	}
}
