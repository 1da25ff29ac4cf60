package webhook

import (
	"path"
	"strings"
	"testing"
)

// TestHostPathReach: what each node path reaches, as the refusals and the
// CEL rule (celHostPathReach, run through the API server in
// TestDoorsAPIServer) say it.
func TestHostPathReach(t *testing.T) {
	mps := reachMPSText + " (" + DefaultMPSDir + ")"
	cases := map[string]string{
		"/":                            reachDevicesText,
		"/dev":                         reachDevicesText,
		"/dev/nvidia0":                 reachDevicesText,
		"/dev/nvidia-caps/nvidia-cap1": reachDevicesText,
		"/dev/char":                    reachDevicesText,
		"/dev/char/195:255":            reachDevicesText,
		"/dev/shm":                     "",
		"/dev/fuse":                    "",
		"/run":                         mps,
		"/run/partita":                 mps,
		"/run/partita/mps":             mps,
		"/run/partita/mps/GPU-1":       mps,
		"/run/partita/mpsx":            "",
		"/run/partita/other":           "",
		"/run/nvidia":                  reachNVIDIAText,
		"/run/nvidia/driver/dev":       reachNVIDIAText,
		"/run/nvidia-persistenced":     "",
		"/run/containerd":              "",
		"/var":                         reachStateText,
		"/var/lib":                     reachStateText,
		"/var/lib/partita":             reachStateText,
		"/var/lib/partita/interposer":  reachStateText,
		"/var/lib/partitax":            "",
		"/var/lib/kubelet":             "",
		"/var/log":                     "",
		"/data":                        "",
	}
	for p, want := range cases {
		if got := hostPathReach(p, DefaultMPSDir); got != want {
			t.Errorf("hostPathReach(%q) = %q, want %q", p, got, want)
		}
	}
}

// FuzzNodePath: a hostPath's reach does not depend on how it is spelled.
func FuzzNodePath(f *testing.F) {
	for _, s := range []string{"/run/partita/mps", "run//partita/./mps/", "/var/run/partita", "/dev/nvidia0", "/", "",
		"/data/../dev", "/var/run", "/var/runx/partita/mps", "./var/run/../run/nvidia", "/var/run/nvidia-container-devices/all"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		n := nodePath(p)
		if !path.IsAbs(n) || path.Clean(n) != n {
			t.Fatalf("nodePath(%q) = %q, not a clean absolute path", p, n)
		}
		if again := nodePath(n); again != n {
			t.Fatalf("nodePath(nodePath(%q)) = %q, want %q", p, again, n)
		}
		if n == "/var/run" || strings.HasPrefix(n, "/var/run/") {
			t.Fatalf("nodePath(%q) = %q still goes through /var/run", p, n)
		}
		reach := hostPathReach(n, DefaultMPSDir)
		for _, q := range []string{"/" + p, p + "/", strings.ReplaceAll(p, "/", "//"), strings.ReplaceAll(p, "/", "/./")} {
			if got := hostPathReach(nodePath(q), DefaultMPSDir); got != reach {
				t.Fatalf("%q reaches %q, but %q reaches %q", p, reach, q, got)
			}
		}
		// What is under a directory that reaches the MPS pipes or the
		// devices reaches them too, except where only device nodes count.
		if reach != "" && reach != reachDevicesText {
			if got := hostPathReach(nodePath(n+"/x"), DefaultMPSDir); got == "" && !ancestorOrSelf(n, DefaultMPSDir) && !ancestorOrSelf(n, nvidiaRunDir) && !ancestorOrSelf(n, partitaStateDir) {
				t.Fatalf("%q reaches %q but %q nothing", n, reach, n+"/x")
			}
		}
		_ = reachesContainerDevices(p)
	})
}
