//go:build cgo

package nodeagent

import (
	"context"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

var _ ComputeModeSetter = (*NVML)(nil)

// device returns the open device at index. Callers hold lock.
func (b *NVML) device(ctx context.Context, index int32) (nvmlDevice, error) {
	if err := b.ensureInit(ctx); err != nil {
		return nvmlDevice{}, err
	}
	for _, d := range b.devices {
		if d.info.Index == index {
			if !d.open {
				return nvmlDevice{}, fmt.Errorf("device %d is not open: %s", index, d.info.HealthReason)
			}
			return d, nil
		}
	}
	return nvmlDevice{}, fmt.Errorf("no device %d", index)
}

// ComputeMode reads the device's compute mode.
func (b *NVML) ComputeMode(ctx context.Context, index int32) (ComputeMode, error) {
	b.lock.Lock()
	defer b.lock.Unlock()
	d, err := b.device(ctx, index)
	if err != nil {
		return "", fmt.Errorf("read compute mode: %w", err)
	}
	m, ret := d.handle.GetComputeMode()
	if ret != nvml.SUCCESS {
		b.cfg.OnError("GetComputeMode")
		return "", fmt.Errorf("read compute mode of device %d: %w", index, ret)
	}
	switch m {
	case nvml.COMPUTEMODE_DEFAULT:
		return ComputeModeDefault, nil
	case nvml.COMPUTEMODE_EXCLUSIVE_PROCESS:
		return ComputeModeExclusiveProcess, nil
	case nvml.COMPUTEMODE_PROHIBITED:
		return ComputeModeProhibited, nil
	}
	return ComputeMode(fmt.Sprintf("Unknown(%d)", m)), nil
}

// SetComputeMode sets the device's compute mode; NVML needs root for it.
func (b *NVML) SetComputeMode(ctx context.Context, index int32, mode ComputeMode) error {
	var m nvml.ComputeMode
	switch mode {
	case ComputeModeDefault:
		m = nvml.COMPUTEMODE_DEFAULT
	case ComputeModeExclusiveProcess:
		m = nvml.COMPUTEMODE_EXCLUSIVE_PROCESS
	case ComputeModeProhibited:
		m = nvml.COMPUTEMODE_PROHIBITED
	default:
		return fmt.Errorf("set compute mode of device %d: unknown mode %q", index, mode)
	}
	b.lock.Lock()
	defer b.lock.Unlock()
	d, err := b.device(ctx, index)
	if err != nil {
		return fmt.Errorf("set compute mode: %w", err)
	}
	if ret := d.handle.SetComputeMode(m); ret != nvml.SUCCESS {
		b.cfg.OnError("SetComputeMode")
		hint := ""
		if ret == nvml.ERROR_NO_PERMISSION {
			hint = " (NVML needs root; the driver may also want CAP_SYS_ADMIN, which the chart does not grant: docs/guide/isolation.md)"
		}
		return fmt.Errorf("set compute mode of device %d to %s: %w%s", index, mode, ret, hint)
	}
	return nil
}
