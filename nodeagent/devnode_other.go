//go:build !linux

package nodeagent

import (
	"errors"

	"github.com/containerd/nri/pkg/api"
)

// charDevice: device nodes are read on Linux only.
func charDevice(hostPath, _ string) (*api.LinuxDevice, error) {
	return nil, errors.New("device nodes are read on Linux only")
}
