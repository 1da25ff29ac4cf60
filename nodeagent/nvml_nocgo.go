//go:build !cgo

package nodeagent

import (
	"context"
	"errors"
)

// NVML is the NVML backend. This binary was built without cgo, which the
// NVML bindings need, so it always reports the backend unavailable.
type NVML struct{}

// NewNVML returns the NVML backend.
func NewNVML(NVMLConfig) *NVML { return &NVML{} }

// Snapshot reports that NVML is not available in this build.
func (b *NVML) Snapshot(context.Context) (*Snapshot, error) {
	return nil, &UnavailableError{Backend: "nvml", Err: errors.New("built without cgo"), Hint: "build partita with CGO_ENABLED=1"}
}

// Close does nothing.
func (b *NVML) Close() {}

// DriverInfo reports that NVML is not available in this build.
func (b *NVML) DriverInfo(context.Context) (DriverInfo, error) {
	return DriverInfo{}, &UnavailableError{Backend: "nvml", Err: errors.New("built without cgo"), Hint: "build partita with CGO_ENABLED=1"}
}

// ComputeMode reports that NVML is not available in this build.
func (b *NVML) ComputeMode(context.Context, int32) (ComputeMode, error) {
	return "", errors.New("read compute mode: built without cgo")
}

// SetComputeMode reports that NVML is not available in this build.
func (b *NVML) SetComputeMode(context.Context, int32, ComputeMode) error {
	return errors.New("set compute mode: built without cgo")
}
