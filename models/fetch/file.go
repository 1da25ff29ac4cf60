package fetch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
)

// File reads local files (file:// sources, or a node-local mirror) with pread,
// so that concurrent ranges need no shared offset.
type File struct{}

var _ Source = File{}
var _ Streamer = File{}

// Stat returns the file's size and its modification time and size as the tag.
func (File) Stat(_ context.Context, path string) (int64, string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			err = Permanent(err)
		}
		return 0, "", fmt.Errorf("stat %s: %w", path, err)
	}
	if !fi.Mode().IsRegular() {
		return 0, "", Permanent(fmt.Errorf("stat %s: not a regular file", path))
	}
	return fi.Size(), fileTag(fi), nil
}

// ReadRange reads len(p) bytes at off.
func (File) ReadRange(_ context.Context, path string, off int64, p []byte) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	defer func() { _ = f.Close() }()
	if _, err := f.ReadAt(p, off); err != nil {
		if errors.Is(err, io.EOF) {
			// The file shrank since Stat; retrying will not bring it back.
			err = Permanent(fmt.Errorf("%w: file is shorter than %d bytes", io.ErrUnexpectedEOF, off+int64(len(p))))
		}
		return fmt.Errorf("read %s at %d: %w", path, off, err)
	}
	return nil
}

// Open opens the file for one sequential read.
func (File) Open(_ context.Context, path string) (io.ReadCloser, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	return f, nil
}
