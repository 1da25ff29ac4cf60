package peer

import (
	"context"
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-logr/logr/testr"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/models/cache"
)

type tokenIs string

func (t tokenIs) Authenticate(_ context.Context, token string) error {
	if token != string(t) {
		return ErrUnauthorized
	}
	return nil
}

func TestServer(t *testing.T) {
	kc, err := cache.New(t.TempDir(), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kc.Get(t.Context(), "m-1", func(_ context.Context, dir string) error {
		if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o755); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dir, "sub", "w.bin"), []byte("0123456789"), 0o644)
	}); err != nil {
		t.Fatal(err)
	}
	cert, sum, err := Certificate("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(&Server{Cache: kc, Auth: tokenIs("good"), Log: testr.New(t)})
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	good := v1alpha1.ModelPeer{URL: srv.URL, CertSHA256: sum}
	cases := map[string]struct {
		peer    v1alpha1.ModelPeer
		key     string
		path    string
		token   string
		want    string
		wantErr string
	}{
		"a range of a file":         {peer: good, key: "m-1", path: "sub/w.bin", token: "good", want: "3456"},
		"a wrong token":             {peer: good, key: "m-1", path: "sub/w.bin", token: "bad", wantErr: "401"},
		"an entry it does not hold": {peer: good, key: "m-2", path: "sub/w.bin", token: "good", wantErr: "404"},
		"out of the entry":          {peer: good, key: "m-1", path: "../index.json", token: "good", wantErr: "404"},
		"a certificate not the pinned": {peer: v1alpha1.ModelPeer{URL: srv.URL, CertSHA256: strings.Repeat("0", 64)}, key: "m-1", path: "sub/w.bin", token: "good",
			wantErr: "not the one its Model status names"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			src, err := NewSource(tc.peer, tc.key, tc.token)
			if err != nil {
				t.Fatal(err)
			}
			name := src.Name(tc.path)
			if tc.path == "../index.json" {
				name = srv.URL + PathPrefix + tc.key + "/../index.json"
			}
			p := make([]byte, 4)
			err = src.ReadRange(t.Context(), name, 3, p)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ReadRange() = %v, want an error containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || string(p) != tc.want {
				t.Fatalf("ReadRange() = %q, %v; want %q", p, err, tc.want)
			}
		})
	}
	// Only reads.
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPut, srv.URL+PathPrefix+"m-1/sub/w.bin", nil)
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("PUT answered %d, want 405", resp.StatusCode)
	}
}
