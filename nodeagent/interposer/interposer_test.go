package interposer

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	testingclock "k8s.io/utils/clock/testing"
)

// elfObject is the smallest ELF file debug/elf reads: a 64-bit x86-64
// header of type typ with no sections, then payload (so that two objects
// can differ).
func elfObject(t *testing.T, typ elf.Type, payload string) []byte {
	t.Helper()
	h := elf.Header64{Type: uint16(typ), Machine: uint16(elf.EM_X86_64), Version: uint32(elf.EV_CURRENT), Ehsize: 64}
	copy(h.Ident[:], elf.ELFMAG)
	h.Ident[elf.EI_CLASS] = byte(elf.ELFCLASS64)
	h.Ident[elf.EI_DATA] = byte(elf.ELFDATA2LSB)
	h.Ident[elf.EI_VERSION] = byte(elf.EV_CURRENT)
	var buf bytes.Buffer
	if err := binary.Write(&buf, binary.LittleEndian, h); err != nil {
		t.Fatal(err)
	}
	buf.WriteString(payload)
	return buf.Bytes()
}

func writeFile(t *testing.T, path string, content []byte) string {
	t.Helper()
	if err := os.WriteFile(path, content, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// listing is each file of dir with its mode and content.
func listing(t *testing.T, dir string) map[string]string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = fi.Mode().String() + " " + string(b)
	}
	return out
}

func TestInstall(t *testing.T) {
	lib := elfObject(t, elf.ET_DYN, "v1")
	cases := map[string]struct {
		// before fills the host directory before Install.
		before    func(t *testing.T, dir string)
		src       []byte
		wantWrote bool
		wantErr   string
		// want is the directory after, nil when it must not exist.
		want map[string]string
	}{
		"empty host directory": {
			src:       lib,
			wantWrote: true,
			want:      map[string]string{LibraryName: "-rw-r--r-- " + string(lib), PreloadName: "-rw-r--r-- " + PreloadContent},
		},
		"already installed": {
			before: func(t *testing.T, dir string) {
				if _, err := Install(writeFile(t, filepath.Join(t.TempDir(), "lib.so"), lib), dir); err != nil {
					t.Fatal(err)
				}
			},
			src:  lib,
			want: map[string]string{LibraryName: "-rw-r--r-- " + string(lib), PreloadName: "-rw-r--r-- " + PreloadContent},
		},
		"a new library replaces the old": {
			before: func(t *testing.T, dir string) {
				if _, err := Install(writeFile(t, filepath.Join(t.TempDir(), "lib.so"), elfObject(t, elf.ET_DYN, "v0")), dir); err != nil {
					t.Fatal(err)
				}
			},
			src:       lib,
			wantWrote: true,
			want:      map[string]string{LibraryName: "-rw-r--r-- " + string(lib), PreloadName: "-rw-r--r-- " + PreloadContent},
		},
		"a changed preload file and a loose mode are put back": {
			before: func(t *testing.T, dir string) {
				if err := os.MkdirAll(dir, 0o755); err != nil {
					t.Fatal(err)
				}
				writeFile(t, filepath.Join(dir, LibraryName), lib) // 0600
				writeFile(t, filepath.Join(dir, PreloadName), []byte("/tmp/evil.so\n"))
			},
			src:       lib,
			wantWrote: true,
			want:      map[string]string{LibraryName: "-rw-r--r-- " + string(lib), PreloadName: "-rw-r--r-- " + PreloadContent},
		},
		"a symbolic link in the host directory is replaced by a file": {
			before: func(t *testing.T, dir string) {
				if err := os.MkdirAll(dir, 0o755); err != nil {
					t.Fatal(err)
				}
				target := writeFile(t, filepath.Join(t.TempDir(), "elsewhere"), []byte(PreloadContent))
				if err := os.Chmod(target, 0o644); err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink(target, filepath.Join(dir, PreloadName)); err != nil {
					t.Fatal(err)
				}
			},
			src:       lib,
			wantWrote: true,
			want:      map[string]string{LibraryName: "-rw-r--r-- " + string(lib), PreloadName: "-rw-r--r-- " + PreloadContent},
		},
		"empty source": {
			src:     []byte{},
			wantErr: "empty",
		},
		"not ELF": {
			src:     []byte("#!/bin/sh\necho hi\n"),
			wantErr: "not ELF",
		},
		"an executable, not a shared object": {
			src:     elfObject(t, elf.ET_EXEC, ""),
			wantErr: "want a shared object",
		},
		"a bad source leaves an installed interposer alone": {
			before: func(t *testing.T, dir string) {
				if _, err := Install(writeFile(t, filepath.Join(t.TempDir(), "lib.so"), lib), dir); err != nil {
					t.Fatal(err)
				}
			},
			src:     []byte("garbage"),
			wantErr: "not ELF",
			want:    map[string]string{LibraryName: "-rw-r--r-- " + string(lib), PreloadName: "-rw-r--r-- " + PreloadContent},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "host", "interposer")
			if tc.before != nil {
				tc.before(t, dir)
			}
			src := writeFile(t, filepath.Join(t.TempDir(), "libvgpu.so.v2"), tc.src)
			wrote, err := Install(src, dir)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Errorf("error %v, want one with %q", err, tc.wantErr)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if wrote != tc.wantWrote {
				t.Errorf("wrote %v, want %v", wrote, tc.wantWrote)
			}
			if tc.want == nil {
				if _, err := os.Stat(dir); !os.IsNotExist(err) {
					t.Errorf("a failed install made the host directory: %v", err)
				}
				return
			}
			if diff := cmp.Diff(tc.want, listing(t, dir)); diff != "" {
				t.Errorf("host directory (-want,+got):\n%s", diff)
			}
			if libPath, ok := Installed(dir); !ok || libPath != filepath.Join(dir, LibraryName) {
				t.Errorf("Installed = %q, %v; want %s, true", libPath, ok, filepath.Join(dir, LibraryName))
			}
		})
	}
}

