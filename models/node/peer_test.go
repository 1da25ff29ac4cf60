package node

import (
	"bytes"
	"crypto/tls"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus/testutil"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/internal/envtestutil"
	"github.com/partita-dev/partita/models/cache"
	"github.com/partita-dev/partita/models/fetch"
	"github.com/partita-dev/partita/models/peer"
)

// TestPeersServeEachOther: three nodes' caches, one model used by ten
// pods spread over them. The source is read once (about the model's size);
// the other two nodes read it from the first, authenticated by their
// ServiceAccount's token and pinning the first's certificate. A caller
// without the caches' token is refused.
func TestPeersServeEachOther(t *testing.T) {
	cfg, c := envtestutil.Start(t)
	ctx := t.Context()
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{"team-a", "partita-system"} {
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	for _, sa := range []string{"partita-model-cache", "someone-else"} {
		if err := c.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "partita-system", Name: sa}}); err != nil {
			t.Fatal(err)
		}
	}
	token := func(sa string) string {
		tr, err := cs.CoreV1().ServiceAccounts("partita-system").CreateToken(ctx, sa, &authenticationv1.TokenRequest{
			Spec: authenticationv1.TokenRequestSpec{Audiences: []string{peer.Audience}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("token of %s: %v", sa, err)
		}
		return tr.Status.Token
	}
	cacheToken := token("partita-model-cache")

	roots := t.TempDir()
	data := safetensorsFile(500_000, false)
	if err := os.MkdirAll(filepath.Join(roots, "llama"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(roots, "llama", "model.safetensors"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	m := &v1alpha1.Model{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "llama"},
		Spec: v1alpha1.ModelSpec{Source: v1alpha1.ModelSource{URI: "file://" + filepath.Join(roots, "llama")}}}
	if err := c.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	reviewer := &peer.TokenReviewer{Client: cs.AuthenticationV1(), Allowed: "system:serviceaccount:partita-system:partita-model-cache",
		Clock: clocktesting.NewFakePassiveClock(time.Now())}

	type node struct {
		svc *Service
		met *Metrics
		url string
	}
	var nodes []node
	for _, name := range []string{"n1", "n2", "n3"} {
		kc, err := cache.New(t.TempDir(), 10<<20)
		if err != nil {
			t.Fatal(err)
		}
		cert, sum, err := peer.Certificate("127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		l, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13})
		if err != nil {
			t.Fatal(err)
		}
		met := NewMetrics(nil)
		srv := &http.Server{Handler: &peer.Server{Cache: kc, Auth: reviewer, Log: testr.New(t), Served: func(n int64) { met.ServedBytes.Add(float64(n)) }}, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(l) }()
		t.Cleanup(func() { _ = srv.Close() })
		url := "https://" + l.Addr().(*net.TCPAddr).String()
		svc, err := New(ctx, Config{
			NodeName: name, Cache: kc, Client: c, StateDir: t.TempDir(), FileRoots: []string{roots},
			Fetch: fetch.Options{ChunkSize: 64 << 10, Concurrency: 2, Pool: fetch.NewPool(2, 64<<10)},
			Peer:  &v1alpha1.ModelPeer{URL: url, CertSHA256: sum}, PeerToken: func() (string, error) { return cacheToken, nil },
			Log: testr.New(t), Metrics: met,
		})
		if err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, node{svc: svc, met: met, url: url})
	}
	// Ten pods: 4 on n1 (the first), then 3 on each of the others.
	for i := range 10 {
		n := nodes[min(i/4+i/7, 2)]
		if i < 4 {
			n = nodes[0]
		}
		dir, err := n.svc.Publish(ctx, PublishRequest{VolumeID: "v" + string(rune('a'+i)), Namespace: "team-a", Model: "llama"})
		if err != nil {
			t.Fatalf("pod %d: %v", i, err)
		}
		if got, _ := os.ReadFile(filepath.Join(dir, "model.safetensors")); !bytes.Equal(got, data) {
			t.Fatalf("pod %d read %d bytes that differ from the source", i, len(got))
		}
	}
	var origin, fromPeers float64
	for _, n := range nodes {
		origin += testutil.ToFloat64(n.met.OriginBytes)
		fromPeers += testutil.ToFloat64(n.met.PeerBytes)
	}
	size := float64(len(data))
	t.Logf("origin bytes %.0f (%.2f× the model), from peers %.0f", origin, origin/size, fromPeers)
	if origin > 1.1*size {
		t.Errorf("the source sent %.2f× the model's bytes, want at most 1.1×", origin/size)
	}
	if fromPeers < 2*size {
		t.Errorf("peers sent %.0f bytes, want the model twice (%.0f)", fromPeers, 2*size)
	}

	// Someone else's token, and none, are refused.
	for name, tok := range map[string]string{"another ServiceAccount": token("someone-else"), "no token": ""} {
		st := &v1alpha1.Model{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(m), st); err != nil {
			t.Fatal(err)
		}
		n1 := st.Status.ModelNode("n1")
		if n1 == nil || n1.Peer == nil {
			t.Fatalf("n1's entry publishes no peer: %+v", n1)
		}
		src, err := peer.NewSource(*n1.Peer, n1.Version, tok)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := src.Stat(ctx, src.Name("model.safetensors")); err == nil || !strings.Contains(err.Error(), "401") {
			t.Errorf("%s: Stat() = %v, want 401", name, err)
		}
	}
}
