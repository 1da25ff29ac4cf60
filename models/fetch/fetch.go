// Package fetch streams one file from a Source into a local path: many
// concurrent ranged reads written in place with bounded memory, resumed from a
// journal after a restart, retried with backoff, and checked against a SHA-256
// before the file takes its final name.
package fetch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"

	"github.com/partita-dev/partita/internal/durable"
)

// Defaults for Options fields left zero.
const (
	DefaultChunkSize   = 8 << 20
	DefaultConcurrency = 8
	DefaultAttempts    = 5
)

// Options tune one Fetch. The zero value works.
type Options struct {
	// ChunkSize is the length of one ranged read (DefaultChunkSize).
	ChunkSize int64
	// Concurrency is the number of ranged reads in flight (DefaultConcurrency).
	Concurrency int
	// Pool supplies the chunk buffers; its buffers must be at least ChunkSize
	// long. Nil means a pool of Concurrency buffers for this call alone.
	Pool BufferPool
	// SHA256 is the expected digest in hex; empty skips the check.
	SHA256 string
	// Digest asks for the file's SHA-256 in Result even when none is
	// expected (one more read of the file, from the page cache mostly).
	Digest bool
	// Attempts is how many times one range is tried (DefaultAttempts).
	Attempts int
	// Backoff is the wait before retry attempt+1; nil means
	// ExponentialBackoff(200ms, 30s, nil).
	Backoff func(attempt int) time.Duration
	// Clock sleeps between retries; nil means the real clock.
	Clock clock.Clock
	// Progress, if set, is called from one goroutine as chunks complete.
	Progress func(done, total int64)
	Log      logr.Logger
}

