package fetch

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// copySequential is the baseline a local fetch is measured against: one
// reader, one writer, 1 MiB at a time, synced at the end like Fetch (dd).
func copySequential(b *testing.B, r io.Reader, dst string) {
	out, err := os.Create(dst)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := io.CopyBuffer(out, r, make([]byte, 1<<20)); err != nil {
		b.Fatal(err)
	}
	if err := out.Sync(); err != nil {
		b.Fatal(err)
	}
	if err := out.Close(); err != nil {
		b.Fatal(err)
	}
}

func removeOrFail(b *testing.B, path string) {
	if err := os.Remove(path); err != nil {
		b.Fatal(err)
	}
}

func BenchmarkFetchLocalFile(b *testing.B) {
	const size = 64 << 20
	dir := b.TempDir()
	src := filepath.Join(dir, "src")
	if err := os.WriteFile(src, randomBytes(size), 0o644); err != nil {
		b.Fatal(err)
	}
	dst := filepath.Join(dir, "dst")
	b.Run("sequential", func(b *testing.B) {
		b.SetBytes(size)
		for b.Loop() {
			f, err := os.Open(src)
			if err != nil {
				b.Fatal(err)
			}
			copySequential(b, f, dst)
			_ = f.Close()
			removeOrFail(b, dst)
		}
	})
	b.Run("fetch", func(b *testing.B) {
		b.SetBytes(size)
		pool := NewPool(DefaultConcurrency, DefaultChunkSize)
		for b.Loop() {
			if _, err := Fetch(b.Context(), File{}, src, dst, Options{Pool: pool}); err != nil {
				b.Fatal(err)
			}
			removeOrFail(b, dst)
		}
	})
}

// throttledResponse sends at most rate bytes per second, as one stream from
// an object store does; that per-stream cap is why ranged reads pay off.
type throttledResponse struct {
	http.ResponseWriter
	rate  float64
	start time.Time
	sent  int
}

func (r *throttledResponse) Write(p []byte) (int, error) {
	const piece = 64 << 10
	n := 0
	for len(p) > 0 {
		k := min(piece, len(p))
		m, err := r.ResponseWriter.Write(p[:k])
		n += m
		r.sent += m
		if err != nil {
			return n, err
		}
		// Sleep against the stream's start, so oversleeping once is
		// made up for later.
		due := r.start.Add(time.Duration(float64(r.sent) / r.rate * float64(time.Second)))
		time.Sleep(time.Until(due))
		p = p[k:]
	}
	return n, nil
}

func BenchmarkFetchHTTP(b *testing.B) {
	const size = 32 << 20
	data := randomBytes(size)
	for _, bc := range []struct {
		name string
		rate float64 // bytes per second per response; 0 is unthrottled
	}{{"loopback", 0}, {"stream-capped-100MiBps", 100 << 20}} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if bc.rate > 0 {
				w = &throttledResponse{ResponseWriter: w, rate: bc.rate, start: time.Now()}
			}
			http.ServeContent(w, r, "m", time.Time{}, bytes.NewReader(data))
		}))
		dst := filepath.Join(b.TempDir(), "dst")
		b.Run(bc.name+"/single-stream", func(b *testing.B) {
			b.SetBytes(size)
			for b.Loop() {
				resp, err := srv.Client().Get(srv.URL)
				if err != nil {
					b.Fatal(err)
				}
				copySequential(b, resp.Body, dst)
				_ = resp.Body.Close()
				removeOrFail(b, dst)
			}
		})
		b.Run(bc.name+"/ranged", func(b *testing.B) {
			b.SetBytes(size)
			src := &HTTP{Client: srv.Client()}
			pool := NewPool(DefaultConcurrency, 4<<20)
			for b.Loop() {
				if _, err := Fetch(b.Context(), src, srv.URL, dst, Options{ChunkSize: 4 << 20, Pool: pool}); err != nil {
					b.Fatal(err)
				}
				removeOrFail(b, dst)
			}
		})
		srv.Close()
	}
}
