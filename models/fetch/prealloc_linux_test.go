//go:build linux

package fetch

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestFetchFailsAtOnceOnAFullDisk fetches 2 MiB into a 1 MiB tmpfs (root
// only): refused before a byte is read, saying the disk is full.
func TestFetchFailsAtOnceOnAFullDisk(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a small tmpfs needs root")
	}
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		t.Skipf("mount a tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	src := newMemSource(randomBytes(2 << 20))
	_, err := Fetch(t.Context(), src, "f", filepath.Join(dir, "model.safetensors"), Options{ChunkSize: 256 << 10})
	if !errors.Is(err, unix.ENOSPC) {
		t.Fatalf("Fetch() = %v, want ENOSPC", err)
	}
	if n := src.served(); n != 0 {
		t.Errorf("read %d bytes before finding the disk full, want 0", n)
	}
}
