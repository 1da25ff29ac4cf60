package fetch

import (
	"context"
	"errors"
	"io"
)

// Source is where a model's files come from. name is what the source resolves:
// a path for File, a URL for HTTP, an object key for S3.
type Source interface {
	// Stat returns the size of name and a version tag (an ETag or the like;
	// empty if the source has none) that changes when the content does.
	Stat(ctx context.Context, name string) (size int64, etag string, err error)
	// ReadRange fills p with the bytes of name starting at off, all of them or
	// an error.
	ReadRange(ctx context.Context, name string, off int64, p []byte) error
}

// Streamer is a Source that can also send a whole file in one stream, for
// servers that ignore range requests.
type Streamer interface {
	Open(ctx context.Context, name string) (io.ReadCloser, error)
}

// ErrRangeIgnored says the server answered a range request with the whole
// file; Fetch then falls back to one stream if the source is a Streamer.
var ErrRangeIgnored = errors.New("server ignored the Range header")

// permanentError marks an error that a retry cannot fix (a 404, a denied
// request, a server that lies about ranges).
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent marks err so that Fetch does not retry it.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

// IsPermanent reports whether err, or an error it wraps, was marked Permanent.
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}
