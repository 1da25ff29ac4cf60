//go:build !linux

package fetch

import "os"

// preallocate sets f's size; only Linux reserves the blocks up front.
func preallocate(f *os.File, size int64) error {
	return f.Truncate(size)
}
