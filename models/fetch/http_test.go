package fetch

import (
	"bytes"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestFetchHTTP(t *testing.T) {
	data := randomBytes(10_000)
	serve := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("ETag", `"abc"`)
		http.ServeContent(w, r, "m", time.Time{}, bytes.NewReader(data))
	}
	cases := map[string]struct {
		handler   func(calls *atomic.Int32) http.HandlerFunc
		want      Result
		wantErr   string
		wantCalls int32 // requests, HEAD included; 0 skips the check
	}{
		"ranges": {
			handler: func(*atomic.Int32) http.HandlerFunc { return serve },
			want:    Result{Size: 10_000, ReadBytes: 10_000},
			// HEAD + 10 ranges of 1000 bytes.
			wantCalls: 11,
		},
		"server ignores Range": {
			handler: func(*atomic.Int32) http.HandlerFunc {
				return func(w http.ResponseWriter, r *http.Request) {
					r.Header.Del("Range")
					serve(w, r)
				}
			},
			// Every range got a 200, so only the stream's bytes count.
			want: Result{Size: 10_000, ReadBytes: 10_000, SingleStream: true},
		},
		"flaky server": {
			handler: func(calls *atomic.Int32) http.HandlerFunc {
				return func(w http.ResponseWriter, r *http.Request) {
					if r.Method == http.MethodGet && r.Header.Get("Range") == "bytes=3000-3999" && calls.Add(1) <= 2 {
						http.Error(w, "busy", http.StatusServiceUnavailable)
						return
					}
					serve(w, r)
				}
			},
			want: Result{Size: 10_000, ReadBytes: 10_000},
			// HEAD + 10 ranges + 2 refused tries.
			wantCalls: 13,
		},
		"wrong Content-Range": {
			handler: func(*atomic.Int32) http.HandlerFunc {
				return func(w http.ResponseWriter, r *http.Request) {
					if r.Method == http.MethodGet {
						w.Header().Set("Content-Range", "bytes 0-999/10000")
						w.WriteHeader(http.StatusPartialContent)
						_, _ = w.Write(data[:1000])
						return
					}
					serve(w, r)
				}
			},
			wantErr: `server answered Content-Range "bytes 0-999/10000"`,
		},
		"not found is not retried": {
			handler: func(calls *atomic.Int32) http.HandlerFunc {
				return func(w http.ResponseWriter, r *http.Request) {
					calls.Add(1)
					http.NotFound(w, r)
				}
			},
			wantErr:   "404 Not Found",
			wantCalls: 1,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var calls, all atomic.Int32
			h := tc.handler(&calls)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				all.Add(1)
				h(w, r)
			}))
			defer srv.Close()
			dst := filepath.Join(t.TempDir(), "m")
			got, err := Fetch(t.Context(), &HTTP{Client: srv.Client()}, srv.URL+"/m", dst, Options{ChunkSize: 1000, Concurrency: 3, SHA256: digest(data), Backoff: noBackoff})
			if tc.wantCalls != 0 && all.Load() != tc.wantCalls {
				t.Errorf("server got %d requests, want %d", all.Load(), tc.wantCalls)
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Fetch() error = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Fetch() error = %v", err)
			}
			tc.want.SHA256 = digest(data)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Fetch() (-want,+got):\n%s", diff)
			}
			if b, _ := os.ReadFile(dst); !bytes.Equal(b, data) {
				t.Errorf("fetched file differs from the server's")
			}
		})
	}
}

func TestHTTPReadRangeWholeFileAnswer(t *testing.T) {
	// A 200 for a range that is the whole file is the right bytes; a 200 for
	// any other range is not.
	data := []byte("0123456789")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write(data)
	}))
	defer srv.Close()
	h := &HTTP{Client: srv.Client()}
	p := make([]byte, 10)
	if err := h.ReadRange(t.Context(), srv.URL, 0, p); err != nil || string(p) != string(data) {
		t.Errorf("whole-file range: %q, %v", p, err)
	}
	if err := h.ReadRange(t.Context(), srv.URL, 2, p[:3]); !errors.Is(err, ErrRangeIgnored) {
		t.Errorf("partial range answered with 200: error = %v, want ErrRangeIgnored", err)
	}
}
