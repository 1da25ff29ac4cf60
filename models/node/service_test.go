package node

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/internal/envtestutil"
	"github.com/partita-dev/partita/models/cache"
	"github.com/partita-dev/partita/models/fetch"
	"github.com/partita-dev/partita/models/prefetch"
)

// safetensorsFile is a valid file of one F32 tensor of n elements; lie
// makes its header claim one element more than the data holds.
func safetensorsFile(n int, lie bool) []byte {
	claimed := n * 4
	if lie {
		claimed += 4
	}
	hdr := []byte(`{"w":{"dtype":"F32","shape":[` + itoa(claimed/4) + `],"data_offsets":[0,` + itoa(claimed) + `]}}`)
	var b bytes.Buffer
	_ = binary.Write(&b, binary.LittleEndian, uint64(len(hdr)))
	b.Write(hdr)
	for i := range n * 4 {
		b.WriteByte(byte(i))
	}
	return b.Bytes()
}

func itoa(i int) string { return strconv.Itoa(i) }

type env struct {
	svc   *Service
	c     client.Client
	roots string
	cache *cache.Cache
	met   *Metrics
}

func newEnv(t *testing.T, limit int64, opts ...func(*Config)) *env {
	t.Helper()
	_, c := envtestutil.Start(t)
	if err := c.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}}); err != nil {
		t.Fatal(err)
	}
	roots := t.TempDir()
	e := &env{c: c, roots: roots, met: NewMetrics(nil)}
	var err error
	e.cache, err = cache.New(t.TempDir(), limit, cache.WithOnEvict(func(k string) { e.svc.Evicted(k) }))
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{
		NodeName: "node-1", Cache: e.cache, Client: c, StateDir: t.TempDir(), FileRoots: []string{roots},
		Fetch: fetch.Options{ChunkSize: 64 << 10, Concurrency: 2, Pool: fetch.NewPool(2, 64<<10)},
		Log:   testr.New(t), Metrics: e.met,
	}
	for _, o := range opts {
		o(&cfg)
	}
	e.svc, err = New(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *env) model(t *testing.T, name string, files map[string][]byte) *v1alpha1.Model {
	t.Helper()
	dir := filepath.Join(e.roots, name)
	for p, b := range files {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	m := &v1alpha1.Model{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: name},
		Spec: v1alpha1.ModelSpec{Source: v1alpha1.ModelSource{URI: "file://" + dir}}}
	if err := e.c.Create(t.Context(), m); err != nil {
		t.Fatal(err)
	}
	return m
}

func (e *env) status(t *testing.T, name string) v1alpha1.ModelStatus {
	t.Helper()
	m := &v1alpha1.Model{}
	if err := e.c.Get(t.Context(), client.ObjectKey{Namespace: "team-a", Name: name}, m); err != nil {
		t.Fatal(err)
	}
	return m.Status
}

func TestPublishServesVerifiedFilesOncePerNode(t *testing.T) {
	e := newEnv(t, 10<<20)
	files := map[string][]byte{
		"config.json":               []byte(`{"hidden_size": 4}`),
		"model-00001.safetensors":   safetensorsFile(100_000, false),
		"tokenizer/tokenizer.model": bytes.Repeat([]byte("t"), 3000),
		"nested/deeper/weights.bin": bytes.Repeat([]byte{7}, 70_000),
	}
	e.model(t, "llama", files)
	dir, err := e.svc.Publish(t.Context(), PublishRequest{VolumeID: "v1", Namespace: "team-a", Model: "llama"})
	if err != nil {
		t.Fatalf("Publish() = %v", err)
	}
	for p, want := range files {
		got, err := os.ReadFile(filepath.Join(dir, p))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s: read %d bytes (err %v), want the source's %d", p, len(got), err, len(want))
		}
	}
	originBefore := testutil.ToFloat64(e.met.OriginBytes)
	// A second pod's volume: served from the cache, no byte from the source.
	dir2, err := e.svc.Publish(t.Context(), PublishRequest{VolumeID: "v2", Namespace: "team-a", Model: "llama"})
	if err != nil || dir2 != dir {
		t.Fatalf("second Publish() = %q, %v; want %q", dir2, err, dir)
	}
	if got := testutil.ToFloat64(e.met.OriginBytes); got != originBefore {
		t.Errorf("the second pod read %v bytes from the source, want 0", got-originBefore)
	}
	if got := testutil.ToFloat64(e.met.Misses); got != 1 {
		t.Errorf("misses = %v, want 1 (one fetch per model per node)", got)
	}
	st := e.status(t, "llama")
	if n := st.ModelNode("node-1"); n == nil || n.Phase != v1alpha1.ModelReady || n.Bytes != n.Total || n.Total == 0 {
		t.Errorf("status.nodes[node-1] = %+v, want Ready with every byte", n)
	}
	var paths []string
	for _, f := range st.Files {
		if len(f.SHA256) != 64 {
			t.Errorf("status.files[%s].sha256 = %q, want a digest", f.Path, f.SHA256)
		}
		paths = append(paths, f.Path)
	}
	if diff := cmp.Diff([]string{"config.json", "model-00001.safetensors", "nested/deeper/weights.bin", "tokenizer/tokenizer.model"}, paths); diff != "" {
		t.Errorf("status.files (-want,+got):\n%s", diff)
	}
	// Both volumes pin the entry; it becomes evictable after both go.
	if err := e.svc.Unpublish("v1"); err != nil {
		t.Fatal(err)
	}
	if !pinned(e.cache) {
		t.Error("entry unpinned while the second volume uses it")
	}
	if err := e.svc.Unpublish("v2"); err != nil {
		t.Fatal(err)
	}
	if pinned(e.cache) {
		t.Error("entry still pinned after both volumes went")
	}
}

