// Package locate answers where a pod's models already are: for each node,
// the share of the bytes of the pod's Models it holds (Ready counts whole,
// Fetching by its bytes so far), read from the Models' status that the
// nodes' caches write. The extender's prioritize and the admission loop's
// placement prefer those nodes.
package locate

import (
	"context"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// Locator reads Models through reader (an informer cache).
type Locator struct {
	reader client.Reader
}

// New returns a Locator over reader.
func New(reader client.Reader) *Locator { return &Locator{reader: reader} }

// Held maps each node that holds some of the models (of namespace) to the
// share of their bytes it holds, from 0 to 1. Models that do not exist, or
// that no node holds, count as held nowhere.
func (l *Locator) Held(ctx context.Context, namespace string, models []string) map[string]float64 {
	if l == nil || len(models) == 0 {
		return nil
	}
	held := map[string]float64{}
	var total float64
	for _, name := range models {
		m := &v1alpha1.Model{}
		if err := l.reader.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, m); err != nil {
			total++
			continue
		}
		size := max(m.Status.Size, 1)
		total += float64(size)
		for _, n := range m.Status.Nodes {
			var have float64
			switch n.Phase {
			case v1alpha1.ModelReady:
				have = 1
			case v1alpha1.ModelFetching:
				if n.Total > 0 {
					have = min(float64(n.Bytes)/float64(n.Total), 1)
				}
			}
			if have > 0 {
				held[n.Name] += have * float64(size)
			}
		}
	}
	for node, b := range held {
		held[node] = min(b/total, 1)
	}
	return held
}
