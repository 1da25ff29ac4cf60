package dra

import "fmt"

// Backend is how GPU pods are placed: by Partita's scheduler extender on the
// partita.dev/gpu-milli extended resource, or by kube-scheduler's own DRA
// plugin on the devices Partita's driver publishes.
type Backend string

// Backends (chart value gpuBackend, flag --gpu-backend).
const (
	// BackendExtender is the default: the webhook writes
	// partita.dev/gpu-milli and the device env, the extender chooses devices
	// at bind.
	BackendExtender Backend = "extender"
	// BackendDRA publishes each GPU as a device of DriverName; the webhook
	// writes ResourceClaims and kube-scheduler allocates them.
	BackendDRA Backend = "dra"
)

// ParseBackend reads a --gpu-backend value; empty is BackendExtender.
func ParseBackend(s string) (Backend, error) {
	switch Backend(s) {
	case "", BackendExtender:
		return BackendExtender, nil
	case BackendDRA:
		return BackendDRA, nil
	}
	return "", fmt.Errorf("GPU backend %q: want %s or %s", s, BackendExtender, BackendDRA)
}
