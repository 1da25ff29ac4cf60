package fetch

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// preallocate sizes f to size bytes after checking that its filesystem has
// them free, so that a full disk fails the fetch at its start rather than at
// some chunk in its middle. The file is left sparse: reserving the blocks
// (fallocate) made every later write convert an unwritten extent, and cost
// a local copy a quarter of its speed (docs/benchmarks.md, "Models").
func preallocate(f *os.File, size int64) error {
	if size == 0 {
		return nil
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &st); err == nil {
		if free := int64(st.Bavail) * st.Bsize; free < size { //nolint:gosec // block counts fit in int64
			return fmt.Errorf("%w: %d bytes needed, %d free", unix.ENOSPC, size, free)
		}
	}
	return f.Truncate(size)
}
