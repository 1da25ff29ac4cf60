package nodeagent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/partita-dev/partita/internal/durable"
)

// The agent's state directory (--state-dir, a hostPath in the chart) keeps
// what must outlive the agent's process on the node: the MPS control
// daemons it started (mpsStateFile) and the devices it found broken
// (healthStateFile). Only the agent and the MPS keeper mount it; pods never
// do.
const (
	// mpsStateFile records the MPS control daemons running for the node.
	mpsStateFile = "mps-daemons.json"
	// mpsTargetsFile is what the agent asks the MPS keeper to run
	// (--mps-daemons=keeper).
	mpsTargetsFile = "mps-targets.json"
	// mpsExclusiveFile records the devices the agent put in
	// EXCLUSIVE_PROCESS for their MPS daemons, so that a restarted agent
	// puts them back to DEFAULT when their daemons go.
	mpsExclusiveFile = "mps-exclusive.json"
	// healthStateFile records the devices the agent marked unhealthy.
	healthStateFile = "health.json"
)

// DefaultStateDir is the agent's state directory unless --state-dir says
// otherwise.
const DefaultStateDir = "/var/lib/partita/agent"

// readStateFile decodes the JSON file at path into v. It reports false,
// without error, when the file does not exist.
func readStateFile(path string, v any) (bool, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read %s: %w", path, err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return false, fmt.Errorf("read %s: %w", path, err)
	}
	return true, nil
}

// writeStateFile writes v as JSON to path atomically: to a temporary file
// in the same directory, synced, then renamed over path, so that a reader
// (or a restarted agent) sees the old content or the new, never half.
func writeStateFile(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s: %w", path, err)
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	return durable.WriteFile(path, append(b, '\n'), 0o600)
}

// bootIDPath names the current boot of the machine; the kernel makes a new
// one at every boot, and it is the host's inside containers too.
const bootIDPath = "/proc/sys/kernel/random/boot_id"

// currentBootID reads the machine's boot ID, "" when it cannot be read.
func currentBootID() string {
	b, err := os.ReadFile(bootIDPath)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