func pinned(c *cache.Cache) bool {
	for _, en := range c.Entries() {
		if en.Pinned {
			return true
		}
	}
	return false
}

func TestPublishRefuses(t *testing.T) {
	e := newEnv(t, 10<<20)
	e.model(t, "liar", map[string][]byte{"model.safetensors": safetensorsFile(1000, true)})
	outside := &v1alpha1.Model{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "etc"},
		Spec: v1alpha1.ModelSpec{Source: v1alpha1.ModelSource{URI: "file:///etc"}}}
	if err := e.c.Create(t.Context(), outside); err != nil {
		t.Fatal(err)
	}
	e.model(t, "big", map[string][]byte{"w.bin": bytes.Repeat([]byte{1}, 200_000)})
	cases := map[string]struct {
		model, wantErr string
		wantPhase      v1alpha1.ModelPhase
	}{
		"a header that lies about its offsets": {model: "liar", wantErr: "model.safetensors", wantPhase: v1alpha1.ModelFailed},
		"a file outside the node's roots":      {model: "etc", wantErr: "outside the directories this node's model cache may read", wantPhase: v1alpha1.ModelFailed},
		"no such model":                        {model: "nope", wantErr: `no Model "nope" in namespace "team-a"`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			dir, err := e.svc.Publish(t.Context(), PublishRequest{VolumeID: "v-" + tc.model, Namespace: "team-a", Model: tc.model})
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Publish() = %q, %v; want an error containing %q", dir, err, tc.wantErr)
			}
			if tc.wantPhase == "" {
				return
			}
			st := e.status(t, tc.model)
			n := st.ModelNode("node-1")
			if n == nil || n.Phase != tc.wantPhase || !strings.Contains(n.Message, tc.wantErr) {
				t.Errorf("status.nodes[node-1] = %+v, want %s saying %q", n, tc.wantPhase, tc.wantErr)
			}
		})
	}
}

func TestPublishAnswersWhileFetching(t *testing.T) {
	e := newEnv(t, 10<<20)
	e.model(t, "slow", map[string][]byte{"w.bin": bytes.Repeat([]byte{1}, 100_000)})
	// A deadline too short to wait in: the answer says how far the fetch is,
	// and the fetch goes on for the kubelet's next try.
	ctx, cancel := contextWithDeadline(t, 5*time.Second)
	defer cancel()
	_, err := e.svc.Publish(ctx, PublishRequest{VolumeID: "v", Namespace: "team-a", Model: "slow"})
	var still *StillFetchingError
	if err != nil && !asStill(err, &still) {
		t.Fatalf("Publish() = %v, want nil or a StillFetchingError", err)
	}
	if still != nil && !strings.Contains(still.Message, "waiting for model slow on node-1") {
		t.Errorf("message %q does not say what the pod waits for", still.Message)
	}
	if _, err := e.svc.Publish(t.Context(), PublishRequest{VolumeID: "v", Namespace: "team-a", Model: "slow"}); err != nil {
		t.Fatalf("retry: %v", err)
	}
}

