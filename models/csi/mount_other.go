//go:build !linux

package csi

import "errors"

// HostMounter mounts only on Linux.
type HostMounter struct{}

var errNotLinux = errors.New("models are mounted on Linux nodes only")

// BindReadOnly fails off Linux.
func (HostMounter) BindReadOnly(string, string) error { return errNotLinux }

// Unmount fails off Linux.
func (HostMounter) Unmount(string) error { return errNotLinux }

// IsMountPoint fails off Linux.
func (HostMounter) IsMountPoint(string) (bool, error) { return false, errNotLinux }
