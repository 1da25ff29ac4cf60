package main

import (
	"fmt"
	"net"
	"os"

	"github.com/partita-dev/partita/internal/devcluster"
)

// devHostProcesses lists Partita's own processes that `partita dev up` runs on
// the host for the cluster, each with free loopback ports.
func devHostProcesses() ([]devcluster.HostProcess, error) {
	return nil, nil
}

// freeLoopbackPort asks the kernel for a free port on 127.0.0.1.
func freeLoopbackPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// selfBinary is the path of the running partita binary.
func selfBinary() (string, error) {
	p, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("find the partita binary: %w", err)
	}
	return p, nil
}
