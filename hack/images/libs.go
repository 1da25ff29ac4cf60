package main

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"os/exec"
	"strings"
)

// sharedLibraries returns what a dynamically linked binary loads at start
// (its ELF interpreter and the libraries ldd resolves), as absolute paths
// on this host; nothing for a static binary. partita links glibc because
// go-nvml reaches NVML through cgo, so its image carries the host's glibc
// at the same paths, as the Dockerfile's distroless cc base does.
func sharedLibraries(binary string) ([]string, error) {
	f, err := elf.Open(binary)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", binary, err)
	}
	interp := ""
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b := make([]byte, p.Filesz)
			if _, err := p.ReadAt(b, 0); err != nil {
				_ = f.Close()
				return nil, fmt.Errorf("read the interpreter of %s: %w", binary, err)
			}
			interp = strings.TrimRight(string(b), "\x00")
		}
	}
	_ = f.Close()
	if interp == "" {
		return nil, nil
	}
	out, err := exec.Command("ldd", binary).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return nil, fmt.Errorf("ldd %s: %w: %s", binary, err, ee.Stderr)
		}
		return nil, fmt.Errorf("ldd %s (install libc-bin): %w", binary, err)
	}
	return parseLdd(out, interp)
}

// parseLdd reads ldd's lines ("libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6
// (0x...)", "/lib64/ld-linux-x86-64.so.2 (0x...)", "linux-vdso.so.1
// (0x...)") into the files to copy; the interpreter comes first.
func parseLdd(out []byte, interp string) ([]string, error) {
	libs := []string{interp}
	seen := map[string]bool{interp: true}
	for _, line := range bytes.Split(out, []byte("\n")) {
		fields := strings.Fields(string(line))
		var p string
		switch {
		case len(fields) >= 3 && fields[1] == "=>":
			if fields[2] == "not" {
				return nil, fmt.Errorf("ldd: %s is not found on this host", fields[0])
			}
			p = fields[2]
		case len(fields) >= 1 && strings.HasPrefix(fields[0], "/"):
			p = fields[0]
		default:
			continue // the vDSO, which the kernel provides
		}
		if !seen[p] {
			seen[p] = true
			libs = append(libs, p)
		}
	}
	return libs, nil
}
