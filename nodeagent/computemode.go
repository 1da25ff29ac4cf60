package nodeagent

import (
	"context"
	"fmt"
)

// ComputeMode is a device's compute mode, as nvidia-smi -c sets it.
type ComputeMode string

// Compute modes.
const (
	// ComputeModeDefault lets any number of processes create contexts.
	ComputeModeDefault ComputeMode = "Default"
	// ComputeModeExclusiveProcess lets one process hold a context: with an
	// MPS daemon, its server, so that a process that skips MPS cannot use
	// the device beside it.
	ComputeModeExclusiveProcess ComputeMode = "ExclusiveProcess"
	// ComputeModeProhibited lets no process create a context.
	ComputeModeProhibited ComputeMode = "Prohibited"
)

// ComputeModeSetter is a Backend that reads and sets its devices' compute
// mode (NVML, which needs root). mps mode puts each device with a daemon in
// EXCLUSIVE_PROCESS and puts it back to DEFAULT when the daemon goes.
type ComputeModeSetter interface {
	// ComputeMode returns the compute mode of the device at index.
	ComputeMode(ctx context.Context, index int32) (ComputeMode, error)
	// SetComputeMode sets the compute mode of the device at index.
	SetComputeMode(ctx context.Context, index int32, mode ComputeMode) error
}

var _ ComputeModeSetter = (*Simulated)(nil)

// ComputeMode returns a simulated device's compute mode: Default until set.
func (s *Simulated) ComputeMode(_ context.Context, index int32) (ComputeMode, error) {
	if index < 0 || int(index) >= s.spec.Count {
		return "", fmt.Errorf("read compute mode of simulated device %d: no such device", index)
	}
	s.lock.Lock()
	defer s.lock.Unlock()
	if m, ok := s.computeModes[index]; ok {
		return m, nil
	}
	return ComputeModeDefault, nil
}

// SetComputeMode sets a simulated device's compute mode.
func (s *Simulated) SetComputeMode(_ context.Context, index int32, mode ComputeMode) error {
	if index < 0 || int(index) >= s.spec.Count {
		return fmt.Errorf("set compute mode of simulated device %d: no such device", index)
	}
	s.lock.Lock()
	defer s.lock.Unlock()
	if s.computeModes == nil {
		s.computeModes = map[int32]ComputeMode{}
	}
	s.computeModes[index] = mode
	return nil
}
