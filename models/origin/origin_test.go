package origin

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
	corev1 "k8s.io/api/core/v1"

	"github.com/partita-dev/partita/api/v1alpha1"
)

func fakeS3(t *testing.T, bucket string, objects map[string]string) *httptest.Server {
	t.Helper()
	backend := s3mem.New()
	if err := backend.CreateBucket(bucket); err != nil {
		t.Fatal(err)
	}
	for k, v := range objects {
		if _, err := backend.PutObject(bucket, k, map[string]string{}, strings.NewReader(v), int64(len(v)), nil); err != nil {
			t.Fatal(err)
		}
	}
	srv := httptest.NewServer(gofakes3.New(backend).Server())
	t.Cleanup(srv.Close)
	return srv
}

func paths(r *Resolved) []string {
	var out []string
	for _, f := range r.Files {
		out = append(out, f.Path)
	}
	return out
}

func TestResolve(t *testing.T) {
	s3 := fakeS3(t, "models", map[string]string{
		"llama/config.json": "{}", "llama/model-1.safetensors": "aaaa", "llama/sub/tok.model": "t",
		"llama-2/other": "x", "single.bin": "one",
	})
	files := t.TempDir()
	httpSrv := httptest.NewServer(http.FileServer(http.Dir(files)))
	t.Cleanup(httpSrv.Close)
	for p, b := range map[string]string{"m/a.safetensors": "aa", "m/b/c.json": "c"} {
		_ = os.MkdirAll(filepath.Dir(filepath.Join(files, p)), 0o755)
		if err := os.WriteFile(filepath.Join(files, p), []byte(b), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(files, "m", "escape")); err != nil {
		t.Fatal(err)
	}
	secret := map[string][]byte{v1alpha1.ModelSecretAccessKeyID: []byte("k"), v1alpha1.ModelSecretSecretAccessKey: []byte("s")}
	s3src := func(uri string) v1alpha1.ModelSpec {
		return v1alpha1.ModelSpec{Source: v1alpha1.ModelSource{URI: uri, Endpoint: s3.URL, SecretRef: &corev1.LocalObjectReference{Name: "s3"}}}
	}
	cases := map[string]struct {
		spec      v1alpha1.ModelSpec
		secret    map[string][]byte
		want      []string
		wantErr   string
		permanent bool
	}{
		"s3 prefix, not its sibling": {spec: s3src("s3://models/llama"), secret: secret, want: []string{"config.json", "model-1.safetensors", "sub/tok.model"}},
		"s3 include globs": {spec: func() v1alpha1.ModelSpec {
			s := s3src("s3://models/llama/")
			s.Include = []string{"*.safetensors", "*.json"}
			return s
		}(), secret: secret, want: []string{"config.json", "model-1.safetensors"}},
		"s3 one object":          {spec: s3src("s3://models/single.bin"), secret: secret, want: []string{"single.bin"}},
		"s3 secret without keys": {spec: s3src("s3://models/llama"), secret: map[string][]byte{"x": nil}, wantErr: "has no AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY", permanent: true},
		"s3 nothing there":       {spec: s3src("s3://models/nope"), secret: secret, wantErr: "nothing under the prefix"},
		"file directory, no symlinks": {spec: v1alpha1.ModelSpec{Source: v1alpha1.ModelSource{URI: "file://" + files + "/m"}},
			want: []string{"a.safetensors", "b/c.json"}},
		"file outside the roots": {spec: v1alpha1.ModelSpec{Source: v1alpha1.ModelSource{URI: "file:///etc"}},
			wantErr: "outside the directories", permanent: true},
		"pinned digest of no file": {spec: v1alpha1.ModelSpec{Source: v1alpha1.ModelSource{URI: "file://" + files + "/m"}, SHA256: map[string]string{"zzz": "00"}},
			wantErr: "sha256 pins zzz", permanent: true},
		"include matches nothing": {spec: v1alpha1.ModelSpec{Source: v1alpha1.ModelSource{URI: "file://" + files + "/m"}, Include: []string{"*.gguf"}},
			wantErr: "no files", permanent: true},
		"bad glob": {spec: v1alpha1.ModelSpec{Source: v1alpha1.ModelSource{URI: "file://" + files + "/m"}, Include: []string{"[a"}},
			wantErr: "include glob"},
		"http directory with files": {spec: v1alpha1.ModelSpec{Source: v1alpha1.ModelSource{URI: httpSrv.URL + "/m/", Files: []string{"a.safetensors", "b/c.json"}}},
			want: []string{"a.safetensors", "b/c.json"}},
		"http one file": {spec: v1alpha1.ModelSpec{Source: v1alpha1.ModelSource{URI: httpSrv.URL + "/m/a.safetensors"}}, want: []string{"a.safetensors"}},
		"http missing file": {spec: v1alpha1.ModelSpec{Source: v1alpha1.ModelSource{URI: httpSrv.URL + "/m/", Files: []string{"nope"}}},
			wantErr: "404", permanent: true},
		"http directory without files": {spec: v1alpha1.ModelSpec{Source: v1alpha1.ModelSource{URI: httpSrv.URL + "/m/"}},
			wantErr: "needs files", permanent: true},
		"http file escaping": {spec: v1alpha1.ModelSpec{Source: v1alpha1.ModelSource{URI: httpSrv.URL + "/m/", Files: []string{"../x"}}},
			wantErr: "not a relative path", permanent: true},
		"endpoint for http": {spec: v1alpha1.ModelSpec{Source: v1alpha1.ModelSource{URI: httpSrv.URL + "/m", Endpoint: "http://x"}},
			wantErr: "only for s3", permanent: true},
		"unknown scheme": {spec: v1alpha1.ModelSpec{Source: v1alpha1.ModelSource{URI: "ftp://x/y"}}, wantErr: `scheme "ftp"`, permanent: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			r, err := Resolve(t.Context(), tc.spec, Options{Secret: tc.secret, FileRoots: []string{files}, Namespace: "team-a"})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Resolve() = %v, want an error containing %q", err, tc.wantErr)
				}
				if tc.permanent && !IsPermanent(err) {
					t.Errorf("error %v is not permanent", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Resolve() = %v", err)
			}
			if diff := cmp.Diff(tc.want, paths(r)); diff != "" {
				t.Errorf("files (-want,+got):\n%s", diff)
			}
		})
	}
}

func TestVersion(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "w"), bytes.Repeat([]byte{1}, 10), 0o644); err != nil {
		t.Fatal(err)
	}
	spec := v1alpha1.ModelSpec{Source: v1alpha1.ModelSource{URI: "file://" + dir}}
	resolve := func(ns string, spec v1alpha1.ModelSpec) string {
		r, err := Resolve(t.Context(), spec, Options{FileRoots: []string{dir}, Namespace: ns})
		if err != nil {
			t.Fatal(err)
		}
		return r.Version
	}
	a := resolve("team-a", spec)
	if resolve("team-a", spec) != a {
		t.Error("the same files got two versions")
	}
	if resolve("team-b", spec) == a {
		t.Error("two namespaces share a version: one's credentials would serve the other's pods")
	}
	pinned := spec
	pinned.SHA256 = map[string]string{"w": strings.Repeat("0", 64)}
	if resolve("team-a", pinned) == a {
		t.Error("pinning a digest kept the version")
	}
	if err := os.WriteFile(filepath.Join(dir, "w"), bytes.Repeat([]byte{2}, 11), 0o644); err != nil {
		t.Fatal(err)
	}
	if resolve("team-a", spec) == a {
		t.Error("a changed file kept the version")
	}
}
