// Package interposer puts a node's hami-core interposer in place: the
// HAMi-core library (libvgpu.so, taken from HAMi's published image; Partita
// ships no copy) and the ld.so.preload file that names it, in one host
// directory. The agent's container-creation hook (NRI) bind-mounts that
// directory read-only at ContainerDir and the preload file read-only over
// /etc/ld.so.preload in every container of a hami-core slice, so the
// dynamic loader maps the library into each of the container's processes
// and nothing in the container, root included, can change either.
//
// Both files are written atomically (a temporary file renamed over the old
// one), the library first: a reader sees the old files or the new, and a
// preload file never names a library that is not there yet. A rename gives
// the file a new inode, so a container that already runs keeps the library
// it started with.
//
// interposer imports nothing of Partita: the agent's NRI hook and the
// `partita interposer` command both use it.
package interposer

import (
	"bytes"
	"context"
	"debug/elf"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/internal/durable"
)

const (
	// DefaultHostDir is the host directory of the files (the agent's
	// --interposer-dir, the chart's agent.interposer.hostDir).
	DefaultHostDir = "/var/lib/partita/interposer"
	// LibraryName is the library's file name in the host directory and in
	// ContainerDir.
	LibraryName = "libvgpu.so"
	// PreloadName is the preload file's name in the host directory.
	PreloadName = "ld.so.preload"
	// ContainerDir is where a hami-core container sees the host directory.
	ContainerDir = "/usr/local/partita/interposer"
	// ContainerPreload is where a hami-core container sees the preload file:
	// the dynamic loader reads it before any program's own code runs.
	ContainerPreload = "/etc/ld.so.preload"
	// ContainerLibrary is the library's path inside a container, the one
	// line of the preload file.
	ContainerLibrary = ContainerDir + "/" + LibraryName
)

// PreloadContent is the preload file's content.
const PreloadContent = ContainerLibrary + "\n"

// maxLibraryBytes bounds what Install reads: HAMi-core is about 1 MiB; a
// file far larger is not it.
const maxLibraryBytes = 256 << 20

// Install copies the library at src into hostDir as LibraryName and writes
// hostDir's PreloadName, both mode 0644, creating hostDir (0755) if needed.
// src must be a non-empty ELF shared object. Files that already hold the
// right content are left alone, so a second run changes nothing; it
// reports whether it wrote anything.
func Install(src, hostDir string) (bool, error) {
	lib, err := readLibrary(src)
	if err != nil {
		return false, err
	}
	if err := os.MkdirAll(hostDir, 0o755); err != nil {
		return false, fmt.Errorf("create %s: %w", hostDir, err)
	}
	// The library first: the preload file must never name a missing one.
	wroteLib, err := writeIfChanged(filepath.Join(hostDir, LibraryName), lib)
	if err != nil {
		return false, err
	}
	wrotePreload, err := writeIfChanged(filepath.Join(hostDir, PreloadName), []byte(PreloadContent))
	if err != nil {
		return wroteLib, err
	}
	return wroteLib || wrotePreload, nil
}

// Installed reports whether hostDir holds an installed interposer: a
// preload file that names ContainerLibrary and nothing else, and beside it
// an ELF shared object. libPath is the library's path on the host.
func Installed(hostDir string) (libPath string, ok bool) {
	if Check(hostDir) != nil {
		return "", false
	}
	return filepath.Join(hostDir, LibraryName), true
}

// Check says what is wrong with hostDir's interposer, nil when nothing is.
func Check(hostDir string) error {
	preload := filepath.Join(hostDir, PreloadName)
	b, err := os.ReadFile(preload)
	if err != nil {
		return fmt.Errorf("read %s: %w", preload, err)
	}
	if string(b) != PreloadContent {
		return fmt.Errorf("check %s: holds %q, want %q", preload, b, PreloadContent)
	}
	if err := checkLibrary(filepath.Join(hostDir, LibraryName)); err != nil {
		return err
	}
	return nil
}

// readLibrary reads src and checks that it is a regular, non-empty ELF
// shared object.
func readLibrary(src string) ([]byte, error) {
	if err := checkLibrary(src); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(src)
	if err != nil {
		return nil, fmt.Errorf("read library %s: %w", src, err)
	}
	return b, nil
}

// checkLibrary checks that src is a shared object of a sane size, reading
// its ELF header only: Check runs on every agent sync and DRA claim, and a
// library is megabytes.
func checkLibrary(src string) error {
	fi, err := os.Stat(src)
	if err != nil {
		return fmt.Errorf("read library %s: %w", src, err)
	}
	switch {
	case !fi.Mode().IsRegular():
		return fmt.Errorf("read library %s: %s is not a regular file", src, fi.Mode().Type())
	case fi.Size() == 0:
		return fmt.Errorf("read library %s: empty", src)
	case fi.Size() > maxLibraryBytes:
		return fmt.Errorf("read library %s: %d bytes, more than a preload library has", src, fi.Size())
	}
	f, err := elf.Open(src)
	if err != nil {
		return fmt.Errorf("read library %s: not ELF: %w", src, err)
	}
	defer func() { _ = f.Close() }()
	// A preloaded object must be a shared object; ET_DYN also covers a
	// position-independent executable, which the loader refuses loudly.
	if f.Type != elf.ET_DYN {
		return fmt.Errorf("read library %s: ELF type %s, want a shared object (%s)", src, f.Type, elf.ET_DYN)
	}
	return nil
}

// writeIfChanged writes content to path with mode 0644 unless path already
// holds exactly that, atomically: a temporary file in the same directory,
// synced, renamed over path. It reports whether it wrote.
func writeIfChanged(path string, content []byte) (bool, error) {
	// Anything else there (missing, unreadable, other content or mode) is
	// replaced.
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, content) {
		if fi, err := os.Lstat(path); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm() == 0o644 {
			return false, nil
		}
	}
	// Containers read these as any user.
	if err := durable.WriteFile(path, content, 0o644); err != nil {
		return false, err
	}
	return true, nil
}

// Keep installs the library at src into hostDir, then checks every
// interval until ctx ends and installs again whatever was removed or
// changed on the host. The first install's error ends it; later ones are
// logged and retried at the next check, as the files already in place
// keep serving.
func Keep(ctx context.Context, src, hostDir string, interval time.Duration, clk clock.WithTicker) error {
	log := logr.FromContextOrDiscard(ctx).WithValues("source", src, "hostDir", hostDir)
	wrote, err := Install(src, hostDir)
	if err != nil {
		return err
	}
	log.Info("Installed the interposer", "changed", wrote)
	t := clk.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C():
		}
		wrote, err := Install(src, hostDir)
		switch {
		case err != nil:
			log.Error(err, "Could not install the interposer again")
		case wrote:
			log.Info("Installed the interposer again: its files on the host had changed")
		}
	}
}

// SliceMode is the isolation mode that caps a slice of devices devices on a
// node in mode: the node's, except that in mps mode a slice over several
// devices, which one MPS daemon per device cannot serve (its devices run
// without MPS), gets the interposer like a hami-core slice, where the
// interposer is mounted (installed, and a container path that mounts it).
// The NRI path (containeredit) and the DRA backend's CDI specs both ask
// here.
func SliceMode(mode v1alpha1.IsolationMode, devices int, mounted bool) v1alpha1.IsolationMode {
	if mode == v1alpha1.IsolationMPS && devices > 1 && mounted {
		return v1alpha1.IsolationHAMiCore
	}
	return mode
}
