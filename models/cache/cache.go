// Package cache manages a node's model cache directory: one directory per key,
// filled once however many callers ask at the same time, kept under a size
// limit by evicting the least recently used entries that nobody pins, and
// indexed on disk so that a restarted agent keeps sizes and last-use times.
//
// Layout under the cache directory:
//
//	entries/KEY/   complete entries, each made complete before it got its name
//	tmp/           fills in progress and entries being deleted; emptied by New
//	index.json     sizes and last-use times, rewritten atomically
package cache

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"

	"github.com/partita-dev/partita/internal/durable"
)

// NoRoomError says an entry cannot fit under the limit without evicting
// entries that are pinned. Nothing is evicted when it is returned.
type NoRoomError struct {
	Key         string
	SizeBytes   int64
	LimitBytes  int64
	PinnedBytes int64
}

func (e *NoRoomError) Error() string {
	return fmt.Sprintf("cache entry %q needs %d bytes, but the limit is %d bytes and pinned entries hold %d", e.Key, e.SizeBytes, e.LimitBytes, e.PinnedBytes)
}

// Entry describes one complete cache entry.
type Entry struct {
	Key       string
	SizeBytes int64
	LastUsed  time.Time
	Pinned    bool
}

// FillFunc writes an entry's files into dir, which is its own and holds
// nothing but what an earlier, interrupted fill of the same key left there
// (to resume from, or to overwrite). ctx ends when every caller waiting for the entry has gone.
type FillFunc func(ctx context.Context, dir string) error

// Cache is safe for concurrent use.
type Cache struct {
	dir     string
	limit   int64
	clock   clock.PassiveClock
	log     logr.Logger
	onEvict func(key string)

	lock    sync.Mutex
	entries map[string]*record
	flights map[string]*flight
	// pins counts users per key; a key may be pinned before it is cached,
	// so that an admitted pod's model is safe from the moment it is fetched.
	pins map[string]int
}

type record struct {
	SizeBytes int64     `json:"sizeBytes"`
	LastUsed  time.Time `json:"lastUsed"`
}

// flight is one fill that callers of a key share.
type flight struct {
	done    chan struct{}
	waiters int
	cancel  context.CancelFunc
	path    string
	err     error
}

// Option configures a Cache.
type Option func(*Cache)

// WithClock sets the clock that stamps last use.
func WithClock(c clock.PassiveClock) Option { return func(k *Cache) { k.clock = c } }

// WithOnEvict calls f with each key evicted to make room, after its entry
// is gone (outside the cache's lock).
func WithOnEvict(f func(key string)) Option { return func(k *Cache) { k.onEvict = f } }

// WithLogger sets the logger.
func WithLogger(l logr.Logger) Option { return func(k *Cache) { k.log = l } }

// New opens (creating if needed) the cache in dir with a limit in bytes. It
// discards unfinished fills left by a crash and reconciles the index with the
// entries on disk.
func New(dir string, limitBytes int64, opts ...Option) (*Cache, error) {
	c := &Cache{
		dir: dir, limit: limitBytes, clock: clock.RealClock{},
		entries: map[string]*record{}, flights: map[string]*flight{}, pins: map[string]int{},
	}
	for _, o := range opts {
		o(c)
	}
	if limitBytes <= 0 {
		return nil, fmt.Errorf("open cache %s: limit must be positive, got %d", dir, limitBytes)
	}
	if err := c.clearTrash(); err != nil {
		return nil, fmt.Errorf("open cache %s: %w", dir, err)
	}
	for _, d := range []string{c.entriesDir(), c.tmpDir()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("open cache %s: %w", dir, err)
		}
	}
	if err := c.load(); err != nil {
		return nil, fmt.Errorf("open cache %s: %w", dir, err)
	}
	return c, nil
}

func (c *Cache) entriesDir() string { return filepath.Join(c.dir, "entries") }
func (c *Cache) tmpDir() string     { return filepath.Join(c.dir, "tmp") }
func (c *Cache) indexPath() string  { return filepath.Join(c.dir, "index.json") }

// Path is where key's entry lives once complete.
func (c *Cache) Path(key string) string { return filepath.Join(c.entriesDir(), key) }

