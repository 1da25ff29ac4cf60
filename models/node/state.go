package node

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/apimachinery/pkg/types"

	"github.com/partita-dev/partita/api/v1alpha1"
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

// keyRecord is keys/KEY.json: the model a cache entry holds and, once the
// entry is complete, its verified files, which a later hit reports to a
// Model whose status has none (one recreated under the same name).
type keyRecord struct {
	Namespace string               `json:"namespace"`
	Name      string               `json:"name"`
	Files     []v1alpha1.ModelFile `json:"files,omitempty"`
}

func (s *Service) rememberKey(key string, model types.NamespacedName, files []v1alpha1.ModelFile) error {
	if s.cfg.StateDir == "" {
		return nil
	}
	b, err := json.Marshal(keyRecord{Namespace: model.Namespace, Name: model.Name, Files: files})
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(s.keyPath(key)), 0o755); err != nil {
		return err
	}
	return durable.WriteFile(s.keyPath(key), b, 0o600)
}

// keyRecord reads what rememberKey wrote for key.
func (s *Service) keyRecord(key string) (keyRecord, error) {
	var rec keyRecord
	if s.cfg.StateDir == "" {
		return rec, errors.New("no state directory")
	}
	b, err := os.ReadFile(s.keyPath(key))
	if err != nil {
		return rec, err
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return rec, fmt.Errorf("read %s: %w", s.keyPath(key), err)
	}
	return rec, nil
}

// Evicted is the cache's eviction callback: the node no longer holds key.
func (s *Service) Evicted(key string) {
	s.cfg.Metrics.Evictions.Inc()
	if s.cfg.StateDir == "" {
		return
	}
	rec, err := s.keyRecord(key)
	if err != nil {
		s.cfg.Log.Error(err, "Evicted a cache entry of an unknown model", "key", key)
		return
	}
	s.forget(types.NamespacedName{Namespace: rec.Namespace, Name: rec.Name})
	_ = os.Remove(s.keyPath(key))
}
