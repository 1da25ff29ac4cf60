// Package node is what one node does for models: it resolves a pod's Model
// at its source, fills the node's cache with the model's files once
// (single-flight, resumable, every file checksummed and every safetensors
// file validated), pins the entry while a pod uses it, and reports the
// node's copy in the Model's status. The CSI node plugin (models/csi) calls
// it; it knows nothing of CSI.
package node

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"

	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/models/cache"
	"github.com/partita-dev/partita/models/fetch"
	"github.com/partita-dev/partita/models/origin"
	"github.com/partita-dev/partita/models/peer"
	"github.com/partita-dev/partita/models/safetensors"
)

// Config is what a Service needs.
type Config struct {
	NodeName string
	Cache    *cache.Cache
	// Client reads Models (live: a pod must not wait on an informer) and
	// applies their status.
	Client client.Client
	// Fetch tunes every file's fetch; its Pool, shared, bounds the memory
	// of all fills at once.
	Fetch fetch.Options
	// StateDir keeps the published volumes (their pins) and which model
	// each cache entry holds, across restarts.
	StateDir   string
	HTTPClient *http.Client
	// FileRoots are the directories file:// sources may name.
	FileRoots []string
	// Peer is this cache's peer server, published with each Ready copy so
	// that other nodes fetch from it (nil: it serves no peer).
	Peer *v1alpha1.ModelPeer
	// PeerToken returns the token presented to other nodes' caches (nil:
	// models are fetched from their source only).
	PeerToken func() (string, error)
	Clock     clock.WithTicker
	Log       logr.Logger
	Metrics   *Metrics
	// ProgressInterval is how often a fill's bytes reach the Model's status.
	ProgressInterval time.Duration
}

// Service is safe for concurrent use.
type Service struct {
	cfg Config
	// ctx outlives any one request: a fill goes on after the kubelet's
	// call that started it times out, so that its retry finds it further.
	ctx context.Context

	lock    sync.Mutex
	fills   map[string]*fill
	volumes map[string]volume
	// prefetching are the Models whose prefetch is being resolved.
	prefetching map[types.NamespacedName]bool
	// checked are the versions Models resolved to, and when.
	checked map[types.NamespacedName]checked
	// held are the entries prefetched for admitted pods, pinned until the
	// time given (AdmittedHold after the prefetch).
	held map[string]time.Time
}

// fill is one model version being fetched into the cache.
type fill struct {
	key     string
	model   types.NamespacedName
	total   int64
	done    atomic.Int64
	started time.Time
	finish  chan struct{}
	dir     string
	err     error
}

// volume is one published pod volume: it pins its entry.
type volume struct {
	Key       string `json:"key"`
	Namespace string `json:"namespace"`
	Model     string `json:"model"`
}

// New returns a Service whose fills run until ctx ends. It re-pins the
// volumes published before a restart.
func New(ctx context.Context, cfg Config) (*Service, error) {
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	if cfg.ProgressInterval <= 0 {
		cfg.ProgressInterval = 5 * time.Second
	}
	s := &Service{cfg: cfg, ctx: ctx, fills: map[string]*fill{}, volumes: map[string]volume{}, prefetching: map[types.NamespacedName]bool{}, checked: map[types.NamespacedName]checked{}, held: map[string]time.Time{}}
	vols, err := s.loadVolumes()
	if err != nil {
		return nil, err
	}
	for id, v := range vols {
		s.volumes[id] = v
		cfg.Cache.Pin(v.Key)
	}
	return s, nil
}

// PublishRequest asks for a model's directory for one pod volume.
type PublishRequest struct {
	VolumeID  string
	Namespace string
	Model     string
	// Secret is the data of the Model's secretRef, as the kubelet handed it.
	Secret map[string][]byte
}

// StillFetchingError says the model is not complete yet; the caller tries
// again later (the kubelet does, and shows the message on the pod).
type StillFetchingError struct{ Message string }

func (e *StillFetchingError) Error() string { return e.Message }

// NotFoundError says the pod's namespace has no such Model.
type NotFoundError struct{ Namespace, Model string }

func (e *NotFoundError) Error() string {
	return fmt.Sprintf("no Model %q in namespace %q", e.Model, e.Namespace)
}

