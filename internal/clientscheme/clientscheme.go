// Package clientscheme builds the runtime scheme every Partita client
// uses: client-go's built-in kinds and Partita's CRDs.
package clientscheme

import (
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// New returns a scheme with client-go's kinds and Partita's.
func New() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, fmt.Errorf("build scheme: %w", err)
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		return nil, fmt.Errorf("build scheme: %w", err)
	}
	return s, nil
}