func TestEvictionLeavesTheModelStatus(t *testing.T) {
	e := newEnv(t, 150_000)
	e.model(t, "a", map[string][]byte{"w.bin": bytes.Repeat([]byte{1}, 100_000)})
	e.model(t, "b", map[string][]byte{"w.bin": bytes.Repeat([]byte{2}, 100_000)})
	if _, err := e.svc.Publish(t.Context(), PublishRequest{VolumeID: "va", Namespace: "team-a", Model: "a"}); err != nil {
		t.Fatal(err)
	}
	// While a pod uses a, b cannot fit: refused, a is kept.
	if _, err := e.svc.Publish(t.Context(), PublishRequest{VolumeID: "vb", Namespace: "team-a", Model: "b"}); err == nil || !strings.Contains(err.Error(), "do not fit the node's model cache") {
		t.Fatalf("Publish(b) = %v, want a no-room error", err)
	}
	if err := e.svc.Unpublish("va"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.Publish(t.Context(), PublishRequest{VolumeID: "vb", Namespace: "team-a", Model: "b"}); err != nil {
		t.Fatalf("Publish(b) after a's pod went: %v", err)
	}
	if st := e.status(t, "a"); st.ModelNode("node-1") != nil {
		n := st.ModelNode("node-1")
		t.Errorf("evicted a still listed on node-1: %+v", n)
	}
}

// TestPrefetchedModelIsHeldForItsPods: a model prefetched for admitted pods
// is not evicted for another model before they mount it, for AdmittedHold;
// after that, with no pod using it, it may be.
func TestPrefetchedModelIsHeldForItsPods(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	e := newEnv(t, 150_000, func(c *Config) { c.Clock = clk })
	a := e.model(t, "a", map[string][]byte{"w.bin": bytes.Repeat([]byte{1}, 100_000)})
	e.model(t, "b", map[string][]byte{"w.bin": bytes.Repeat([]byte{2}, 100_000)})
	a.Status.Nodes = []v1alpha1.ModelNodeStatus{{Name: "node-1", Phase: v1alpha1.ModelPending, Message: "prefetch requested: admitted team-a/serve"}}
	e.svc.Prefetch(t.Context(), a)
	if st := e.status(t, "a"); st.ModelNode("node-1") == nil || st.ModelNode("node-1").Phase != v1alpha1.ModelReady {
		t.Fatalf("status.nodes of a = %+v, want node-1 Ready after the prefetch", st.Nodes)
	}
	if _, err := e.svc.Publish(t.Context(), PublishRequest{VolumeID: "vb", Namespace: "team-a", Model: "b"}); err == nil || !strings.Contains(err.Error(), "do not fit the node's model cache") {
		t.Fatalf("Publish(b) while a is held for its admitted pods = %v, want a no-room error", err)
	}
	clk.Step(AdmittedHold)
	if _, err := e.svc.Publish(t.Context(), PublishRequest{VolumeID: "vb", Namespace: "team-a", Model: "b"}); err != nil {
		t.Fatalf("Publish(b) once a's hold ran out: %v", err)
	}
	if st := e.status(t, "a"); st.ModelNode("node-1") != nil {
		t.Errorf("evicted a still listed on node-1: %+v", st.Nodes)
	}
}

// TestSpecPrefetchIsNotHeld: a copy spec.prefetch warmed ahead of demand
// stays evictable: a tenant's Models must not pin other tenants' pods out
// of the node's cache.
func TestSpecPrefetchIsNotHeld(t *testing.T) {
	e := newEnv(t, 150_000)
	a := e.model(t, "a", map[string][]byte{"w.bin": bytes.Repeat([]byte{1}, 100_000)})
	e.model(t, "b", map[string][]byte{"w.bin": bytes.Repeat([]byte{2}, 100_000)})
	a.Status.Nodes = []v1alpha1.ModelNodeStatus{{Name: "node-1", Phase: v1alpha1.ModelPending, Message: "prefetch requested: " + prefetch.WhySpecPrefetch}}
	e.svc.Prefetch(t.Context(), a)
	if st := e.status(t, "a"); st.ModelNode("node-1") == nil || st.ModelNode("node-1").Phase != v1alpha1.ModelReady {
		t.Fatalf("status.nodes of a = %+v, want node-1 Ready after the prefetch", st.Nodes)
	}
	if _, err := e.svc.Publish(t.Context(), PublishRequest{VolumeID: "vb", Namespace: "team-a", Model: "b"}); err != nil {
		t.Fatalf("Publish(b) beside a copy spec.prefetch warmed: %v, want a evicted for it", err)
	}
}

// TestPrefetchTakesUpARequest: a Pending entry for the node (the admission
// loop's request) starts the fill without a pod; a Model with a Secret
// waits for a pod's, and says so.
func TestPrefetchTakesUpARequest(t *testing.T) {
	e := newEnv(t, 10<<20)
	m := e.model(t, "warm", map[string][]byte{"w.bin": bytes.Repeat([]byte{3}, 50_000)})
	request := func(m *v1alpha1.Model) *v1alpha1.Model {
		t.Helper()
		m.Status.Nodes = []v1alpha1.ModelNodeStatus{{Name: "node-1", Phase: v1alpha1.ModelPending, Message: "prefetch requested: admitted team-a/serve"}}
		return m
	}
	if !e.svc.WantsPrefetch(request(m.DeepCopy())) {
		t.Fatal("WantsPrefetch() = false for a Pending entry of this node")
	}
	e.svc.Prefetch(t.Context(), request(m.DeepCopy()))
	deadline := time.Now().Add(30 * time.Second)
	for {
		st := e.status(t, "warm")
		if n := st.ModelNode("node-1"); n != nil && n.Phase == v1alpha1.ModelReady {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the prefetch did not make the model Ready: %+v", st.Nodes)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got := testutil.ToFloat64(e.met.Misses); got != 1 {
		t.Errorf("misses = %v, want 1", got)
	}
	// The pod that comes next starts from the cache.
	if _, err := e.svc.Publish(t.Context(), PublishRequest{VolumeID: "v", Namespace: "team-a", Model: "warm"}); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(e.met.Misses); got != 1 {
		t.Errorf("misses after the pod = %v, want still 1", got)
	}

	secret := m.DeepCopy()
	secret.Name = "private"
	secret.ResourceVersion = ""
	secret.Spec.Source.SecretRef = &corev1.LocalObjectReference{Name: "creds"}
	if err := e.c.Create(t.Context(), secret); err != nil {
		t.Fatal(err)
	}
	e.svc.Prefetch(t.Context(), request(secret.DeepCopy()))
	st := e.status(t, "private")
	if n := st.ModelNode("node-1"); n == nil || n.Phase != v1alpha1.ModelPending || !strings.Contains(n.Message, "waits for a pod") {
		t.Errorf("status.nodes[node-1] = %+v, want Pending saying it waits for a pod's Secret", n)
	}
}

// TestRecreatedModelFindsItsFiles: a Model deleted and made again under the
// same name (its namespace recreated, say) is served from the node's copy,
// and its status still lists the files and size verified when it was
// fetched.
func TestRecreatedModelFindsItsFiles(t *testing.T) {
	e := newEnv(t, 10<<20)
	files := map[string][]byte{"model.safetensors": safetensorsFile(1000, false)}
	m := e.model(t, "again", files)
	if _, err := e.svc.Publish(t.Context(), PublishRequest{VolumeID: "v1", Namespace: "team-a", Model: "again"}); err != nil {
		t.Fatal(err)
	}
	want := e.status(t, "again")
	if len(want.Files) != 1 || want.Size == 0 {
		t.Fatalf("status after the fetch: files %+v, size %d; want the file and its size", want.Files, want.Size)
	}
	if err := e.c.Delete(t.Context(), m); err != nil {
		t.Fatal(err)
	}
	again := &v1alpha1.Model{ObjectMeta: metav1.ObjectMeta{Namespace: m.Namespace, Name: m.Name}, Spec: m.Spec}
	if err := e.c.Create(t.Context(), again); err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.Publish(t.Context(), PublishRequest{VolumeID: "v2", Namespace: "team-a", Model: "again"}); err != nil {
		t.Fatal(err)
	}
	got := e.status(t, "again")
	if diff := cmp.Diff(want.Files, got.Files); diff != "" || got.Size != want.Size {
		t.Errorf("status of the recreated Model: size %d, want %d; files (-want +got):\n%s", got.Size, want.Size, diff)
	}
	if n := got.ModelNode("node-1"); n == nil || n.Message != "cached" {
		t.Errorf("status.nodes[node-1] = %+v, want Ready from the cache", n)
	}
	if got := testutil.ToFloat64(e.met.Misses); got != 1 {
		t.Errorf("misses = %v, want 1", got)
	}
}

// TestRecreatedModelWithAnotherSource: a Model made again under a deleted
// one's name, with another source, gets its own files, never the copy the
// deleted one resolved to a moment ago (both are at generation 1).
func TestRecreatedModelWithAnotherSource(t *testing.T) {
	e := newEnv(t, 10<<20)
	m := e.model(t, "swap", map[string][]byte{"w.bin": bytes.Repeat([]byte{1}, 5000)})
	if _, err := e.svc.Publish(t.Context(), PublishRequest{VolumeID: "v1", Namespace: "team-a", Model: "swap"}); err != nil {
		t.Fatal(err)
	}
	if err := e.c.Delete(t.Context(), m); err != nil {
		t.Fatal(err)
	}
	other := e.model(t, "other", map[string][]byte{"w.bin": bytes.Repeat([]byte{2}, 5000)})
	if err := e.c.Delete(t.Context(), other); err != nil {
		t.Fatal(err)
	}
	swapped := &v1alpha1.Model{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "swap"}, Spec: other.Spec}
	if err := e.c.Create(t.Context(), swapped); err != nil {
		t.Fatal(err)
	}
	dir, err := e.svc.Publish(t.Context(), PublishRequest{VolumeID: "v2", Namespace: "team-a", Model: "swap"})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(dir, "w.bin")); err != nil || !bytes.Equal(got, bytes.Repeat([]byte{2}, 5000)) {
		t.Errorf("the recreated Model serves %d bytes starting %v (err %v), want its own source's", len(got), got[:min(len(got), 4)], err)
	}
}