func (o Options) withDefaults() Options {
	if o.ChunkSize <= 0 {
		o.ChunkSize = DefaultChunkSize
	}
	if o.Concurrency <= 0 {
		o.Concurrency = DefaultConcurrency
	}
	if o.Pool == nil {
		o.Pool = NewPool(o.Concurrency, int(o.ChunkSize))
	}
	if o.Attempts <= 0 {
		o.Attempts = DefaultAttempts
	}
	if o.Backoff == nil {
		o.Backoff = ExponentialBackoff(200*time.Millisecond, 30*time.Second, nil)
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	return o
}

// Result says what one Fetch did.
type Result struct {
	Size int64
	// ReadBytes were read from the source by this call.
	ReadBytes int64
	// ResumedBytes were already on disk from an earlier, interrupted call.
	ResumedBytes int64
	// SingleStream is true when the source ignored ranges and the file came
	// in one stream.
	SingleStream bool
	// SHA256 of the file, in hex, when Options.SHA256 or Options.Digest
	// asked for it.
	SHA256 string
}

// DigestMismatchError says the fetched bytes are not the ones pinned.
type DigestMismatchError struct {
	Name     string
	Expected string
	Got      string
}

func (e *DigestMismatchError) Error() string {
	return fmt.Sprintf("sha256 of %s: expected %s, got %s", e.Name, e.Expected, e.Got)
}

// Suffixes of the files that live beside dst while it is being fetched.
const (
	PartialSuffix = ".partial"
	JournalSuffix = ".partial.chunks"
)

// Fetch copies name from src to dstPath. Only one Fetch may run for a dstPath
// at a time (the cache's single-flight sees to it). It writes into dstPath.partial,
// records finished chunks in dstPath.partial.chunks so that a later call
// resumes where this one stopped, and renames the file into place only once
// it is complete and, when opts.SHA256 is set, verified.
func Fetch(ctx context.Context, src Source, name, dstPath string, opts Options) (Result, error) {
	opts = opts.withDefaults()
	log := opts.Log.WithValues("name", name)
	var size int64
	var etag string
	err := retry(ctx, opts.Clock, opts.Attempts, opts.Backoff, func() error {
		var err error
		size, etag, err = src.Stat(ctx, name)
		return err
	})
	if err != nil {
		return Result{}, fmt.Errorf("fetch %s: %w", name, err)
	}
	f := &fetcher{
		src: src, name: name, opts: opts, size: size, log: log,
		partial: dstPath + PartialSuffix,
		chunks:  int((size + opts.ChunkSize - 1) / opts.ChunkSize),
	}
	res, err := f.run(ctx, etag)
	if err != nil {
		return res, fmt.Errorf("fetch %s: %w", name, err)
	}
	if res.SHA256, err = f.finish(dstPath); err != nil {
		return res, fmt.Errorf("fetch %s: %w", name, err)
	}
	return res, nil
}

type fetcher struct {
	src     Source
	name    string
	opts    Options
	size    int64
	chunks  int
	partial string
	log     logr.Logger

	file *os.File
	done []bool
	read atomic.Int64
	// hasher takes the digest as chunks complete (nil when none is
	// wanted); digest is its result once every chunk is written.
	hasher *prefixHasher
	digest string
}

func (f *fetcher) chunkRange(i int) (off, n int64) {
	off = int64(i) * f.opts.ChunkSize
	return off, min(f.opts.ChunkSize, f.size-off)
}

// run fills the partial file, returning once every chunk is on disk and in
// the journal.
func (f *fetcher) run(ctx context.Context, etag string) (Result, error) {
	res := Result{Size: f.size}
	journalPath := f.partial + ".chunks"
	// A journal without its data file (or with a truncated one) proves
	// nothing; drop it so that it cannot vouch for chunks written later.
	if fi, err := os.Stat(f.partial); err != nil || fi.Size() != f.size {
		if err := os.Remove(journalPath); err != nil && !errors.Is(err, os.ErrNotExist) {
			return res, fmt.Errorf("remove stale journal: %w", err)
		}
	}
	j, done, fresh, err := openJournal(journalPath, journalHeader{Size: f.size, ETag: etag, ChunkSize: f.opts.ChunkSize}, f.chunks)
	if err != nil {
		return res, err
	}
	defer func() { _ = j.close() }()
	f.done = done
	flags := os.O_RDWR | os.O_CREATE
	if fresh {
		flags |= os.O_TRUNC
	}
	file, err := os.OpenFile(f.partial, flags, 0o644)
	if err != nil {
		return res, fmt.Errorf("open %s: %w", f.partial, err)
	}
	// Chunks are synced before they are journaled; Close has nothing to add.
	defer func() { _ = file.Close() }()
	f.file = file
	if fresh {
		if err := preallocate(file, f.size); err != nil {
			return res, fmt.Errorf("preallocate %s: %w", f.partial, err)
		}
	}
	var todo []int
	for i, d := range f.done {
		if d {
			_, n := f.chunkRange(i)
			res.ResumedBytes += n
		} else {
			todo = append(todo, i)
		}
	}
	if res.ResumedBytes > 0 {
		f.log.V(2).Info("Resumed fetch", "resumedBytes", res.ResumedBytes, "size", f.size)
	}

	if strings.ToLower(f.opts.SHA256) != "" || f.opts.Digest {
		f.hasher = newPrefixHasher(f)
	}
	completed := make(chan int, f.chunks)
	journalErr := make(chan error, 1)
	go func() { journalErr <- f.record(j, completed, res.ResumedBytes) }()

	err = f.ranged(ctx, todo, completed)
	if errors.Is(err, ErrRangeIgnored) {
		if s, ok := f.src.(Streamer); ok {
			f.log.Info("Source ignored range requests; fetching in one stream", "err", err)
			res.SingleStream = true
			err = f.stream(ctx, s, completed)
		}
	}
	close(completed)
	if jerr := <-journalErr; err == nil {
		err = jerr
	}
	if f.hasher != nil {
		// record has sent every completed chunk to the hasher by now.
		digest, herr := f.hasher.sum(err == nil)
		if err == nil {
			err = herr
		}
		f.digest = digest
	}
	res.ReadBytes = f.read.Load()
	return res, err
}

// ranged reads the todo chunks with Concurrency workers.
func (f *fetcher) ranged(ctx context.Context, todo []int, completed chan<- int) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	work := make(chan int)
	var wg sync.WaitGroup
	for range min(f.opts.Concurrency, len(todo)) {
		wg.Go(func() {
			if err := f.worker(ctx, work, completed); err != nil {
				cancel(err)
			}
		})
	}
feed:
	for _, i := range todo {
		select {
		case work <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(work)
	wg.Wait()
	return context.Cause(ctx)
}

func (f *fetcher) worker(ctx context.Context, work <-chan int, completed chan<- int) error {
	buf, err := f.opts.Pool.Get(ctx)
	if err != nil {
		return err
	}
	defer f.opts.Pool.Put(buf)
	if int64(len(buf)) < f.opts.ChunkSize {
		return fmt.Errorf("buffer pool gives %d-byte buffers, chunks are %d bytes", len(buf), f.opts.ChunkSize)
	}
	for i := range work {
		off, n := f.chunkRange(i)
		p := buf[:n]
		err := retry(ctx, f.opts.Clock, f.opts.Attempts, f.opts.Backoff, func() error {
			err := f.src.ReadRange(ctx, f.name, off, p)
			if err != nil && !IsPermanent(err) && ctx.Err() == nil {
				f.log.V(3).Info("Retrying range", "offset", off, "length", n, "err", err)
			}
			return err
		})
		if err != nil {
			return err
		}
		f.read.Add(n)
		if _, err := f.file.WriteAt(p, off); err != nil {
			return fmt.Errorf("write %s at %d: %w", f.partial, off, err)
		}
		// Each worker writes its own indices, and stream reads them only
		// after every worker has returned.
		f.done[i] = true
		completed <- i
	}
	return nil
}

// stream copies the whole file in order from one reader, for sources that
// ignore ranges. Chunks already done are read again (the stream cannot skip
// them) but not rewritten.
func (f *fetcher) stream(ctx context.Context, s Streamer, completed chan<- int) error {
	buf, err := f.opts.Pool.Get(ctx)
	if err != nil {
		return err
	}
	defer f.opts.Pool.Put(buf)
	return retry(ctx, f.opts.Clock, f.opts.Attempts, f.opts.Backoff, func() error {
		rc, err := s.Open(ctx, f.name)
		if err != nil {
			return err
		}
		defer func() { _ = rc.Close() }()
		for i := range f.chunks {
			off, n := f.chunkRange(i)
			p := buf[:n]
			if _, err := io.ReadFull(rc, p); err != nil {
				return fmt.Errorf("read stream at %d: %w", off, err)
			}
			f.read.Add(n)
			if f.done[i] {
				continue
			}
			if _, err := f.file.WriteAt(p, off); err != nil {
				return Permanent(fmt.Errorf("write %s at %d: %w", f.partial, off, err))
			}
			f.done[i] = true
			completed <- i
		}
		return nil
	})
}

// Journal batches: completed chunks are synced and journaled once this many
// bytes are pending, or this long after the last batch, or at the end. A
// sync per chunk would cost a fast local copy a third of its speed; a crash
// loses at most one batch, which the next run fetches again.
const (
	journalBatchBytes = 64 << 20
	journalBatchEvery = time.Second
)

// record journals completed chunks in batches: one data sync covers every
// chunk of the batch. Progress is reported as chunks complete.
func (f *fetcher) record(j *journal, completed <-chan int, done int64) error {
	if f.opts.Progress != nil && done > 0 {
		f.opts.Progress(done, f.size) // where a resumed fetch starts
	}
	var firstErr error
	var batch []int
	var pending int64
	flush := func() {
		if len(batch) == 0 {
			return
		}
		if firstErr == nil {
			if err := f.file.Sync(); err != nil {
				firstErr = fmt.Errorf("sync %s: %w", f.partial, err)
			} else if err := j.append(batch); err != nil {
				firstErr = err
			}
		}
		batch, pending = batch[:0], 0
	}
	timer := f.opts.Clock.NewTimer(journalBatchEvery)
	defer timer.Stop()
	for {
		select {
		case k, ok := <-completed:
			if !ok {
				flush()
				return firstErr
			}
			_, n := f.chunkRange(k)
			done += n
			if f.hasher != nil {
				f.hasher.completed(k)
			}
			batch = append(batch, k)
			pending += n
			if pending >= journalBatchBytes {
				flush()
			}
			if f.opts.Progress != nil {
				f.opts.Progress(done, f.size)
			}
		case <-timer.C():
			flush()
			timer.Reset(journalBatchEvery)
		}
	}
}

// finish checks the digest and renames the partial file into place. It
// returns the digest when it computed one.
func (f *fetcher) finish(dstPath string) (string, error) {
	journalPath := f.partial + ".chunks"
	var got string
	if want := strings.ToLower(f.opts.SHA256); want != "" || f.opts.Digest {
		got = f.digest
		if got == "" {
			var err error
			if got, err = fileSHA256(f.partial); err != nil {
				return "", err
			}
		}
		if want != "" && got != want {
			// The bytes are wrong somewhere, and the journal cannot say where.
			_ = os.Remove(f.partial)
			_ = os.Remove(journalPath)
			return "", &DigestMismatchError{Name: f.name, Expected: want, Got: got}
		}
	}
	if err := os.Rename(f.partial, dstPath); err != nil {
		return "", fmt.Errorf("rename %s: %w", f.partial, err)
	}
	if err := durable.SyncDir(filepath.Dir(dstPath)); err != nil {
		return "", err
	}
	if err := os.Remove(journalPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("remove journal: %w", err)
	}
	return got, nil
}

func fileSHA256(path string) (string, error) {
	file, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("open %s: %w", path, err)
	}
	defer func() { _ = file.Close() }()
	h := sha256.New()
	if _, err := io.Copy(h, file); err != nil {
		return "", fmt.Errorf("hash %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
