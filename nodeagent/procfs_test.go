package nodeagent

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

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
		if err := killHostProcess(t.Context(), "/proc", Process{PID: pid}); err == nil {
			t.Errorf("killHostProcess(%d) succeeded, want a refusal", pid)
		}
	}
}

func TestParseProcStat(t *testing.T) {
	rest := " 1 1 1 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 %d 1000 100 18446744073709551615"
	cases := map[string]struct {
		content string
		want    procStat
		wantErr bool
	}{
		"plain":                         {content: fmt.Sprintf("42 (sleep) S"+rest, 5125), want: procStat{State: 'S', StartTicks: 5125}},
		"spaces and parens in the name": {content: fmt.Sprintf("42 (a) b (c) R"+rest, 77), want: procStat{State: 'R', StartTicks: 77}},
		"zombie":                        {content: fmt.Sprintf("42 (x) Z"+rest, 9), want: procStat{State: 'Z', StartTicks: 9}},
		"no name":                       {content: "42 sleep S 1 1", wantErr: true},
		"cut short":                     {content: "42 (sleep) S 1 1", wantErr: true},
		"start time is not a number":    {content: "42 (sleep) S" + strings.Replace(rest, "%d", "x", 1), wantErr: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := parseProcStat(tc.content)
			if (err != nil) != tc.wantErr {
				t.Fatalf("parseProcStat error = %v, want error %v", err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("parseProcStat (-want,+got):\n%s", diff)
			}
		})
	}
}

// child is a real process started by the test, with what /proc says of it.
type child struct {
	cmd    *exec.Cmd
	pid    int32
	start  uint64
	uid    types.UID
	cid    string
	exited chan error
}

// startChild starts `sleep` and reads its identity from the real /proc.
func startChild(t *testing.T) *child {
	t.Helper()
	cmd := exec.Command("sleep", "300")
	if err := cmd.Start(); err != nil {
		t.Fatalf("start a child process: %v", err)
	}
	c := &child{cmd: cmd, pid: int32(cmd.Process.Pid), exited: make(chan error, 1)}
	go func() { c.exited <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	st, err := readProcStat("/proc", int(c.pid))
	if err != nil {
		t.Fatal(err)
	}
	c.start = st.StartTicks
	if c.uid, c.cid, err = processPod("/proc", c.pid); err != nil {
		t.Fatal(err)
	}
	return c
}

// measured is the child as the watchdog would have measured it.
func (c *child) measured() Process {
	return Process{PID: c.pid, StartTicks: c.start, PodUID: c.uid, ContainerID: c.cid, DeviceIndex: 0}
}

// alive reports whether the child still runs.
func (c *child) alive() bool {
	select {
	case err := <-c.exited:
		c.exited <- err
		return false
	default:
		return true
	}
}

// waitExit waits for the child to end and returns how.
func (c *child) waitExit(t *testing.T) error {
	t.Helper()
	select {
	case err := <-c.exited:
		c.exited <- err
		return err
	case <-time.After(10 * time.Second):
		t.Fatalf("process %d still runs after 10s", c.pid)
		return nil
	}
}

// twoChildren starts two real processes that started at different clock
// ticks, as a PID and the process that later reuses it would.
func twoChildren(t *testing.T) (*child, *child) {
	t.Helper()
	a := startChild(t)
	for range 100 {
		time.Sleep(20 * time.Millisecond)
		if b := startChild(t); b.start != a.start {
			return a, b
		}
	}
	t.Fatal("could not start two processes at different clock ticks")
	return nil, nil
}

// TestKillRechecksTheProcessOnRealProcesses plays PID reuse with two real
// processes: the watchdog measured one, and the PID it holds now names the
// other (same PID number, later start). Only the measured process may be
// signalled.
func TestKillRechecksTheProcessOnRealProcesses(t *testing.T) {
	a, b := twoChildren(t)
	// b's PID, but a's identity: the measured process exited and b took
	// its PID.
	reused := a.measured()
	reused.PID = b.pid
	err := killHostProcess(t.Context(), "/proc", reused)
	if !errors.Is(err, ErrProcessChanged) {
		t.Errorf("kill of a reused PID: err = %v, want ErrProcessChanged", err)
	}
	if !b.alive() {
		t.Fatal("the process that took the PID was killed")
	}
	// The measured process itself is killed.
	if err := killHostProcess(t.Context(), "/proc", a.measured()); err != nil {
		t.Fatalf("kill of the measured process: %v", err)
	}
	var exit *exec.ExitError
	if err := a.waitExit(t); !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Errorf("measured process ended with %v, want SIGKILL", err)
	}
	// Once it has exited (and been reaped), its PID names nothing.
	if err := killHostProcess(t.Context(), "/proc", a.measured()); !errors.Is(err, ErrProcessNotFound) {
		t.Errorf("kill of an exited process: err = %v, want ErrProcessNotFound", err)
	}
	if err := verifyProcess("/proc", b.measured()); err != nil {
		t.Errorf("verify the other, still running process: %v", err)
	}
	if !b.alive() {
		t.Error("the other process was killed")
	}
}

// TestKillRechecksTheCgroup moves a real process to another pod by faking
// its cgroup in an injected /proc: the watchdog must not kill a process
// that is no longer in the pod and container it measured.
func TestKillRechecksTheCgroup(t *testing.T) {
	const podA, podB = "0c1d2e3f-1111-2222-3333-444455556666", "9f8e7d6c-1111-2222-3333-444455556666"
	cidA, cidB := strings.Repeat("ab", 32), strings.Repeat("cd", 32)
	cgroup := func(uid, cid string) string {
		return "0::/kubepods.slice/kubepods-pod" + strings.ReplaceAll(uid, "-", "_") + ".slice/cri-containerd-" + cid + ".scope\n"
	}
	c := startChild(t)
	root := t.TempDir()
	dir := filepath.Join(root, fmt.Sprint(c.pid))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", c.pid))
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, content string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("stat", string(stat))
	measured := Process{PID: c.pid, StartTicks: c.start, PodUID: podA, ContainerID: cidA}
	cases := map[string]struct {
		cgroup  string
		process Process
		want    error
	}{
		"same pod and container": {cgroup: cgroup(podA, cidA), process: measured},
		"another pod":            {cgroup: cgroup(podB, cidB), process: measured, want: ErrProcessChanged},
		"another container":      {cgroup: cgroup(podA, cidB), process: measured, want: ErrProcessChanged},
		"out of any pod":         {cgroup: "0::/system.slice/cron.service\n", process: measured, want: ErrProcessChanged},
		"start time unknown":     {cgroup: cgroup(podA, cidA), process: Process{PID: c.pid, PodUID: podA, ContainerID: cidA}, want: ErrProcessChanged},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			write("cgroup", tc.cgroup)
			if err := verifyProcess(root, tc.process); !errors.Is(err, tc.want) || (tc.want == nil && err != nil) {
				t.Errorf("verifyProcess = %v, want %v", err, tc.want)
			}
			if tc.want == nil {
				return
			}
			if err := killHostProcess(t.Context(), root, tc.process); !errors.Is(err, tc.want) {
				t.Errorf("killHostProcess = %v, want %v", err, tc.want)
			}
			if !c.alive() {
				t.Fatal("a process outside the measured container was killed")
			}
		})
	}
	write("cgroup", cgroup(podA, cidA))
	if err := killHostProcess(t.Context(), root, measured); err != nil {
		t.Fatalf("kill of the measured process: %v", err)
	}
	if err := c.waitExit(t); err == nil {
		t.Error("the measured process exited cleanly; want it killed")
	}
}
