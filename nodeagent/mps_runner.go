package nodeagent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// ExecRunner runs the MPS programs on the machine the agent (or the MPS
// keeper) runs on, and finds the daemons in its /proc.
type ExecRunner struct {
	// ProcRoot is where the runner's own processes are visible; "/proc"
	// when empty. It must be the PID namespace the daemons run in.
	ProcRoot string
}

var _ CommandRunner = ExecRunner{}

func (r ExecRunner) procRoot() string {
	if r.ProcRoot == "" {
		return "/proc"
	}
	return r.ProcRoot
}

// Launch runs c to completion in a new session (setsid), with no parent-death
// signal, so that the daemon it leaves behind shares neither the caller's
// session nor its process group: neither a signal to the agent's group nor
// the agent's exit reaches it.
func (ExecRunner) Launch(ctx context.Context, c Command) error {
	for _, d := range c.Dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("create %s for %s: %w", d, c.Path, err)
		}
	}
	cmd := exec.CommandContext(ctx, c.Path, c.Args...) //nolint:gosec // the operator's configured program
	cmd.Env = append(os.Environ(), c.Env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// The daemon inherits no pipe of ours, so Wait returns once the
	// launcher itself exits.
	cmd.WaitDelay = mpsStopGrace
	// A daemon that keeps the launcher's output open is not an error: the
	// launcher has exited, and WaitDelay let go of the pipe.
	if err := cmd.Run(); err != nil && !errors.Is(err, exec.ErrWaitDelay) {
		return fmt.Errorf("start %s %s: %w: %s", c.Path, strings.Join(c.Args, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}

// Run runs cmd to completion.
func (ExecRunner) Run(ctx context.Context, c Command, stdin string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, c.Path, c.Args...) //nolint:gosec // the operator's configured program
	cmd.Env = append(os.Environ(), c.Env...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("run %s: %w", c.Path, err)
	}
	return out, nil
}

// Find reads the daemon's PID from <pipeDir>/nvidia-cuda-mps-control.pid
// and returns it when that process runs, is program (its command line
// names it), and, where its environment can be read, serves pipeDir. A
// PID file left by a daemon that died, whose PID went to another process,
// finds nothing.
func (r ExecRunner) Find(pipeDir, program string) (DaemonProcess, bool) {
	b, err := os.ReadFile(filepath.Join(pipeDir, mpsPIDFile))
	if err != nil {
		return DaemonProcess{}, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return DaemonProcess{}, false
	}
	st, err := readProcStat(r.procRoot(), pid)
	if err != nil || st.State == 'Z' || st.State == 'X' {
		return DaemonProcess{}, false
	}
	args, err := readCmdline(r.procRoot(), pid)
	if err != nil || !slices.ContainsFunc(args, func(a string) bool { return filepath.Base(a) == filepath.Base(program) }) {
		return DaemonProcess{}, false
	}
	if env, err := os.ReadFile(filepath.Join(r.procRoot(), strconv.Itoa(pid), "environ")); err == nil {
		if !bytes.Contains(append([]byte{0}, env...), []byte("\x00CUDA_MPS_PIPE_DIRECTORY="+pipeDir+"\x00")) {
			return DaemonProcess{}, false
		}
	}
	return DaemonProcess{PID: pid, StartTicks: st.StartTicks}, true
}

// Alive reports whether p's PID still names p: it runs, not as a zombie,
// with the same start time.
func (r ExecRunner) Alive(p DaemonProcess) bool {
	st, err := readProcStat(r.procRoot(), p.PID)
	return err == nil && st.State != 'Z' && st.State != 'X' && st.StartTicks == p.StartTicks
}

// Signal sends sig to p through a pidfd, after checking that its PID still
// names p, so that a PID reused since never gets the signal.
func (r ExecRunner) Signal(p DaemonProcess, sig syscall.Signal) error {
	if p.PID <= 1 {
		return fmt.Errorf("signal MPS daemon %d: refusing to signal PID %d", p.PID, p.PID)
	}
	fd, err := unix.PidfdOpen(p.PID, 0)
	if err != nil && !errors.Is(err, unix.ENOSYS) {
		return fmt.Errorf("signal MPS daemon %d: %w", p.PID, err)
	}
	if err == nil {
		defer func() { _ = unix.Close(fd) }()
	}
	if !r.Alive(p) {
		return fmt.Errorf("signal MPS daemon %d: %w", p.PID, ErrProcessNotFound)
	}
	if err == nil {
		err = unix.PidfdSendSignal(fd, sig, nil, 0)
	} else {
		err = unix.Kill(p.PID, sig)
	}
	if err != nil {
		return fmt.Errorf("signal MPS daemon %d: %w", p.PID, err)
	}
	return nil
}

// SimulatedRunner stands in for the MPS programs on simulated nodes: a
// "daemon" runs from Launch until its control program is sent quit or it
// is signalled; the control program remembers what each daemon was set to
// ("set_<x> [of what] <value>") and answers "get_<x> [of what]".
type SimulatedRunner struct {
	lock     sync.Mutex
	next     int
	daemons  map[string]DaemonProcess // by pipe directory
	settings map[string]string        // "<pipe dir> <setting>" → value
}

var _ CommandRunner = (*SimulatedRunner)(nil)

// NewSimulatedRunner returns a runner with no daemon set up.
func NewSimulatedRunner() *SimulatedRunner {
	return &SimulatedRunner{next: 1000, daemons: map[string]DaemonProcess{}, settings: map[string]string{}}
}

func envOf(env []string, key string) string {
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, key+"="); ok {
			return v
		}
	}
	return ""
}

