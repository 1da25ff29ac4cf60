//go:build linux

package csi

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestHostMounterBindsReadOnly makes a real bind (root only).
func TestHostMounterBindsReadOnly(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("binding needs root")
	}
	src, target := t.TempDir(), filepath.Join(t.TempDir(), "mount")
	if err := os.WriteFile(filepath.Join(src, "w"), []byte("weights"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(target, 0o750); err != nil {
		t.Fatal(err)
	}
	m := HostMounter{}
	if err := m.BindReadOnly(src, target); err != nil {
		t.Fatalf("BindReadOnly() = %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(target, unix.MNT_DETACH) })
	if ok, err := m.IsMountPoint(target); !ok || err != nil {
		t.Errorf("IsMountPoint() = %v, %v; want true", ok, err)
	}
	if b, err := os.ReadFile(filepath.Join(target, "w")); err != nil || string(b) != "weights" {
		t.Errorf("read through the bind: %q, %v", b, err)
	}
	if err := os.WriteFile(filepath.Join(target, "x"), nil, 0o644); !errors.Is(err, unix.EROFS) {
		t.Errorf("write through the bind: %v, want EROFS", err)
	}
	if err := m.Unmount(target); err != nil {
		t.Fatalf("Unmount() = %v", err)
	}
	if ok, _ := m.IsMountPoint(target); ok {
		t.Error("still a mount point after Unmount")
	}
}
