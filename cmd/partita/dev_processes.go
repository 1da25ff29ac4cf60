package main

import (
	"fmt"
	"os"

	"github.com/partita-dev/partita/internal/devcluster"
)

// devHostProcesses lists Partita's own processes that `partita dev up` runs on
// the host for the cluster, each with free loopback ports.
func devHostProcesses() ([]devcluster.HostProcess, error) {
	return nil, nil
}

// selfBinary is the path of the running partita binary.
func selfBinary() (string, error) {
	p, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("find the partita binary: %w", err)
	}
	return p, nil
}