// Launch starts a simulated daemon for the command's pipe directory.
func (r *SimulatedRunner) Launch(_ context.Context, c Command) error {
	r.lock.Lock()
	defer r.lock.Unlock()
	pipe := envOf(c.Env, "CUDA_MPS_PIPE_DIRECTORY")
	if _, ok := r.daemons[pipe]; !ok {
		r.next++
		r.daemons[pipe] = DaemonProcess{PID: r.next, StartTicks: uint64(r.next)}
	}
	return nil
}

// Run answers control commands.
func (r *SimulatedRunner) Run(_ context.Context, c Command, stdin string) ([]byte, error) {
	r.lock.Lock()
	defer r.lock.Unlock()
	pipe := envOf(c.Env, "CUDA_MPS_PIPE_DIRECTORY")
	if _, ok := r.daemons[pipe]; !ok {
		return []byte("Cannot find MPS control daemon process"), errors.New("exit status 1")
	}
	var out []string
	for line := range strings.SplitSeq(strings.TrimSpace(stdin), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 2 && strings.HasPrefix(f[0], "set_"):
			// The last argument is the value, the others say of what
			// (a server's PID, a device).
			key := strings.Join(append([]string{strings.TrimPrefix(f[0], "set_")}, f[1:len(f)-1]...), " ")
			r.settings[pipe+" "+key] = f[len(f)-1]
		case len(f) == 1 && f[0] == "get_server_list":
			// Simulated daemons start no servers.
		case len(f) >= 1 && strings.HasPrefix(f[0], "get_"):
			key := strings.Join(append([]string{strings.TrimPrefix(f[0], "get_")}, f[1:]...), " ")
			out = append(out, r.settings[pipe+" "+key])
		case len(f) == 1 && f[0] == "quit":
			delete(r.daemons, pipe)
		}
	}
	return []byte(strings.Join(out, "\n")), nil
}

// Find returns the simulated daemon of pipeDir.
func (r *SimulatedRunner) Find(pipeDir, _ string) (DaemonProcess, bool) {
	r.lock.Lock()
	defer r.lock.Unlock()
	p, ok := r.daemons[pipeDir]
	return p, ok
}

// Alive reports whether the simulated daemon runs.
func (r *SimulatedRunner) Alive(p DaemonProcess) bool {
	r.lock.Lock()
	defer r.lock.Unlock()
	for _, d := range r.daemons {
		if d == p {
			return true
		}
	}
	return false
}

// Signal ends the simulated daemon.
func (r *SimulatedRunner) Signal(p DaemonProcess, _ syscall.Signal) error {
	r.lock.Lock()
	defer r.lock.Unlock()
	for pipe, d := range r.daemons {
		if d == p {
			delete(r.daemons, pipe)
			return nil
		}
	}
	return fmt.Errorf("signal simulated MPS daemon %d: %w", p.PID, ErrProcessNotFound)
}