// TestInstallSourceIsNoFile: a directory or a missing path is no library.
func TestInstallSourceIsNoFile(t *testing.T) {
	dir := t.TempDir()
	for name, src := range map[string]string{"directory": dir, "missing": filepath.Join(dir, "nothing")} {
		t.Run(name, func(t *testing.T) {
			if _, err := Install(src, filepath.Join(dir, "host")); err == nil {
				t.Error("no error")
			}
		})
	}
}

func TestInstalled(t *testing.T) {
	lib := elfObject(t, elf.ET_DYN, "")
	cases := map[string]struct {
		files   map[string][]byte
		wantErr string
	}{
		"installed":                  {files: map[string][]byte{LibraryName: lib, PreloadName: []byte(PreloadContent)}},
		"nothing":                    {wantErr: "no such file"},
		"library only":               {files: map[string][]byte{LibraryName: lib}, wantErr: PreloadName},
		"preload only":               {files: map[string][]byte{PreloadName: []byte(PreloadContent)}, wantErr: LibraryName},
		"preload names another file": {files: map[string][]byte{LibraryName: lib, PreloadName: []byte("/lib/other.so\n")}, wantErr: "want"},
		"preload names two":          {files: map[string][]byte{LibraryName: lib, PreloadName: []byte(PreloadContent + "/lib/other.so\n")}, wantErr: "want"},
		"library is not ELF":         {files: map[string][]byte{LibraryName: []byte("x"), PreloadName: []byte(PreloadContent)}, wantErr: "not ELF"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			for n, b := range tc.files {
				writeFile(t, filepath.Join(dir, n), b)
			}
			err := Check(dir)
			libPath, ok := Installed(dir)
			if tc.wantErr == "" {
				if err != nil || !ok || libPath != filepath.Join(dir, LibraryName) {
					t.Errorf("Check %v, Installed %q %v; want installed", err, libPath, ok)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Check: %v, want an error with %q", err, tc.wantErr)
			}
			if ok || libPath != "" {
				t.Errorf("Installed = %q, %v; want not installed", libPath, ok)
			}
		})
	}
}

// TestPreloadContent: the one line the preload file holds names the
// library where the container sees the host directory.
func TestPreloadContent(t *testing.T) {
	if PreloadContent != "/usr/local/partita/interposer/libvgpu.so\n" {
		t.Errorf("PreloadContent = %q", PreloadContent)
	}
}

// TestKeepPutsBackWhatWasRemoved: a preload file removed from the host is
// back after the next check.
func TestKeepPutsBackWhatWasRemoved(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "interposer")
	src := writeFile(t, filepath.Join(t.TempDir(), "libvgpu.so"), elfObject(t, elf.ET_DYN, ""))
	clk := testingclock.NewFakeClock(time.Now())
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- Keep(ctx, src, dir, time.Minute, clk) }()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not after 10s", what)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitFor("the first install", func() bool { _, ok := Installed(dir); return ok && clk.HasWaiters() })
	if err := os.Remove(filepath.Join(dir, PreloadName)); err != nil {
		t.Fatal(err)
	}
	clk.Step(time.Minute)
	waitFor("the preload file back", func() bool { _, ok := Installed(dir); return ok })
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Keep: %v", err)
	}
}

// TestKeepFailsOnABadSource: nothing to install is an error at once.
func TestKeepFailsOnABadSource(t *testing.T) {
	src := writeFile(t, filepath.Join(t.TempDir(), "libvgpu.so"), []byte("not a library"))
	err := Keep(t.Context(), src, t.TempDir(), time.Minute, testingclock.NewFakeClock(time.Now()))
	if err == nil || !strings.Contains(err.Error(), "not ELF") {
		t.Errorf("Keep: %v, want a not-ELF error", err)
	}
}
