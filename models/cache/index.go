package cache

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/partita-dev/partita/internal/durable"
)

// indexFile is the on-disk index. Version lets a later layout refuse an old
// one instead of misreading it.
type indexFile struct {
	Version int                `json:"version"`
	Entries map[string]*record `json:"entries"`
}

const indexVersion = 1

// load reads the index and reconciles it with entries/: an entry on disk that
// the index lacks (the index write was lost in a crash) is measured and dated
// by its mtime; an index record without its directory is dropped.
func (c *Cache) load() error {
	var idx indexFile
	data, err := os.ReadFile(c.indexPath())
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return fmt.Errorf("read index: %w", err)
	default:
		if err := json.Unmarshal(data, &idx); err != nil || idx.Version != indexVersion {
			// The entries themselves are intact; only their history is lost.
			c.log.Error(err, "Ignoring unreadable cache index", "path", c.indexPath(), "version", idx.Version)
			idx = indexFile{}
		}
	}
	des, err := os.ReadDir(c.entriesDir())
	if err != nil {
		return fmt.Errorf("list entries: %w", err)
	}
	for _, de := range des {
		key := de.Name()
		if !de.IsDir() || validKey(key) != nil {
			c.log.Info("Ignoring stray file in cache", "name", key)
			continue
		}
		if r, ok := idx.Entries[key]; ok && r != nil {
			c.entries[key] = r
			continue
		}
		size, err := syncTree(c.Path(key))
		if err != nil {
			return err
		}
		fi, err := de.Info()
		if err != nil {
			return fmt.Errorf("stat entry %s: %w", key, err)
		}
		c.entries[key] = &record{SizeBytes: size, LastUsed: fi.ModTime()}
	}
	c.lock.Lock()
	defer c.lock.Unlock()
	return c.saveLocked()
}

// saveLocked rewrites the index atomically.
func (c *Cache) saveLocked() error {
	data, err := json.Marshal(indexFile{Version: indexVersion, Entries: c.entries})
	if err != nil {
		return fmt.Errorf("encode index: %w", err)
	}
	if err := durable.WriteFile(c.indexPath(), data, 0o644); err != nil {
		return fmt.Errorf("write index: %w", err)
	}
	return nil
}
