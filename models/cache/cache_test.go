package cache

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	testingclock "k8s.io/utils/clock/testing"
)

var t0 = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)

// fillBytes is a fill that writes n bytes into one file.
func fillBytes(n int) FillFunc {
	return func(_ context.Context, dir string) error {
		return os.WriteFile(filepath.Join(dir, "weights"), make([]byte, n), 0o644)
	}
}

func TestGetSingleFlight(t *testing.T) {
	c, err := New(t.TempDir(), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	var fills atomic.Int32
	release := make(chan struct{})
	fill := func(ctx context.Context, dir string) error {
		fills.Add(1)
		<-release
		return fillBytes(100)(ctx, dir)
	}
	const callers = 10
	paths := make([]string, callers)
	errs := make([]error, callers)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() { paths[i], errs[i] = c.Get(t.Context(), "llama-3", fill) })
	}
	// Release the fill only once every caller is waiting on it.
	for {
		c.lock.Lock()
		fl := c.flights["llama-3"]
		n := 0
		if fl != nil {
			n = fl.waiters
		}
		c.lock.Unlock()
		if n == callers {
			break
		}
		time.Sleep(time.Millisecond)
	}
	close(release)
	wg.Wait()
	if got := fills.Load(); got != 1 {
		t.Errorf("fill ran %d times for %d concurrent callers, want 1", got, callers)
	}
	for i := range callers {
		if errs[i] != nil || paths[i] != c.Path("llama-3") {
			t.Errorf("caller %d got (%q, %v), want (%q, nil)", i, paths[i], errs[i], c.Path("llama-3"))
		}
	}
	if _, err := os.Stat(filepath.Join(c.Path("llama-3"), "weights")); err != nil {
		t.Errorf("entry has no file: %v", err)
	}
	// A later Get is a hit.
	if _, err := c.Get(t.Context(), "llama-3", fill); err != nil || fills.Load() != 1 {
		t.Errorf("cached Get: err %v, fills %d; want nil, 1", err, fills.Load())
	}
}

