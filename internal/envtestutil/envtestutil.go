// Package envtestutil starts a real kube-apiserver and etcd (controller-runtime's
// envtest) with Partita's CRDs installed, for integration tests.
package envtestutil

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"

	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/partita-dev/partita/devcluster"
	"github.com/partita-dev/partita/internal/clientscheme"
)

// Start runs an API server for the test and returns its config and a client
// that knows Partita's types. The server stops when the test ends. It fails
// the test, with the command that fixes it, when the binaries are missing.
func Start(t testing.TB) (*rest.Config, client.Client) {
	t.Helper()
	_, cfg, c := StartEnv(t)
	return cfg, c
}

// StartEnv is Start that also returns the environment, for tests that add
// users of their own (Environment.AddUser) to play an ordinary user against
// the API server's RBAC.
func StartEnv(t testing.TB) (*envtest.Environment, *rest.Config, client.Client) {
	t.Helper()
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		assets = filepath.Join(devcluster.CacheDir(), "bin", "k8s-"+devcluster.K8sVersion)
	}
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(assets, b)); err != nil {
			t.Fatalf("envtest needs %s in %s: run 'make cluster-bins' (or set KUBEBUILDER_ASSETS)", b, assets)
		}
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     []string{filepath.Join(repoRoot(), "crds")},
		ErrorIfCRDPathMissing: true,
	}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("start envtest: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stop envtest: %v", err)
		}
	})
	c, err := client.New(cfg, client.Options{Scheme: Scheme()})
	if err != nil {
		t.Fatalf("create client: %v", err)
	}
	return env, cfg, c
}

// Scheme returns a new scheme with the built-in Kubernetes types and Partita's.
func Scheme() *k8sruntime.Scheme {
	s, err := clientscheme.New()
	utilruntime.Must(err)
	return s
}

// repoRoot finds the module root from this file's location.
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}
