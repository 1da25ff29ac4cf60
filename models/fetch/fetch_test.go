package fetch

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// memSource serves data from memory, counting what it reads and failing the
// first fail[off] reads of the range at off.
type memSource struct {
	data      []byte
	etag      string
	permanent bool  // failures are permanent
	blockFrom int64 // if > 0, reads at or past it wait for ctx to end

	lock  sync.Mutex
	fail  map[int64]int
	reads map[int64]int // attempts per offset
	bytes int64         // bytes served
}

func newMemSource(data []byte) *memSource {
	return &memSource{data: data, etag: "v1", fail: map[int64]int{}, reads: map[int64]int{}}
}

func (m *memSource) Stat(context.Context, string) (int64, string, error) {
	return int64(len(m.data)), m.etag, nil
}

func (m *memSource) ReadRange(ctx context.Context, _ string, off int64, p []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if m.blockFrom > 0 && off >= m.blockFrom {
		<-ctx.Done()
		return ctx.Err()
	}
	m.lock.Lock()
	m.reads[off]++
	failing := m.fail[off] > 0
	if failing {
		m.fail[off]--
	}
	m.lock.Unlock()
	if failing {
		err := fmt.Errorf("injected failure at %d", off)
		if m.permanent {
			err = Permanent(err)
		}
		return err
	}
	copy(p, m.data[off:])
	m.lock.Lock()
	m.bytes += int64(len(p))
	m.lock.Unlock()
	return nil
}

func (m *memSource) served() int64 {
	m.lock.Lock()
	defer m.lock.Unlock()
	return m.bytes
}

func randomBytes(n int) []byte {
	r := rand.New(rand.NewPCG(uint64(n), 7))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func noBackoff(int) time.Duration { return 0 }

func TestFetch(t *testing.T) {
	cases := map[string]struct {
		size      int
		chunk     int64
		fail      map[int64]int
		permanent bool
		sha       string // "good" means the right digest
		want      Result
		wantReads map[int64]int
		wantErr   string
	}{
		"chunks divide the file": {
			size: 4096, chunk: 1024, sha: "good",
			want:      Result{Size: 4096, ReadBytes: 4096},
			wantReads: map[int64]int{0: 1, 1024: 1, 2048: 1, 3072: 1},
		},
		"short last chunk": {
			size: 2500, chunk: 1024,
			want:      Result{Size: 2500, ReadBytes: 2500},
			wantReads: map[int64]int{0: 1, 1024: 1, 2048: 1},
		},
		"empty file": {
			size: 0, chunk: 1024, sha: "good",
			want:      Result{},
			wantReads: map[int64]int{},
		},
		"flaky range is retried": {
			size: 3072, chunk: 1024, fail: map[int64]int{1024: 2},
			want:      Result{Size: 3072, ReadBytes: 3072},
			wantReads: map[int64]int{0: 1, 1024: 3, 2048: 1},
		},
		"attempts run out": {
			size: 3072, chunk: 1024, fail: map[int64]int{2048: 10},
			wantErr: "injected failure at 2048",
		},
		"permanent error is not retried": {
			size: 3072, chunk: 1024, fail: map[int64]int{0: 10}, permanent: true,
			wantErr: "injected failure at 0",
		},
		"digest mismatch": {
			size: 2048, chunk: 1024, sha: strings.Repeat("ab", 32),
			wantErr: "expected " + strings.Repeat("ab", 32) + ", got ",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			data := randomBytes(tc.size)
			src := newMemSource(data)
			src.permanent = tc.permanent
			for k, v := range tc.fail {
				src.fail[k] = v
			}
			sha := tc.sha
			if sha == "good" {
				sha = digest(data)
			}
			dst := filepath.Join(t.TempDir(), "model.safetensors")
			got, err := Fetch(t.Context(), src, "m", dst, Options{ChunkSize: tc.chunk, Concurrency: 2, SHA256: sha, Attempts: 4, Backoff: noBackoff})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Fetch() error = %v, want one containing %q", err, tc.wantErr)
				}
				if _, err := os.Stat(dst); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("dst exists after a failed fetch (stat: %v)", err)
				}
				if tc.permanent && src.reads[0] != 1 {
					t.Errorf("permanent failure was tried %d times, want 1", src.reads[0])
				}
				return
			}
			if err != nil {
				t.Fatalf("Fetch() error = %v", err)
			}
			tc.want.SHA256 = sha // the pinned digest, checked
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Fetch() result (-want,+got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantReads, src.reads); diff != "" {
				t.Errorf("reads per offset (-want,+got):\n%s", diff)
			}
			b, err := os.ReadFile(dst)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(b, data) {
				t.Errorf("fetched file differs from the source")
			}
			for _, suffix := range []string{PartialSuffix, JournalSuffix} {
				if _, err := os.Stat(dst + suffix); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s left behind (stat: %v)", suffix, err)
				}
			}
		})
	}
}