func TestGetEviction(t *testing.T) {
	type existing struct {
		key  string
		size int
	}
	cases := map[string]struct {
		limit    int64
		existing []existing // filled in order, one minute apart: first is oldest
		touch    []string   // Get again, after all fills, in order
		pins     []string
		newSize  int
		want     []string // keys left, most recent first
		wantErr  *NoRoomError
	}{
		"fits without eviction": {
			limit: 1000, existing: []existing{{"a", 300}, {"b", 300}}, newSize: 300,
			want: []string{"new", "b", "a"},
		},
		"evicts least recently used": {
			limit: 1000, existing: []existing{{"a", 300}, {"b", 300}, {"c", 300}}, newSize: 300,
			want: []string{"new", "c", "b"},
		},
		"use refreshes an entry": {
			limit: 1000, existing: []existing{{"a", 300}, {"b", 300}, {"c", 300}}, touch: []string{"a"}, newSize: 300,
			want: []string{"new", "a", "c"},
		},
		"evicts as many as needed": {
			limit: 1000, existing: []existing{{"a", 300}, {"b", 300}, {"c", 300}}, newSize: 700,
			want: []string{"new", "c"},
		},
		"skips pinned entries": {
			limit: 1000, existing: []existing{{"a", 300}, {"b", 300}, {"c", 300}}, pins: []string{"a"}, newSize: 300,
			want: []string{"new", "c", "a"},
		},
		"pinned entries leave no room": {
			limit: 1000, existing: []existing{{"a", 400}, {"b", 400}, {"c", 100}}, pins: []string{"a", "b"}, newSize: 300,
			want:    []string{"c", "b", "a"},
			wantErr: &NoRoomError{Key: "new", SizeBytes: 300, LimitBytes: 1000, PinnedBytes: 800},
		},
		"larger than the limit": {
			limit: 1000, newSize: 1001,
			want:    []string{},
			wantErr: &NoRoomError{Key: "new", SizeBytes: 1001, LimitBytes: 1000},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			clk := testingclock.NewFakePassiveClock(t0)
			c, err := New(t.TempDir(), tc.limit, WithClock(clk))
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range tc.existing {
				clk.SetTime(clk.Now().Add(time.Minute))
				if _, err := c.Get(t.Context(), e.key, fillBytes(e.size)); err != nil {
					t.Fatalf("fill %s: %v", e.key, err)
				}
			}
			for _, k := range tc.touch {
				clk.SetTime(clk.Now().Add(time.Minute))
				if _, err := c.Get(t.Context(), k, nil); err != nil {
					t.Fatalf("touch %s: %v", k, err)
				}
			}
			for _, k := range tc.pins {
				c.Pin(k)
			}
			clk.SetTime(clk.Now().Add(time.Minute))
			_, err = c.Get(t.Context(), "new", fillBytes(tc.newSize))
			if tc.wantErr != nil {
				var got *NoRoomError
				if !errors.As(err, &got) {
					t.Fatalf("Get() error = %v, want a NoRoomError", err)
				}
				if diff := cmp.Diff(tc.wantErr, got); diff != "" {
					t.Errorf("NoRoomError (-want,+got):\n%s", diff)
				}
			} else if err != nil {
				t.Fatalf("Get() error = %v", err)
			}
			got := []string{}
			for _, e := range c.Entries() {
				got = append(got, e.Key)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("entries (-want,+got):\n%s", diff)
			}
			// Evicted and refused entries leave nothing on disk.
			des, _ := os.ReadDir(filepath.Join(c.dir, "entries"))
			if len(des) != len(tc.want) {
				t.Errorf("%d entry directories on disk, want %d", len(des), len(tc.want))
			}
			if des, _ := os.ReadDir(c.tmpDir()); len(des) != 0 {
				t.Errorf("tmp/ holds %d leftovers, want none", len(des))
			}
		})
	}
}

func TestUnpinMakesEvictable(t *testing.T) {
	c, err := New(t.TempDir(), 100)
	if err != nil {
		t.Fatal(err)
	}
	c.Pin("a")
	c.Pin("a") // two pods
	if _, err := c.Get(t.Context(), "a", fillBytes(100)); err != nil {
		t.Fatal(err)
	}
	c.Unpin("a")
	var noRoom *NoRoomError
	if _, err := c.Get(t.Context(), "b", fillBytes(100)); !errors.As(err, &noRoom) {
		t.Fatalf("Get(b) with a still pinned once: error = %v, want NoRoomError", err)
	}
	c.Unpin("a")
	if _, err := c.Get(t.Context(), "b", fillBytes(100)); err != nil {
		t.Fatalf("Get(b) after the last unpin: %v", err)
	}
}

