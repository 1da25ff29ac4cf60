package nodeagent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

func TestParseCgroup(t *testing.T) {
	const uid = "0c1d2e3f-1111-2222-3333-444455556666"
	under := strings.ReplaceAll(uid, "-", "_")
	cid := strings.Repeat("0123456789abcdef", 4)
	cases := map[string]struct {
		content string
		wantUID types.UID
		wantCID string
	}{
		"cgroup v2, systemd, containerd": {
			content: "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + under + ".slice/cri-containerd-" + cid + ".scope\n",
			wantUID: uid, wantCID: cid,
		},
		"cgroup v2, systemd, CRI-O": {
			content: "0::/kubepods.slice/kubepods-pod" + under + ".slice/crio-" + cid + ".scope\n",
			wantUID: uid, wantCID: cid,
		},
		"cgroup v1, cgroupfs": {
			content: "12:pids:/kubepods/besteffort/pod" + uid + "/" + cid + "\n11:memory:/kubepods/besteffort/pod" + uid + "/" + cid + "\n",
			wantUID: uid, wantCID: cid,
		},
		"cgroup v1, docker": {
			content: "4:devices:/kubepods/pod" + uid + "/docker-" + cid + ".scope\n",
			wantUID: uid, wantCID: cid,
		},
		"pod sandbox level only": {
			content: "0::/kubepods/burstable/pod" + uid + "\n",
			wantUID: uid,
		},
		"host process": {
			content: "0::/system.slice/sshd.service\n",
		},
		"empty": {},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			uid, cid := parseCgroup(tc.content)
			if diff := cmp.Diff([2]string{string(tc.wantUID), tc.wantCID}, [2]string{string(uid), cid}); diff != "" {
				t.Errorf("parseCgroup (-want,+got):\n%s", diff)
			}
		})
	}
}

func TestNUMANode(t *testing.T) {
	root := t.TempDir()
	write := func(addr, content string) {
		dir := filepath.Join(root, "bus", "pci", "devices", addr)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "numa_node"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("0000:3b:00.0", "1\n")
	write("0000:1a:00.0", "-1\n")
	cases := map[string]struct {
		busID string
		want  *int32
	}{
		"NVML long domain, upper case": {busID: "00000000:3B:00.0", want: ptr.To[int32](1)},
		"sysfs form":                   {busID: "0000:3b:00.0", want: ptr.To[int32](1)},
		"platform does not say":        {busID: "00000000:1A:00.0"},
		"no such device":               {busID: "00000000:99:00.0"},
		"no bus ID":                    {},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, numaNode(root, tc.busID)); diff != "" {
				t.Errorf("numaNode(%q) (-want,+got):\n%s", tc.busID, diff)
			}
		})
	}
}

func TestKillHostProcessRefusesInit(t *testing.T) {
	for _, pid := range []int32{0, 1, -5} {
		if err := killHostProcess(t.Context(), pid); err == nil {
			t.Errorf("killHostProcess(%d) succeeded, want a refusal", pid)
		}
	}
}
