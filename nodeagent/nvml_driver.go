//go:build cgo

package nodeagent

import (
	"context"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

var _ DriverReader = (*NVML)(nil)

// DriverInfo reads the driver version and each open device's PCI address
// and minor number.
func (b *NVML) DriverInfo(ctx context.Context) (DriverInfo, error) {
	b.lock.Lock()
	defer b.lock.Unlock()
	if err := b.ensureInit(ctx); err != nil {
		return DriverInfo{}, err
	}
	version, ret := b.lib.SystemGetDriverVersion()
	if ret != nvml.SUCCESS {
		b.cfg.OnError("SystemGetDriverVersion")
		return DriverInfo{}, fmt.Errorf("read driver version: %w", ret)
	}
	out := DriverInfo{Version: version, Devices: map[string]DeviceAddress{}}
	for _, d := range b.devices {
		if !d.open {
			continue
		}
		addr := DeviceAddress{Minor: -1}
		if pci, ret := d.handle.GetPciInfo(); ret == nvml.SUCCESS {
			addr.BusID = busIDString(pci.BusId)
		} else {
			b.cfg.OnError("GetPciInfo")
		}
		if minor, ret := d.handle.GetMinorNumber(); ret == nvml.SUCCESS {
			addr.Minor = int32(minor)
		} else {
			b.cfg.OnError("GetMinorNumber")
		}
		out.Devices[d.info.UUID] = addr
	}
	return out, nil
}