func TestGetFillFails(t *testing.T) {
	c, err := New(t.TempDir(), 1000)
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("origin down")
	_, err = c.Get(t.Context(), "m", func(_ context.Context, dir string) error {
		if err := os.WriteFile(filepath.Join(dir, "half"), []byte("x"), 0o644); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Get() error = %v, want %v", err, boom)
	}
	if _, err := os.Stat(c.Path("m")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a failed fill left an entry (stat: %v)", err)
	}
	// The next fill of the key resumes from what the failed one left, even
	// in a cache opened anew (an agent restart).
	c, err = New(c.dir, 1000)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	if _, err := c.Get(t.Context(), "m", func(ctx context.Context, dir string) error {
		des, _ := os.ReadDir(dir)
		for _, d := range des {
			left = append(left, d.Name())
		}
		return fillBytes(10)(ctx, dir)
	}); err != nil {
		t.Errorf("retry after a failed fill: %v", err)
	}
	if diff := cmp.Diff([]string{"half"}, left); diff != "" {
		t.Errorf("what the retry found (-want,+got):\n%s", diff)
	}
	if des, _ := os.ReadDir(c.tmpDir()); len(des) != 0 {
		t.Errorf("a completed fill left %d things in tmp/", len(des))
	}
}

func TestDiscardDropsAFailedFill(t *testing.T) {
	c, err := New(t.TempDir(), 1000)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Get(t.Context(), "m", func(_ context.Context, dir string) error {
		if err := os.WriteFile(filepath.Join(dir, "half"), []byte("x"), 0o644); err != nil {
			return err
		}
		return errors.New("digest mismatch")
	})
	if err == nil {
		t.Fatal("Get() succeeded with a failing fill")
	}
	if err := c.Discard("m"); err != nil {
		t.Fatalf("Discard() = %v", err)
	}
	if des, _ := os.ReadDir(c.tmpDir()); len(des) != 0 {
		t.Errorf("Discard left %d things in tmp/", len(des))
	}
}

func TestGetLastCallerLeavingCancelsFill(t *testing.T) {
	c, err := New(t.TempDir(), 1000)
	if err != nil {
		t.Fatal(err)
	}
	fillErr := make(chan error, 1)
	ctx, cancel := context.WithCancel(t.Context())
	go func() {
		time.Sleep(10 * time.Millisecond)
		cancel()
	}()
	_, err = c.Get(ctx, "m", func(ctx context.Context, _ string) error {
		<-ctx.Done()
		fillErr <- ctx.Err()
		return ctx.Err()
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Get() error = %v, want context.Canceled", err)
	}
	select {
	case err := <-fillErr:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("fill saw %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("fill was not cancelled when its only caller left")
	}
}

func TestRestartKeepsIndex(t *testing.T) {
	dir := t.TempDir()
	clk := testingclock.NewFakePassiveClock(t0)
	c, err := New(dir, 1000, WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	for i, k := range []string{"a", "b"} {
		clk.SetTime(t0.Add(time.Duration(i) * time.Hour))
		if _, err := c.Get(t.Context(), k, fillBytes(10*(i+1))); err != nil {
			t.Fatal(err)
		}
	}
	// A crash mid-fill leaves tmp/ behind; a crash between rename and index
	// write leaves an entry the index lacks.
	if err := os.MkdirAll(filepath.Join(dir, "tmp", "c.fill-123"), 0o755); err != nil {
		t.Fatal(err)
	}
	orphan := filepath.Join(dir, "entries", "d")
	if err := os.MkdirAll(orphan, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(orphan, "w"), make([]byte, 7), 0o644); err != nil {
		t.Fatal(err)
	}
	mtime := t0.Add(-time.Hour)
	if err := os.Chtimes(orphan, mtime, mtime); err != nil {
		t.Fatal(err)
	}

	c2, err := New(dir, 1000)
	if err != nil {
		t.Fatal(err)
	}
	want := []Entry{
		{Key: "b", SizeBytes: 20, LastUsed: t0.Add(time.Hour)},
		{Key: "a", SizeBytes: 10, LastUsed: t0},
		{Key: "d", SizeBytes: 7, LastUsed: mtime},
	}
	got := c2.Entries()
	for i := range got {
		got[i].LastUsed = got[i].LastUsed.UTC()
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("entries after restart (-want,+got):\n%s", diff)
	}
	if des, _ := os.ReadDir(filepath.Join(dir, "tmp")); len(des) != 0 {
		t.Errorf("tmp/ not emptied at start: %d leftovers", len(des))
	}
}

func TestInvalidKey(t *testing.T) {
	c, err := New(t.TempDir(), 1000)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"", ".", "..", "../x", "a/b", ".hidden", "-flag", strings.Repeat("a", 201)} {
		if _, err := c.Get(t.Context(), k, fillBytes(1)); err == nil {
			t.Errorf("Get(%q) accepted an invalid key", k)
		}
	}
}
