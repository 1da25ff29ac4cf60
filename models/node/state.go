package node

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/apimachinery/pkg/types"

	"github.com/partita-dev/partita/internal/durable"
)

// The state directory holds volumes.json (the published volumes, whose pins
// a restart must restore) and keys/KEY.json (the model a cache entry holds,
// to take it out of the Model's status when it is evicted).

func (s *Service) volumesPath() string { return filepath.Join(s.cfg.StateDir, "volumes.json") }
func (s *Service) keyPath(key string) string {
	return filepath.Join(s.cfg.StateDir, "keys", key+".json")
}

func (s *Service) loadVolumes() (map[string]volume, error) {
	out := map[string]volume{}
	if s.cfg.StateDir == "" {
		return out, nil
	}
	b, err := os.ReadFile(s.volumesPath())
	if errors.Is(err, os.ErrNotExist) {
		return out, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read published volumes: %w", err)
	}
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, fmt.Errorf("read published volumes %s: %w", s.volumesPath(), err)
	}
	return out, nil
}

func (s *Service) saveVolumesLocked() error {
	if s.cfg.StateDir == "" {
		return nil
	}
	b, err := json.Marshal(s.volumes)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(s.cfg.StateDir, 0o755); err != nil {
		return err
	}
	return durable.WriteFile(s.volumesPath(), b, 0o600)
}

func (s *Service) rememberKey(key string, model types.NamespacedName) error {
	if s.cfg.StateDir == "" {
		return nil
	}
	b, err := json.Marshal(map[string]string{"namespace": model.Namespace, "name": model.Name})
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(s.keyPath(key)), 0o755); err != nil {
		return err
	}
	return durable.WriteFile(s.keyPath(key), b, 0o600)
}

// Evicted is the cache's eviction callback: the node no longer holds key.
func (s *Service) Evicted(key string) {
	s.cfg.Metrics.Evictions.Inc()
	if s.cfg.StateDir == "" {
		return
	}
	b, err := os.ReadFile(s.keyPath(key))
	if err != nil {
		s.cfg.Log.Error(err, "Evicted a cache entry of an unknown model", "key", key)
		return
	}
	var m map[string]string
	if err := json.Unmarshal(b, &m); err != nil {
		s.cfg.Log.Error(err, "Evicted a cache entry of an unknown model", "key", key)
		return
	}
	s.forget(types.NamespacedName{Namespace: m["namespace"], Name: m["name"]})
	_ = os.Remove(s.keyPath(key))
}