func TestFetchDigestMismatchRemovesPartial(t *testing.T) {
	src := newMemSource(randomBytes(4096))
	dst := filepath.Join(t.TempDir(), "f")
	want := strings.Repeat("0", 64)
	_, err := Fetch(t.Context(), src, "f", dst, Options{ChunkSize: 1024, SHA256: want})
	var mm *DigestMismatchError
	if !errors.As(err, &mm) {
		t.Fatalf("Fetch() error = %v, want a DigestMismatchError", err)
	}
	if diff := cmp.Diff(&DigestMismatchError{Name: "f", Expected: want, Got: digest(src.data)}, mm); diff != "" {
		t.Errorf("mismatch (-want,+got):\n%s", diff)
	}
	for _, p := range []string{dst, dst + PartialSuffix, dst + JournalSuffix} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s exists after a mismatch (stat: %v)", p, err)
		}
	}
}

// countingPool wraps a Pool and records the most buffers out at once.
type countingPool struct {
	*Pool
	lock          sync.Mutex
	out, peak, nb int
	seen          map[*byte]bool
}

func (c *countingPool) Get(ctx context.Context) ([]byte, error) {
	b, err := c.Pool.Get(ctx)
	if err != nil {
		return nil, err
	}
	c.lock.Lock()
	defer c.lock.Unlock()
	c.out++
	c.peak = max(c.peak, c.out)
	if !c.seen[&b[0]] {
		c.seen[&b[0]] = true
		c.nb++
	}
	return b, nil
}

func (c *countingPool) Put(b []byte) {
	c.lock.Lock()
	c.out--
	c.lock.Unlock()
	c.Pool.Put(b)
}

func TestFetchBoundedMemory(t *testing.T) {
	const size, chunk, workers = 64 << 20, 1 << 20, 4
	data := randomBytes(size)
	pool := &countingPool{Pool: NewPool(workers, chunk), seen: map[*byte]bool{}}
	dst := filepath.Join(t.TempDir(), "big")
	res, err := Fetch(t.Context(), newMemSource(data), "big", dst, Options{ChunkSize: chunk, Concurrency: workers, Pool: pool, SHA256: digest(data)})
	if err != nil {
		t.Fatalf("Fetch() error = %v", err)
	}
	if res.ReadBytes != size {
		t.Errorf("ReadBytes = %d, want %d", res.ReadBytes, size)
	}
	// 64 chunks went through at most 4 buffers of 1 MiB, whatever the size.
	if pool.peak > workers || pool.nb > workers || pool.out != 0 {
		t.Errorf("buffers: peak %d, distinct %d, still out %d; want ≤ %d, ≤ %d, 0", pool.peak, pool.nb, pool.out, workers, workers)
	}
}

