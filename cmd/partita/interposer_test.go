package main

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/partita-dev/partita/nodeagent/interposer"
)

func TestInterposerCommand(t *testing.T) {
	dir := t.TempDir()
	h := elf.Header64{Type: uint16(elf.ET_DYN), Machine: uint16(elf.EM_X86_64), Version: uint32(elf.EV_CURRENT), Ehsize: 64}
	copy(h.Ident[:], elf.ELFMAG)
	h.Ident[elf.EI_CLASS], h.Ident[elf.EI_DATA], h.Ident[elf.EI_VERSION] = byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), byte(elf.EV_CURRENT)
	var lib bytes.Buffer
	if err := binary.Write(&lib, binary.LittleEndian, h); err != nil {
		t.Fatal(err)
	}
	good := filepath.Join(dir, "libvgpu.so.v2.10.0")
	bad := filepath.Join(dir, "readme")
	for path, b := range map[string][]byte{good: lib.Bytes(), bad: []byte("text")} {
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cases := map[string]struct {
		args    []string
		wantErr string
	}{
		"installs once":   {args: []string{"--source", good, "--once"}},
		"no source":       {args: []string{"--once"}, wantErr: "--source"},
		"not a library":   {args: []string{"--source", bad, "--once"}, wantErr: "not ELF"},
		"zero interval":   {args: []string{"--source", good, "--interval", "0s"}, wantErr: "--interval"},
		"no host dir":     {args: []string{"--source", good, "--host-dir", "", "--once"}, wantErr: "--host-dir"},
		"missing library": {args: []string{"--source", filepath.Join(dir, "nothing"), "--once"}, wantErr: "no such file"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			host := filepath.Join(t.TempDir(), "interposer")
			cmd := newRootCommand()
			var out bytes.Buffer
			cmd.SetOut(&out)
			cmd.SetErr(&out)
			cmd.SetArgs(append([]string{"interposer", "--host-dir", host}, tc.args...))
			err := cmd.Execute()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Errorf("error %v, want one with %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("%v\n%s", err, out.String())
			}
			if _, ok := interposer.Installed(host); !ok {
				t.Errorf("not installed in %s: %v", host, interposer.Check(host))
			}
		})
	}
}
