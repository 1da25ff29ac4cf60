package nodeagent

import (
	"fmt"

	"github.com/containerd/nri/pkg/api"
	"golang.org/x/sys/unix"
)

// charDevice describes the character device at hostPath as the container
// sees it at path.
func charDevice(hostPath, path string) (*api.LinuxDevice, error) {
	var st unix.Stat_t
	if err := unix.Stat(hostPath, &st); err != nil {
		return nil, fmt.Errorf("stat device %s: %w", hostPath, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFCHR {
		return nil, fmt.Errorf("stat device %s: not a character device", hostPath)
	}
	rdev := uint64(st.Rdev) //nolint:unconvert // Rdev is uint32 on some platforms
	return &api.LinuxDevice{
		Path: path, Type: "c",
		Major: int64(unix.Major(rdev)), Minor: int64(unix.Minor(rdev)),
		FileMode: api.FileMode(st.Mode & 0o777),
	}, nil
}