func TestFetchResume(t *testing.T) {
	const size, chunk = 64 << 10, 1 << 10
	data := randomBytes(size)
	src := newMemSource(data)
	dst := filepath.Join(t.TempDir(), "f")

	// The first run gets the first half at most, and is stopped once a
	// quarter of the file is in the journal.
	src.blockFrom = size / 2
	ctx, cancel := context.WithCancel(t.Context())
	first, err := Fetch(ctx, src, "f", dst, Options{ChunkSize: chunk, Concurrency: 4, Progress: func(done, _ int64) {
		if done >= size/4 {
			cancel()
		}
	}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("first Fetch() error = %v, want context.Canceled", err)
	}
	if _, err := os.Stat(dst + JournalSuffix); err != nil {
		t.Fatalf("journal missing after cancel: %v", err)
	}
	readBefore := src.served()
	src.blockFrom = 0

	second, err := Fetch(t.Context(), src, "f", dst, Options{ChunkSize: chunk, Concurrency: 4, SHA256: digest(data)})
	if err != nil {
		t.Fatalf("second Fetch() error = %v", err)
	}
	if second.ResumedBytes < size/4 || second.ResumedBytes > first.ReadBytes {
		t.Errorf("ResumedBytes = %d, want between %d and the first run's %d", second.ResumedBytes, size/4, first.ReadBytes)
	}
	// The restart re-read nothing it had journaled.
	if reread := src.served() - readBefore; reread != size-second.ResumedBytes || second.ReadBytes != reread {
		t.Errorf("second run read %d bytes (Result says %d), want size - resumed = %d", reread, second.ReadBytes, size-second.ResumedBytes)
	}
	if b, _ := os.ReadFile(dst); !bytes.Equal(b, data) {
		t.Errorf("resumed file differs from the source")
	}
}

func TestFetchRestartsWhenSourceChanged(t *testing.T) {
	const size, chunk = 16 << 10, 1 << 10
	src := newMemSource(randomBytes(size))
	dst := filepath.Join(t.TempDir(), "f")
	ctx, cancel := context.WithCancel(t.Context())
	_, _ = Fetch(ctx, src, "f", dst, Options{ChunkSize: chunk, Concurrency: 1, Progress: func(done, _ int64) {
		if done >= size/2 {
			cancel()
		}
	}})
	src.data = randomBytes(size + 1)
	src.etag = "v2"
	res, err := Fetch(t.Context(), src, "f", dst, Options{ChunkSize: chunk, SHA256: digest(src.data)})
	if err != nil {
		t.Fatalf("Fetch() error = %v", err)
	}
	if res.ResumedBytes != 0 {
		t.Errorf("ResumedBytes = %d after the source changed, want 0", res.ResumedBytes)
	}
}

func TestParseJournal(t *testing.T) {
	hdr := journalHeader{Size: 5, ETag: "e", ChunkSize: 1}
	cases := map[string]struct {
		data   string
		wantOK bool
		want   []bool
	}{
		"complete lines":   {data: `{"size":5,"etag":"e","chunkSize":1}` + "\n0\n3\n", wantOK: true, want: []bool{true, false, false, true, false}},
		"torn last line":   {data: `{"size":5,"etag":"e","chunkSize":1}` + "\n1\n4", wantOK: true, want: []bool{false, true, false, false, false}},
		"other etag":       {data: `{"size":5,"etag":"x","chunkSize":1}` + "\n1\n", want: make([]bool, 5)},
		"index past chunk": {data: `{"size":5,"etag":"e","chunkSize":1}` + "\n9\n", want: []bool{false, false, false, false, false}},
		"empty":            {data: "", want: make([]bool, 5)},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			done := make([]bool, 5)
			ok := parseJournal([]byte(tc.data), hdr, done)
			if ok != tc.wantOK {
				t.Fatalf("parseJournal() = %v, want %v", ok, tc.wantOK)
			}
			if diff := cmp.Diff(tc.want, done); diff != "" {
				t.Errorf("done (-want,+got):\n%s", diff)
			}
		})
	}
}

func TestExponentialBackoff(t *testing.T) {
	cases := map[string]struct {
		rnd     float64
		attempt int
		want    time.Duration
	}{
		"first, no jitter":   {rnd: 0, attempt: 0, want: 50 * time.Millisecond},
		"first, half jitter": {rnd: 0.5, attempt: 0, want: 75 * time.Millisecond},
		"third doubles":      {rnd: 0, attempt: 2, want: 200 * time.Millisecond},
		"capped":             {rnd: 0, attempt: 20, want: 500 * time.Millisecond},
		"capped, jitter":     {rnd: 0.5, attempt: 60, want: 750 * time.Millisecond},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := ExponentialBackoff(100*time.Millisecond, time.Second, func() float64 { return tc.rnd })(tc.attempt)
			if got.Round(time.Microsecond) != tc.want {
				t.Errorf("backoff(%d) = %v, want %v", tc.attempt, got, tc.want)
			}
		})
	}
}

func TestFetchIgnoresJournalWithoutData(t *testing.T) {
	const size, chunk = 16 << 10, 1 << 10
	data := randomBytes(size)
	src := newMemSource(data)
	src.blockFrom = size / 2
	dst := filepath.Join(t.TempDir(), "f")
	ctx, cancel := context.WithCancel(t.Context())
	_, _ = Fetch(ctx, src, "f", dst, Options{ChunkSize: chunk, Concurrency: 2, Progress: func(done, _ int64) {
		if done >= size/4 {
			cancel()
		}
	}})
	// The data file is lost (a cleanup, a disk swap) but the journal stays.
	if err := os.Remove(dst + PartialSuffix); err != nil {
		t.Fatal(err)
	}
	src.blockFrom = 0
	res, err := Fetch(t.Context(), src, "f", dst, Options{ChunkSize: chunk, SHA256: digest(data)})
	if err != nil {
		t.Fatalf("Fetch() error = %v", err)
	}
	if diff := cmp.Diff(Result{Size: size, ReadBytes: size, SHA256: digest(data)}, res); diff != "" {
		t.Errorf("Fetch() (-want,+got):\n%s", diff)
	}
}