// Publish returns the directory that holds the model's complete, verified
// files, pinned until Unpublish of the same volume. It waits for a fill
// while ctx allows (less a margin to answer in), then returns a
// *StillFetchingError that says how far the fill is.
func (s *Service) Publish(ctx context.Context, req PublishRequest) (string, error) {
	log := s.cfg.Log.WithValues("model", req.Namespace+"/"+req.Model, "volume", req.VolumeID)
	s.lock.Lock()
	if v, ok := s.volumes[req.VolumeID]; ok && s.cfg.Cache.Has(v.Key) {
		s.lock.Unlock()
		return s.cfg.Cache.Path(v.Key), nil
	}
	s.lock.Unlock()

	m := &v1alpha1.Model{}
	if err := s.cfg.Client.Get(ctx, types.NamespacedName{Namespace: req.Namespace, Name: req.Model}, m); err != nil {
		if apierrors.IsNotFound(err) {
			return "", &NotFoundError{Namespace: req.Namespace, Model: req.Model}
		}
		return "", fmt.Errorf("read Model %s/%s: %w", req.Namespace, req.Model, err)
	}
	if version, ok := s.recentVersion(m); ok {
		// Listed and fetched a moment ago: no request to the source at all.
		if dir, err := s.pinVolume(req, version); err == nil {
			s.cfg.Metrics.Hits.Inc()
			if e := m.Status.ModelNode(s.cfg.NodeName); e == nil || e.Phase != v1alpha1.ModelReady || e.Version != version {
				s.reportCached(m, version)
			}
			return dir, nil
		}
	}
	res, err := origin.Resolve(ctx, m.Spec, origin.Options{Secret: req.Secret, HTTPClient: s.cfg.HTTPClient, FileRoots: s.cfg.FileRoots, Namespace: req.Namespace})
	if err != nil {
		err = fmt.Errorf("model %s/%s: %w", req.Namespace, req.Model, err)
		s.report(m, nodeEntry{phase: v1alpha1.ModelFailed, message: err.Error()})
		return "", err
	}
	f := s.startFill(m, res)

	wait := s.cfg.Clock.NewTimer(waitBudget(ctx, s.cfg.Clock.Now()))
	defer wait.Stop()
	select {
	case <-f.finish:
	case <-wait.C():
		return "", &StillFetchingError{Message: f.progress(s.cfg.Clock.Now(), s.cfg.NodeName)}
	case <-ctx.Done():
		return "", &StillFetchingError{Message: f.progress(s.cfg.Clock.Now(), s.cfg.NodeName)}
	}
	if f.err != nil {
		return "", f.err
	}
	s.rememberVersion(m, res.Version)
	dir, err := s.pinVolume(req, res.Version)
	if err != nil {
		log.Info("Model evicted as it completed; fetching again")
	}
	return dir, err
}

// pinVolume pins version for the volume, then checks the entry is still
// there: another fill may have evicted it before the pin.
func (s *Service) pinVolume(req PublishRequest, version string) (string, error) {
	s.lock.Lock()
	defer s.lock.Unlock()
	if old, ok := s.volumes[req.VolumeID]; ok && old.Key != version {
		s.cfg.Cache.Unpin(old.Key)
		delete(s.volumes, req.VolumeID)
	}
	if _, ok := s.volumes[req.VolumeID]; !ok {
		s.cfg.Cache.Pin(version)
	}
	if !s.cfg.Cache.Has(version) {
		s.cfg.Cache.Unpin(version)
		delete(s.volumes, req.VolumeID)
		return "", &StillFetchingError{Message: fmt.Sprintf("model %s/%s on node %s: evicted as it completed; fetching again", req.Namespace, req.Model, s.cfg.NodeName)}
	}
	s.volumes[req.VolumeID] = volume{Key: version, Namespace: req.Namespace, Model: req.Model}
	if err := s.saveVolumesLocked(); err != nil {
		s.cfg.Log.Error(err, "Could not record the volume: its pin is lost if the cache restarts", "volume", req.VolumeID)
	}
	return s.cfg.Cache.Path(version), nil
}

// RevalidateAfter is how long a model's listing at its source is trusted:
// within it, another pod of the same Model (unchanged) is served from the
// cache without a request to the source; after it, the source is listed
// again and a changed file makes a new version.
const RevalidateAfter = 10 * time.Minute

