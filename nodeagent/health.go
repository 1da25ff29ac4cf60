package nodeagent

import (
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// healthMark says why a device was marked unhealthy, and since when.
type healthMark struct {
	// Index is the device's index when it was marked, for people reading
	// the file.
	Index int32 `json:"index"`
	// Reason is the health reason published with the device.
	Reason string `json:"reason"`
	// Since is when the mark was made.
	Since time.Time `json:"since"`
}

// healthState is the content of health.json: the marks of one boot of the
// node, by device UUID.
type healthState struct {
	BootID string                `json:"bootID"`
	Marks  map[string]healthMark `json:"marks"`
}

// loadHealthMarks reads the marks saved in dir for the boot bootID. Marks
// saved under another boot are dropped (a reboot resets the GPUs); so is
// everything when bootID is unknown ("").
func loadHealthMarks(dir, bootID string) (map[string]healthMark, error) {
	var st healthState
	ok, err := readStateFile(filepath.Join(dir, healthStateFile), &st)
	if err != nil || !ok || bootID == "" || st.BootID != bootID {
		return map[string]healthMark{}, err
	}
	if st.Marks == nil {
		st.Marks = map[string]healthMark{}
	}
	return st.Marks, nil
}

// saveHealthMarks writes the marks of the boot bootID to dir.
func saveHealthMarks(dir, bootID string, marks map[string]healthMark) error {
	return writeStateFile(filepath.Join(dir, healthStateFile), healthState{BootID: bootID, Marks: maps.Clone(marks)})
}

// HealthResetter is a Backend that keeps a device unhealthy after a fault
// until told the device was repaired (NVML: critical XIDs and lost GPUs,
// which need a GPU reset). The agent calls it for the GPUNode annotation
// partita.dev/reset-health.
type HealthResetter interface {
	// ResetHealth forgets the faults of the devices sel selects and
	// returns the UUIDs it cleared, sorted.
	ResetHealth(sel DeviceSelector) ([]string, error)
}

// DeviceSelector selects devices by UUID or index, or all of them.
type DeviceSelector struct {
	// All selects every device.
	All bool
	// UUIDs and Indexes select devices by UUID and by index.
	UUIDs   []string
	Indexes []int32
}

// Selects reports whether the selector names the device.
func (s DeviceSelector) Selects(index int32, uuid string) bool {
	return s.All || slices.Contains(s.Indexes, index) || (uuid != "" && slices.Contains(s.UUIDs, uuid))
}

// ParseDeviceSelector reads the value of partita.dev/reset-health: "all",
// or a comma-separated list of device indexes and UUIDs ("0,3" or
// "GPU-8c1f...,2").
func ParseDeviceSelector(s string) (DeviceSelector, error) {
	var sel DeviceSelector
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		switch {
		case part == "":
			continue
		case strings.EqualFold(part, "all"):
			sel.All = true
		case strings.HasPrefix(part, "GPU-") || strings.HasPrefix(part, "MIG-"):
			sel.UUIDs = append(sel.UUIDs, part)
		default:
			n, err := strconv.ParseInt(part, 10, 32)
			if err != nil || n < 0 {
				return DeviceSelector{}, fmt.Errorf("parse %s %q: %q is neither a device index, a GPU-... UUID nor \"all\"", v1alpha1.AnnotationResetHealth, s, part)
			}
			sel.Indexes = append(sel.Indexes, int32(n))
		}
	}
	if !sel.All && len(sel.UUIDs) == 0 && len(sel.Indexes) == 0 {
		return DeviceSelector{}, fmt.Errorf("parse %s %q: name devices by index or UUID, comma-separated, or \"all\"", v1alpha1.AnnotationResetHealth, s)
	}
	return sel, nil
}
