package main

import (
	"archive/tar"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/partita-dev/partita/devcluster/realnode"
)

func TestParseLdd(t *testing.T) {
	out := []byte(`	linux-vdso.so.1 (0x00007ffd5b7f4000)
	libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f1c2f600000)
	/lib64/ld-linux-x86-64.so.2 (0x00007f1c2f9c5000)
`)
	got, err := parseLdd(out, "/lib64/ld-linux-x86-64.so.2")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"/lib64/ld-linux-x86-64.so.2", "/lib/x86_64-linux-gnu/libc.so.6"}, got); diff != "" {
		t.Errorf("(-want,+got):\n%s", diff)
	}
	if _, err := parseLdd([]byte("\tlibnvidia-ml.so.1 => not found\n"), "/lib64/ld.so"); err == nil {
		t.Error("a library ldd cannot find is not an error")
	}
}

// TestSharedLibrariesOfANonELFFile: a file that is no program is refused.
func TestSharedLibrariesOfANonELFFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "not-elf")
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := sharedLibraries(path); err == nil {
		t.Error("a file that is not ELF gave no error")
	}
}

func TestImageRoundTrip(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "prog")
	if err := os.WriteFile(bin, []byte("program"), 0o755); err != nil {
		t.Fatal(err)
	}
	s := spec{File: "x.tar", Refs: []string{"localhost/partita/x:dev"},
		Files:      []file{{Path: "/usr/local/bin/prog", Source: bin, Mode: 0o755}},
		Entrypoint: []string{"/usr/local/bin/prog"}, Env: []string{"PATH=/usr/local/bin"}, User: "65532:65532"}
	path := filepath.Join(dir, s.File)
	wrote, err := s.writeIfChanged(path)
	if err != nil || !wrote {
		t.Fatalf("first write: %v, %v", wrote, err)
	}
	if wrote, err := s.writeIfChanged(path); err != nil || wrote {
		t.Errorf("unchanged inputs: wrote %v, %v; want it kept", wrote, err)
	}
	tag, err := name.NewTag(s.Refs[0])
	if err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(path, &tag)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || cf.Architecture != "amd64" || cf.Config.User != s.User ||
		!cmp.Equal(cf.Config.Entrypoint, s.Entrypoint) || !cmp.Equal(cf.Config.Env, s.Env) {
		t.Errorf("config %+v", cf)
	}
	digest1, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers %v, %v", layers, err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rc.Close() }()
	tr := tar.NewReader(rc)
	type entry struct {
		Name    string
		Mode    int64
		Content string
	}
	var got []entry
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		got = append(got, entry{h.Name, h.Mode, string(b)})
	}
	want := []entry{{"usr/", 0o755, ""}, {"usr/local/", 0o755, ""}, {"usr/local/bin/", 0o755, ""}, {"usr/local/bin/prog", 0o755, "program"}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("layer (-want,+got):\n%s", diff)
	}

	// The same inputs make the same image; new content a new one.
	if err := os.Remove(path + ".inputs"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.writeIfChanged(path); err != nil {
		t.Fatal(err)
	}
	again, err := tarball.ImageFromPath(path, &tag)
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := again.Digest(); d != digest1 {
		t.Errorf("rebuilt from the same inputs: digest %s, want %s", d, digest1)
	}
	if err := os.WriteFile(bin, []byte("program v2"), 0o755); err != nil {
		t.Fatal(err)
	}
	if wrote, err := s.writeIfChanged(path); err != nil || !wrote {
		t.Errorf("changed content: wrote %v, %v; want a new image", wrote, err)
	}
}

// TestCatalog: every image the real node loads is built, under the
// name the node expects, with its binary in place.
func TestCatalog(t *testing.T) {
	specs := catalog("/bin/partita", []string{"/lib64/ld.so"}, "/programs", []string{"/lib64/ld.so", "/lib/libc.so.6"}, "/cluster")
	var got []string
	for _, s := range specs {
		got = append(got, s.File+" "+s.Refs[0]+" "+s.Files[0].Path+" <- "+s.Files[0].Source)
	}
	want := []string{
		"partita.tar " + realnode.ImagePartita.Ref + " /usr/local/bin/partita <- /bin/partita",
		"sample.tar " + realnode.ImageSample.Ref + " /sample <- /programs/sample",
		"pause.tar " + realnode.ImagePause.Ref + " /pause <- /programs/pause",
		"kube-scheduler.tar " + realnode.ImageKubeScheduler.Ref + " /usr/local/bin/kube-scheduler <- /cluster/kube-scheduler",
		"coredns.tar " + realnode.ImageCoreDNS.Ref + " /coredns <- /cluster/coredns",
		"interposer-test.tar " + realnode.ImageInterposerTest.Ref + " /k8s-vgpu/lib/nvidia/libvgpu.so <- /programs/libpreload-test.so",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want,+got):\n%s", diff)
	}
	if specs[0].Files[1].Path != "/lib64/ld.so" {
		t.Errorf("partita's image lacks its libraries: %v", specs[0].Files)
	}
	var probe []string
	for _, f := range specs[5].Files[1:] {
		probe = append(probe, f.Path+" <- "+f.Source)
	}
	if diff := cmp.Diff([]string{realnode.InterposerTestProbe + " <- /programs/probe", "/lib64/ld.so <- /lib64/ld.so", "/lib/libc.so.6 <- /lib/libc.so.6"}, probe); diff != "" {
		t.Errorf("the interposer test image's probe and its libraries (-want,+got):\n%s", diff)
	}
}