type checked struct {
	version string
	// uid and generation say it is the same Model with the same spec: one
	// deleted and made again under its name starts at generation 1 again.
	uid        types.UID
	generation int64
	at         time.Time
}

// recentVersion is the version m resolved to within RevalidateAfter, when
// the cache holds it and m's spec has not changed since.
func (s *Service) recentVersion(m *v1alpha1.Model) (string, bool) {
	s.lock.Lock()
	c, ok := s.checked[types.NamespacedName{Namespace: m.Namespace, Name: m.Name}]
	s.lock.Unlock()
	if !ok || c.uid != m.UID || c.generation != m.Generation || s.cfg.Clock.Since(c.at) > RevalidateAfter || !s.cfg.Cache.Has(c.version) {
		return "", false
	}
	return c.version, true
}

func (s *Service) rememberVersion(m *v1alpha1.Model, version string) {
	s.lock.Lock()
	defer s.lock.Unlock()
	s.checked[types.NamespacedName{Namespace: m.Namespace, Name: m.Name}] = checked{version: version, uid: m.UID, generation: m.Generation, at: s.cfg.Clock.Now()}
}

// waitBudget is how long Publish waits for a fill: until ctx's deadline less
// 10 s to answer in, at most 100 s (the kubelet gives a mount 2 minutes).
func waitBudget(ctx context.Context, now time.Time) time.Duration {
	budget := 100 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		budget = min(budget, dl.Sub(now)-10*time.Second)
	}
	return max(budget, time.Second)
}

// Unpublish drops the volume's pin. Unknown volumes are fine (idempotent).
func (s *Service) Unpublish(volumeID string) error {
	s.lock.Lock()
	defer s.lock.Unlock()
	v, ok := s.volumes[volumeID]
	if !ok {
		return nil
	}
	delete(s.volumes, volumeID)
	s.cfg.Cache.Unpin(v.Key)
	return s.saveVolumesLocked()
}

// startFill joins the fill of res's version or starts it.
func (s *Service) startFill(m *v1alpha1.Model, res *origin.Resolved) *fill {
	s.lock.Lock()
	defer s.lock.Unlock()
	if f, ok := s.fills[res.Version]; ok {
		return f
	}
	f := &fill{
		key: res.Version, model: types.NamespacedName{Namespace: m.Namespace, Name: m.Name},
		total: res.Size(), started: s.cfg.Clock.Now(), finish: make(chan struct{}),
	}
	s.fills[res.Version] = f
	go s.runFill(m, res, f)
	return f
}

func (s *Service) runFill(m *v1alpha1.Model, res *origin.Resolved, f *fill) {
	log := s.cfg.Log.WithValues("model", f.model.String(), "version", f.key)
	hit := s.cfg.Cache.Has(f.key)
	var files []v1alpha1.ModelFile
	if !hit {
		s.cfg.Metrics.Misses.Inc()
		s.report(m, nodeEntry{phase: v1alpha1.ModelFetching, bytes: 0, total: f.total, version: f.key, message: "fetching"})
		if err := s.rememberKey(f.key, f.model, nil); err != nil {
			log.Error(err, "Could not record which model a cache entry holds")
		}
	} else {
		s.cfg.Metrics.Hits.Inc()
	}
	stop := make(chan struct{})
	go s.reportProgress(m, f, stop)
	// A fill may evict: holds that ran out give their entries up first.
	s.releaseExpiredHolds()
	dir, err := s.cfg.Cache.Get(s.ctx, f.key, func(ctx context.Context, dir string) error {
		var err error
		files, err = s.fetchFiles(ctx, res, dir, f, s.peersOf(m, res.Version))
		return err
	})
	close(stop)
	f.dir, f.err = dir, err
	// The status says the outcome before any waiter returns with it.
	defer func() {
		s.lock.Lock()
		delete(s.fills, f.key)
		s.lock.Unlock()
		close(f.finish)
	}()

	now := s.cfg.Clock.Now()
	switch {
	case err != nil:
		s.cfg.Metrics.Failures.Inc()
		var nr *cache.NoRoomError
		msg := fmt.Sprintf("model %s on node %s: %v", f.model, s.cfg.NodeName, err)
		if errors.As(err, &nr) {
			msg = fmt.Sprintf("model %s on node %s: %d bytes do not fit the node's model cache (%d bytes, %d held by models that pods use)", f.model, s.cfg.NodeName, nr.SizeBytes, nr.LimitBytes, nr.PinnedBytes)
		}
		f.err = errors.New(msg)
		if origin.IsPermanent(err) {
			_ = s.cfg.Cache.Discard(f.key)
		}
		log.Error(err, "Model fill failed")
		s.report(m, nodeEntry{phase: v1alpha1.ModelFailed, bytes: f.done.Load(), total: f.total, version: f.key, message: msg})
	case hit:
		s.reportCached(m, f.key)
	default:
		if err := s.rememberKey(f.key, f.model, files); err != nil {
			log.Error(err, "Could not record the files of a cache entry")
		}
		secs := now.Sub(f.started).Seconds()
		log.Info("Model cached", "bytes", f.total, "seconds", secs)
		s.cfg.Metrics.FetchSeconds.Observe(secs)
		s.report(m, nodeEntry{phase: v1alpha1.ModelReady, bytes: f.total, total: f.total, version: f.key,
			message: fmt.Sprintf("fetched %s in %.1fs", humanBytes(f.total), secs), files: files})
	}
}

