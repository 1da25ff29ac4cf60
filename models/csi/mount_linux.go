//go:build linux

package csi

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
	"k8s.io/mount-utils"
)

// HostMounter binds with system calls.
type HostMounter struct{}

// BindReadOnly binds source at target, then remounts it read-only: the
// kernel ignores MS_RDONLY on the first call of a bind.
func (HostMounter) BindReadOnly(source, target string) error {
	if err := unix.Mount(source, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind: %w", err)
	}
	if err := unix.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		_ = unix.Unmount(target, unix.MNT_DETACH)
		return fmt.Errorf("make the bind read-only: %w", err)
	}
	return nil
}

// Unmount detaches target.
func (HostMounter) Unmount(target string) error {
	if err := unix.Unmount(target, 0); err != nil && !errors.Is(err, unix.EINVAL) {
		return err
	}
	return nil
}

// IsMountPoint reads the mount table (a bind of the same filesystem has the
// same device, so stat cannot tell).
func (HostMounter) IsMountPoint(target string) (bool, error) {
	if _, err := os.Stat(target); errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	return mount.New("").IsMountPoint(target)
}