// keyPattern keeps keys to one safe path element.
var keyPattern = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._-]{0,199}$`)

func validKey(key string) error {
	if !keyPattern.MatchString(key) {
		return fmt.Errorf("invalid cache key %q: want letters, digits, '.', '_' and '-', not starting with '.' or '-', at most 200", key)
	}
	return nil
}

// Get returns the directory of key's entry, calling fill to make it when it is
// not cached. Concurrent callers of one key share one fill. A new entry that
// does not fit under the limit evicts the least recently used unpinned
// entries; if even that is not enough, Get returns a *NoRoomError and evicts
// nothing.
//
// Pin a key before Get when the entry must not be evicted between Get
// returning and its user starting.
func (c *Cache) Get(ctx context.Context, key string, fill FillFunc) (string, error) {
	if err := validKey(key); err != nil {
		return "", err
	}
	c.lock.Lock()
	if r, ok := c.entries[key]; ok {
		r.LastUsed = c.clock.Now()
		err := c.saveLocked()
		c.lock.Unlock()
		if err != nil {
			// The entry is fine; only its last use may be forgotten.
			c.log.Error(err, "Could not record cache use", "key", key)
		}
		return c.Path(key), nil
	}
	fl, ok := c.flights[key]
	if !ok {
		if fill == nil {
			c.lock.Unlock()
			return "", fmt.Errorf("get cache entry %s: not cached and no fill given", key)
		}
		// The fill outlives any one caller: it stops only when all have left.
		fillCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		fl = &flight{done: make(chan struct{}), cancel: cancel}
		c.flights[key] = fl
		go c.runFill(fillCtx, key, fl, fill)
	}
	fl.waiters++
	c.lock.Unlock()

	select {
	case <-fl.done:
		return fl.path, fl.err
	case <-ctx.Done():
		c.lock.Lock()
		fl.waiters--
		if fl.waiters == 0 {
			fl.cancel()
			// A caller arriving now starts afresh rather than joining a
			// fill that is being cancelled.
			if c.flights[key] == fl {
				delete(c.flights, key)
			}
		}
		c.lock.Unlock()
		return "", fmt.Errorf("get cache entry %s: %w", key, ctx.Err())
	}
}

func (c *Cache) runFill(ctx context.Context, key string, fl *flight, fill FillFunc) {
	defer fl.cancel()
	path, err := c.fill(ctx, key, fill)
	c.lock.Lock()
	if c.flights[key] == fl {
		delete(c.flights, key)
	}
	fl.path, fl.err = path, err
	c.lock.Unlock()
	close(fl.done)
}

// fill makes the entry under tmp/, then makes room and renames it into place,
// so that entries/ only ever holds complete entries.
func (c *Cache) fill(ctx context.Context, key string, fill FillFunc) (string, error) {
	// One fill per key runs at a time (single flight), so its directory
	// can be named by the key: a fill interrupted by a failure or a
	// restart leaves what it fetched there for the next to resume.
	tmp := c.fillDir(key)
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return "", fmt.Errorf("fill cache entry %s: %w", key, err)
	}
	if err := fill(ctx, tmp); err != nil {
		return "", fmt.Errorf("fill cache entry %s: %w", key, err)
	}
	size, err := syncTree(tmp)
	if err != nil {
		return "", fmt.Errorf("fill cache entry %s: %w", key, err)
	}

	c.lock.Lock()
	evicted, trash, err := c.commitLocked(key, tmp, size)
	c.lock.Unlock()
	for _, t := range trash {
		if rerr := os.RemoveAll(t); rerr != nil {
			c.log.Error(rerr, "Could not delete evicted cache entry", "path", t)
		}
	}
	if err != nil {
		_ = os.RemoveAll(tmp)
		return "", fmt.Errorf("fill cache entry %s: %w", key, err)
	}
	for _, v := range evicted {
		if c.onEvict != nil {
			c.onEvict(v)
		}
	}
	return c.Path(key), nil
}

// fillDir is where key's entry is made, under tmp/.
func (c *Cache) fillDir(key string) string { return filepath.Join(c.tmpDir(), key+".fill") }

// commitLocked evicts what must go and renames tmp to key's entry. It returns
// the evicted keys and their directories, moved under tmp/ for deletion
// outside the lock.
func (c *Cache) commitLocked(key, tmp string, size int64) (evicted, trash []string, err error) {
	if r, ok := c.entries[key]; ok {
		// A fill that was cancelled but finished anyway lost the race.
		r.LastUsed = c.clock.Now()
		return nil, nil, nil
	}
	victims, err := c.victimsLocked(key, size)
	if err != nil {
		return nil, nil, err
	}
	for _, v := range victims {
		t := filepath.Join(c.tmpDir(), v+".evicted-for-"+key)
		if err := os.Rename(c.Path(v), t); err != nil {
			return evicted, trash, errors.Join(fmt.Errorf("evict %s: %w", v, err), c.saveLocked())
		}
		delete(c.entries, v)
		evicted, trash = append(evicted, v), append(trash, t)
		c.log.V(2).Info("Evicted cache entry", "key", v, "for", key)
	}
	if err := os.Rename(tmp, c.Path(key)); err != nil {
		// The evictions happened; the index must say so.
		return evicted, trash, errors.Join(fmt.Errorf("rename into place: %w", err), c.saveLocked())
	}
	if err := durable.SyncDir(c.entriesDir()); err != nil {
		return evicted, trash, err
	}
	c.entries[key] = &record{SizeBytes: size, LastUsed: c.clock.Now()}
	return evicted, trash, c.saveLocked()
}

// victimsLocked picks the least recently used unpinned entries whose removal
// lets size more bytes fit, or says why none can.
func (c *Cache) victimsLocked(key string, size int64) ([]string, error) {
	var used, pinned int64
	var candidates []string
	for k, r := range c.entries {
		used += r.SizeBytes
		if c.pins[k] > 0 {
			pinned += r.SizeBytes
		} else {
			candidates = append(candidates, k)
		}
	}
	if pinned+size > c.limit {
		return nil, &NoRoomError{Key: key, SizeBytes: size, LimitBytes: c.limit, PinnedBytes: pinned}
	}
	sort.Slice(candidates, func(i, j int) bool {
		a, b := c.entries[candidates[i]], c.entries[candidates[j]]
		if !a.LastUsed.Equal(b.LastUsed) {
			return a.LastUsed.Before(b.LastUsed)
		}
		return candidates[i] < candidates[j]
	})
	var victims []string
	for _, k := range candidates {
		if used+size <= c.limit {
			break
		}
		victims = append(victims, k)
		used -= c.entries[k].SizeBytes
	}
	return victims, nil
}

// Pin marks key as in use (by a running or admitted pod); a pinned entry is
// never evicted. Pins count, and live in memory only: after a restart the
// agent pins again for the pods it finds.
func (c *Cache) Pin(key string) {
	c.lock.Lock()
	defer c.lock.Unlock()
	c.pins[key]++
}

// Unpin drops one pin of key; the entry becomes evictable at zero.
func (c *Cache) Unpin(key string) {
	c.lock.Lock()
	defer c.lock.Unlock()
	if c.pins[key] <= 1 {
		delete(c.pins, key)
		return
	}
	c.pins[key]--
}

// Discard deletes what failed fills of key left, when none runs: for a
// failure that resuming cannot fix (the source changed, a digest lied).
func (c *Cache) Discard(key string) error {
	if err := validKey(key); err != nil {
		return err
	}
	c.lock.Lock()
	defer c.lock.Unlock()
	if _, ok := c.flights[key]; ok {
		return nil
	}
	if err := os.RemoveAll(c.fillDir(key)); err != nil {
		return fmt.Errorf("discard the fill of %s: %w", key, err)
	}
	return nil
}

// Has reports whether key's entry is complete.
func (c *Cache) Has(key string) bool {
	c.lock.Lock()
	defer c.lock.Unlock()
	_, ok := c.entries[key]
	return ok
}

// Size is the bytes of key's complete entry; 0 when there is none.
func (c *Cache) Size(key string) int64 {
	c.lock.Lock()
	defer c.lock.Unlock()
	if r, ok := c.entries[key]; ok {
		return r.SizeBytes
	}
	return 0
}

// Entries lists the complete entries, most recently used first.
func (c *Cache) Entries() []Entry {
	c.lock.Lock()
	defer c.lock.Unlock()
	out := make([]Entry, 0, len(c.entries))
	for k, r := range c.entries {
		out = append(out, Entry{Key: k, SizeBytes: r.SizeBytes, LastUsed: r.LastUsed, Pinned: c.pins[k] > 0})
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].LastUsed.Equal(out[j].LastUsed) {
			return out[i].LastUsed.After(out[j].LastUsed)
		}
		return out[i].Key < out[j].Key
	})
	return out
}

// syncTree fsyncs every file and directory under root, so that an entry is on
// disk before its rename says it is complete, and returns the bytes it holds.
func syncTree(root string) (int64, error) {
	var size int64
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && !d.Type().IsRegular() {
			return nil // symlinks hold no data of their own
		}
		if !d.IsDir() {
			fi, err := d.Info()
			if err != nil {
				return err
			}
			size += fi.Size()
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer func() { _ = f.Close() }()
		return f.Sync()
	})
	if err != nil {
		return 0, fmt.Errorf("sync %s: %w", root, err)
	}
	return size, nil
}

// clearTrash deletes what evictions left under tmp/ and the fills of keys
// that are complete; unfinished fills stay, to be resumed.
func (c *Cache) clearTrash() error {
	ents, err := os.ReadDir(c.tmpDir())
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", c.tmpDir(), err)
	}
	for _, e := range ents {
		key, fill := strings.CutSuffix(e.Name(), ".fill")
		if fill && e.IsDir() && validKey(key) == nil {
			if _, err := os.Stat(c.Path(key)); errors.Is(err, os.ErrNotExist) {
				continue
			}
		}
		if err := os.RemoveAll(filepath.Join(c.tmpDir(), e.Name())); err != nil {
			return fmt.Errorf("clear %s: %w", e.Name(), err)
		}
	}
	return nil
}