// AdmittedHold is how long a model prefetched for admitted pods stays
// pinned without a pod using it: the pods bind within seconds and the
// kubelet mounts their volumes before it pulls their images, so this
// covers the time from admission to the mount with room to spare. The
// volume's own pin takes over from the mount on.
const AdmittedHold = 10 * time.Minute

// hold pins key for admitted pods until AdmittedHold from now (once per
// key; a later prefetch extends it).
func (s *Service) hold(key string) {
	s.lock.Lock()
	defer s.lock.Unlock()
	if _, ok := s.held[key]; !ok {
		s.cfg.Cache.Pin(key)
	}
	s.held[key] = s.cfg.Clock.Now().Add(AdmittedHold)
}

// releaseExpiredHolds unpins the holds that ran out.
func (s *Service) releaseExpiredHolds() {
	s.lock.Lock()
	defer s.lock.Unlock()
	now := s.cfg.Clock.Now()
	for key, until := range s.held {
		if !now.Before(until) {
			s.cfg.Cache.Unpin(key)
			delete(s.held, key)
		}
	}
}

// reportCached reports the node's copy of version, already in the cache,
// as Ready. A Model whose status lists no files (one made again under the
// name of a deleted one, which finds the node's copy from before) gets
// those verified when the copy was fetched.
func (s *Service) reportCached(m *v1alpha1.Model, version string) {
	size := s.cfg.Cache.Size(version)
	e := nodeEntry{phase: v1alpha1.ModelReady, bytes: size, total: size, version: version, message: "cached"}
	if len(m.Status.Files) == 0 {
		if rec, err := s.keyRecord(version); err == nil {
			e.files = rec.Files
		}
	}
	s.report(m, e)
}

// peersOf are the other nodes that hold version of m, with their peer
// servers.
func (s *Service) peersOf(m *v1alpha1.Model, version string) []v1alpha1.ModelPeer {
	if s.cfg.PeerToken == nil {
		return nil
	}
	var out []v1alpha1.ModelPeer
	for _, n := range m.Status.Nodes {
		if n.Name != s.cfg.NodeName && n.Phase == v1alpha1.ModelReady && n.Version == version && n.Peer != nil {
			out = append(out, *n.Peer)
		}
	}
	return out
}

