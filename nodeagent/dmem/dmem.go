// Package dmem reads the kernel's dmem cgroup controller (cgroup v2, Linux
// 6.14 and later): which device-memory regions the GPU driver registered,
// which GPU each one belongs to, and the dmem.max a slice's container gets,
// so that the kernel, not a library in the container, caps the slice's
// device memory (docs/agent.md, "Kernel memory limits (dmem)").
//
// A region's name is the driver's: the DRM core registers
// "drm/<PCI address>/<region>" ("drm/0000:3b:00.0/vram0"); NVIDIA's kernel
// module registers its own names through os_dmem_cgroup_register_region.
// Both carry the device's PCI address, so regions are matched to GPUs by
// the bus ID NVML reports, never by position.
package dmem

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// CapacityFile is the root cgroup's list of regions and their sizes.
const CapacityFile = "dmem.capacity"

// MaxFile is a cgroup's limit per region, "<region> <bytes>" a line.
const MaxFile = "dmem.max"

// MinDriverMajor is the first NVIDIA driver branch that registers its
// device memory with the dmem controller (r615).
const MinDriverMajor = 615

// Region is one device-memory region the kernel accounts.
type Region struct {
	// Name is the region as dmem files name it.
	Name string
	// Bytes is its size.
	Bytes int64
}

// ParseCapacity reads a dmem.capacity file: one "<region> <bytes>" line a
// region. Blank lines are skipped; anything else that does not read is an
// error, so a format change is reported rather than half understood.
func ParseCapacity(data []byte) ([]Region, error) {
	var out []Region
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 2 {
			return nil, fmt.Errorf("parse %s line %d: want \"<region> <bytes>\", got %q", CapacityFile, n, line)
		}
		size, err := strconv.ParseInt(fields[1], 10, 64)
		if err != nil || size < 0 {
			return nil, fmt.Errorf("parse %s line %d: size %q is not a byte count", CapacityFile, n, fields[1])
		}
		out = append(out, Region{Name: fields[0], Bytes: size})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("parse %s: %w", CapacityFile, err)
	}
	return out, nil
}

// NormalizeBusID turns a PCI address into the kernel's form: lower case
// with a four-digit domain. NVML writes "00000000:3B:00.0", sysfs and DRM
// "0000:3b:00.0".
func NormalizeBusID(id string) string {
	id = strings.ToLower(strings.TrimSpace(id))
	domain, rest, ok := strings.Cut(id, ":")
	if !ok || strings.Count(rest, ":") != 1 {
		return id
	}
	if len(domain) > 4 {
		domain = domain[len(domain)-4:]
	}
	return domain + ":" + rest
}

// RegionFor picks the region of the device at busID: a region whose name
// holds the address as a whole path element, preferring a "vram" region
// (the device's own memory, not a window on system memory) and then the
// largest. ok is false when the driver registered none for it.
func RegionFor(regions []Region, busID string) (Region, bool) {
	bus := NormalizeBusID(busID)
	if bus == "" {
		return Region{}, false
	}
	var best Region
	found := false
	for _, r := range regions {
		if !slices.Contains(strings.Split(strings.ToLower(r.Name), "/"), bus) {
			continue
		}
		if !found || better(r, best) {
			best, found = r, true
		}
	}
	return best, found
}

func better(a, b Region) bool {
	av, bv := isVRAM(a.Name), isVRAM(b.Name)
	if av != bv {
		return av
	}
	if a.Bytes != b.Bytes {
		return a.Bytes > b.Bytes
	}
	return a.Name < b.Name
}

func isVRAM(name string) bool {
	return strings.HasPrefix(filepath.Base(strings.ToLower(name)), "vram")
}

// Limit is one region's cap for one container.
type Limit struct {
	Region string
	Bytes  int64
}

// MaxValue is the dmem.max value that caps each region, one
// "<region> <bytes>" line each, sorted so that the value is stable.
func MaxValue(limits []Limit) string {
	lines := make([]string, 0, len(limits))
	for _, l := range limits {
		lines = append(lines, l.Region+" "+strconv.FormatInt(l.Bytes, 10))
	}
	slices.Sort(lines)
	return strings.Join(slices.Compact(lines), "\n")
}

// DriverMajor reads the branch of an NVIDIA driver version ("615.12" is
// 615); ok is false for a version it cannot read.
func DriverMajor(version string) (int, bool) {
	major, _, _ := strings.Cut(strings.TrimSpace(version), ".")
	n, err := strconv.Atoi(major)
	return n, err == nil && n > 0
}

// Device is one GPU as Detect sees it.
type Device struct {
	UUID  string
	BusID string
}

// Support is what Detect found on a node.
type Support struct {
	// Available is set when every device has a region the kernel caps.
	Available bool
	// Reason says why not, or which regions were found, for a person.
	Reason string
	// Regions are the devices' regions by UUID.
	Regions map[string]string
}

// ErrNoController says the kernel has no dmem controller at the cgroup root.
var ErrNoController = errors.New("no dmem cgroup controller")

// ReadCapacity reads <cgroupRoot>/dmem.capacity; it wraps ErrNoController
// when the file is missing (cgroup v1, or a kernel before 6.14).
func ReadCapacity(cgroupRoot string) ([]byte, error) {
	data, err := os.ReadFile(filepath.Join(cgroupRoot, CapacityFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("read %s: %w", filepath.Join(cgroupRoot, CapacityFile), ErrNoController)
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", CapacityFile, err)
	}
	return data, nil
}

// Detect decides whether the node can cap slices in the kernel: the
// capacity file (capErr is ReadCapacity's error) must list a region for
// every device, and the driver must be one that charges allocations to them.
func Detect(capacity []byte, capErr error, driverVersion string, devices []Device) Support {
	switch {
	case errors.Is(capErr, ErrNoController):
		return Support{Reason: "the kernel has no dmem cgroup controller (needs cgroup v2 and Linux 6.14 or later)"}
	case capErr != nil:
		return Support{Reason: capErr.Error()}
	case len(devices) == 0:
		return Support{Reason: "no GPUs"}
	}
	if major, ok := DriverMajor(driverVersion); !ok {
		return Support{Reason: fmt.Sprintf("unknown NVIDIA driver version %q (needs r%d or later)", driverVersion, MinDriverMajor)}
	} else if major < MinDriverMajor {
		return Support{Reason: fmt.Sprintf("NVIDIA driver %s does not register GPU memory with dmem (needs r%d or later)", driverVersion, MinDriverMajor)}
	}
	regions, err := ParseCapacity(capacity)
	if err != nil {
		return Support{Reason: err.Error()}
	}
	out := Support{Regions: map[string]string{}}
	var missing []string
	for _, d := range devices {
		r, ok := RegionFor(regions, d.BusID)
		if !ok {
			missing = append(missing, d.UUID)
			continue
		}
		out.Regions[d.UUID] = r.Name
	}
	if len(missing) > 0 {
		return Support{Reason: fmt.Sprintf("%s lists no region for %s", CapacityFile, strings.Join(missing, ", "))}
	}
	out.Available = true
	out.Reason = fmt.Sprintf("%d of %d devices have a dmem region", len(out.Regions), len(devices))
	return out
}