// fetchFiles writes res's files under dir, each verified: from a peer that
// holds the same version when one answers, else from the source.
func (s *Service) fetchFiles(ctx context.Context, res *origin.Resolved, dir string, f *fill, peers []v1alpha1.ModelPeer) ([]v1alpha1.ModelFile, error) {
	out := make([]v1alpha1.ModelFile, 0, len(res.Files))
	var base int64
	for _, file := range res.Files {
		dst := filepath.Join(dir, filepath.FromSlash(file.Path))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return nil, fmt.Errorf("make directory for %s: %w", file.Path, err)
		}
		opts := s.cfg.Fetch
		opts.SHA256, opts.Digest = file.SHA256, true
		opts.Log = s.cfg.Log
		start := base
		opts.Progress = func(done, _ int64) { f.done.Store(start + done) }
		r, fromPeer, err := s.fetchFile(ctx, res, file, dst, opts, &peers)
		if err != nil {
			return nil, err
		}
		if fromPeer {
			s.cfg.Metrics.PeerBytes.Add(float64(r.ReadBytes))
		} else {
			s.cfg.Metrics.OriginBytes.Add(float64(r.ReadBytes))
		}
		if r.Size != file.Size {
			return nil, fmt.Errorf("%s: the source holds %d bytes, listed as %d: it changed while fetched", file.Path, r.Size, file.Size)
		}
		if strings.HasSuffix(file.Path, ".safetensors") {
			if err := validateSafetensors(dst); err != nil {
				_ = os.Remove(dst)
				return nil, fetch.Permanent(fmt.Errorf("%s: %w", file.Path, err))
			}
		}
		base += file.Size
		f.done.Store(base)
		out = append(out, v1alpha1.ModelFile{Path: file.Path, Size: file.Size, SHA256: r.SHA256})
	}
	return out, nil
}

// fetchFile fetches one file from the first peer that serves it, else from
// the source. A peer that fails is not asked again for this model.
func (s *Service) fetchFile(ctx context.Context, res *origin.Resolved, file origin.File, dst string, opts fetch.Options, peers *[]v1alpha1.ModelPeer) (fetch.Result, bool, error) {
	for len(*peers) > 0 {
		p := (*peers)[0]
		r, err := s.fromPeer(ctx, p, res.Version, file, dst, opts)
		if err == nil {
			return r, true, nil
		}
		var mismatch *fetch.DigestMismatchError
		if errors.As(err, &mismatch) && file.SHA256 != "" {
			// The pinned digest failed: the peer's copy is wrong, the
			// source may not be.
			s.cfg.Log.Error(err, "A peer's copy differs from the pinned digest", "peer", p.URL, "file", file.Path)
		} else {
			s.cfg.Log.Info("Could not fetch from a peer; trying the next, then the source", "peer", p.URL, "file", file.Path, "error", err.Error())
		}
		*peers = (*peers)[1:]
	}
	r, err := fetch.Fetch(ctx, res.Source, file.Name, dst, opts)
	return r, false, err
}

func (s *Service) fromPeer(ctx context.Context, p v1alpha1.ModelPeer, version string, file origin.File, dst string, opts fetch.Options) (fetch.Result, error) {
	token, err := s.cfg.PeerToken()
	if err != nil {
		return fetch.Result{}, fmt.Errorf("read the peer token: %w", err)
	}
	src, err := peer.NewSource(p, version, token)
	if err != nil {
		return fetch.Result{}, err
	}
	opts.Attempts = 2
	return fetch.Fetch(ctx, src, src.Name(file.Path), dst, opts)
}

func validateSafetensors(p string) error {
	file, err := os.Open(p)
	if err != nil {
		return err
	}
	defer func() { _ = file.Close() }()
	fi, err := file.Stat()
	if err != nil {
		return err
	}
	_, err = safetensors.Validate(file, fi.Size())
	return err
}

func (s *Service) reportProgress(m *v1alpha1.Model, f *fill, stop <-chan struct{}) {
	t := s.cfg.Clock.NewTicker(s.cfg.ProgressInterval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-s.ctx.Done():
			return
		case <-t.C():
			s.report(m, nodeEntry{phase: v1alpha1.ModelFetching, bytes: f.done.Load(), total: f.total, version: f.key,
				message: f.progress(s.cfg.Clock.Now(), s.cfg.NodeName)})
		}
	}
}

// progress is what a person waiting for the model reads.
func (f *fill) progress(now time.Time, node string) string {
	done := f.done.Load()
	pct := 100.0
	if f.total > 0 {
		pct = 100 * float64(done) / float64(f.total)
	}
	rate := ""
	if secs := now.Sub(f.started).Seconds(); secs > 0 && done > 0 {
		rate = fmt.Sprintf(" at %s/s", humanBytes(int64(float64(done)/secs)))
	}
	return fmt.Sprintf("waiting for model %s on %s: %.0f%% (%s of %s)%s", f.model.Name, node, pct, humanBytes(done), humanBytes(f.total), rate)
}

func humanBytes(n int64) string {
	const unit = 1000
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %cB", float64(n)/float64(div), "kMGTPE"[exp])
}
