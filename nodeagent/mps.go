package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"
)

// Command is a program the agent runs.
type Command struct {
	// Path is the program.
	Path string
	// Args are its arguments.
	Args []string
	// Env is added to the agent's environment.
	Env []string
	// Dirs are directories the program needs; the runner creates them.
	Dirs []string
}

// CommandRunner runs the agent's helper programs (the MPS control daemon
// and its control client). Tests use a fake; the simulated backend uses
// SimulatedRunner.
type CommandRunner interface {
	// Start starts a long-running program.
	Start(ctx context.Context, cmd Command) (RunningCommand, error)
	// Run runs a program to completion with stdin as its input and returns
	// its combined output.
	Run(ctx context.Context, cmd Command, stdin string) ([]byte, error)
}

// RunningCommand is a started program.
type RunningCommand interface {
	// Wait blocks until the program exits. It is called once.
	Wait() error
	// Stop ends the program: SIGTERM, then SIGKILL after a grace period.
	Stop()
}

// MPSConfig configures the MPS control daemons of mps mode.
type MPSConfig struct {
	// ControlPath is the nvidia-cuda-mps-control program.
	ControlPath string
	// Dir holds one directory per device, named by UUID, with the daemon's
	// pipe/ and log/ directories. A pod's containers reach their device's
	// daemon through CUDA_MPS_PIPE_DIRECTORY=<Dir>/<UUID>/pipe.
	Dir string
	// Runner runs the programs.
	Runner CommandRunner
}

// mpsStopGrace is how long a daemon gets to quit before it is killed.
const mpsStopGrace = 5 * time.Second

// mpsRetry is how soon limits a daemon did not take are sent again.
const mpsRetry = 500 * time.Millisecond

// mpsTarget is a device that should have a daemon, with the defaults the
// daemon applies to clients that set no limits of their own.
type mpsTarget struct {
	Index int32
	UUID  string
	// DefaultMemLimitMiB is the pinned device memory limit of clients that do
	// not set CUDA_MPS_PINNED_DEVICE_MEM_LIMIT: the memory no slice claims.
	DefaultMemLimitMiB int64
	// DefaultThreadPercent is the active thread percentage of clients that
	// do not set CUDA_MPS_ACTIVE_THREAD_PERCENTAGE: the compute no slice
	// claims.
	DefaultThreadPercent int32
}

// mpsManager keeps one MPS control daemon running per shared device of a
// node, restarts a daemon that exits, and applies its default limits.
type mpsManager struct {
	node    string
	cfg     MPSConfig
	clock   clock.Clock
	metrics *Metrics

	lock     sync.Mutex
	daemons  map[string]*mpsDaemon // by UUID
	restarts map[int32]int         // by device index
}

// mpsDaemon is the supervisor of one device's daemon.
type mpsDaemon struct {
	target mpsTarget // guarded by the manager's lock
	cancel context.CancelFunc
	done   chan struct{}
	wake   chan struct{} // the target's limits changed
}

func newMPSManager(node string, cfg MPSConfig, clk clock.Clock, m *Metrics) *mpsManager {
	return &mpsManager{node: node, cfg: cfg, clock: clk, metrics: m, daemons: map[string]*mpsDaemon{}, restarts: map[int32]int{}}
}

// ensure makes the running daemons match targets: it starts the missing
// ones (under ctx, which should live as long as the node is served), stops
// the unwanted ones and hands changed limits to the running ones.
func (m *mpsManager) ensure(ctx context.Context, targets []mpsTarget) {
	want := make(map[string]mpsTarget, len(targets))
	for _, t := range targets {
		want[t.UUID] = t
	}
	var stopping []*mpsDaemon
	m.lock.Lock()
	for uuid, d := range m.daemons {
		if _, ok := want[uuid]; !ok {
			d.cancel()
			stopping = append(stopping, d)
			delete(m.daemons, uuid)
		}
	}
	for uuid, t := range want {
		d, ok := m.daemons[uuid]
		if !ok {
			dctx, cancel := context.WithCancel(ctx)
			d = &mpsDaemon{target: t, cancel: cancel, done: make(chan struct{}), wake: make(chan struct{}, 1)}
			m.daemons[uuid] = d
			go m.supervise(dctx, d, t)
			continue
		}
		if d.target != t {
			d.target = t
			select {
			case d.wake <- struct{}{}:
			default:
			}
		}
	}
	m.lock.Unlock()
	for _, d := range stopping {
		<-d.done
	}
}

// stopAll stops every daemon and waits for them.
func (m *mpsManager) stopAll() { m.ensure(context.Background(), nil) }

// target returns a daemon's current target.
func (m *mpsManager) target(d *mpsDaemon) mpsTarget {
	m.lock.Lock()
	defer m.lock.Unlock()
	return d.target
}

// pipeDir is <Dir>/<UUID>/pipe, the contract with the webhook: an MPS
// client mounts exactly this directory (subPathExpr $(PARTITA_DEVICE)/pipe
// at webhook.MPSPipeMountPath). It is created and never removed, since a
// client's bind mount would keep pointing at a removed directory.
func (m *mpsManager) pipeDir(uuid string) string { return filepath.Join(m.cfg.Dir, uuid, "pipe") }

// daemonCommand runs the control daemon of one device in the foreground,
// so that the agent sees it exit.
func (m *mpsManager) daemonCommand(uuid string) Command {
	logDir := filepath.Join(m.cfg.Dir, uuid, "log")
	return Command{
		Path: m.cfg.ControlPath,
		Args: []string{"-f"},
		Env:  []string{"CUDA_VISIBLE_DEVICES=" + uuid, "CUDA_MPS_PIPE_DIRECTORY=" + m.pipeDir(uuid), "CUDA_MPS_LOG_DIRECTORY=" + logDir},
		Dirs: []string{m.pipeDir(uuid), logDir},
	}
}

// control sends commands to a device's daemon.
func (m *mpsManager) control(ctx context.Context, uuid string, commands ...string) error {
	_, err := m.controlOutput(ctx, uuid, commands...)
	return err
}

// controlOutput sends commands to a device's daemon and returns its answer.
func (m *mpsManager) controlOutput(ctx context.Context, uuid string, commands ...string) (string, error) {
	cmd := Command{Path: m.cfg.ControlPath, Env: []string{"CUDA_MPS_PIPE_DIRECTORY=" + m.pipeDir(uuid)}}
	out, err := m.cfg.Runner.Run(ctx, cmd, strings.Join(commands, "\n")+"\n")
	if err != nil {
		return "", fmt.Errorf("send %q to the MPS daemon of %s: %w: %s", commands, uuid, err, strings.TrimSpace(string(out)))
	}
	return strings.TrimSpace(string(out)), nil
}

// TryMPS starts an MPS control daemon for every device of inv as mps mode
// does, checks that each answers with the default limits the agent set
// within hold and never exited, and stops them. It is the real-GPU check of
// mps mode (`partita agent --once --mode mps`).
func TryMPS(ctx context.Context, cfg MPSConfig, inv *Inventory, hold time.Duration) error {
	if cfg.Runner == nil {
		cfg.Runner = ExecRunner{}
	}
	m := newMPSManager(inv.Node, cfg, clock.RealClock{}, NewMetrics())
	targets := mpsTargets(inv.Devices, nil)
	if len(targets) == 0 {
		return errors.New("try MPS: no device can be shared")
	}
	m.ensure(ctx, targets)
	defer m.stopAll()
	// Each daemon must answer with the defaults the agent set, within hold.
	deadline := time.Now().Add(hold)
	var errs []error
	for _, t := range targets {
		for {
			out, err := m.controlOutput(ctx, t.UUID, "get_default_active_thread_percentage")
			if err == nil && strings.HasPrefix(out, fmt.Sprint(t.DefaultThreadPercent)) {
				break
			}
			if time.Now().After(deadline) {
				if err == nil {
					err = fmt.Errorf("active thread percentage is %q, want %d", out, t.DefaultThreadPercent)
				}
				errs = append(errs, fmt.Errorf("try MPS on device %d: %w", t.Index, err))
				break
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(100 * time.Millisecond):
			}
		}
		m.lock.Lock()
		n := m.restarts[t.Index]
		m.lock.Unlock()
		if n > 0 {
			errs = append(errs, fmt.Errorf("try MPS on device %d: the daemon exited %d times", t.Index, n))
		}
	}
	return errors.Join(errs...)
}

// limitCommands are the control commands that set a target's defaults. The
// daemon sees only its own device, as device 0.
func limitCommands(t mpsTarget) []string {
	return []string{
		fmt.Sprintf("set_default_active_thread_percentage %d", t.DefaultThreadPercent),
		fmt.Sprintf("set_default_device_pinned_mem_limit 0 %dM", t.DefaultMemLimitMiB),
	}
}

// supervise runs one device's daemon until ctx ends, restarting it with
// backoff when it exits and applying its limits after each start and each
// change.
func (m *mpsManager) supervise(ctx context.Context, d *mpsDaemon, t mpsTarget) {
	defer close(d.done)
	log := logr.FromContextOrDiscard(ctx).WithValues("device", t.Index, "uuid", t.UUID)
	backoff := time.Second
	for {
		started := m.clock.Now()
		r, err := m.cfg.Runner.Start(ctx, m.daemonCommand(t.UUID))
		if err != nil {
			log.Error(err, "Could not start the MPS control daemon", "retryIn", backoff)
		} else {
			log.V(2).Info("Started MPS control daemon")
			err = m.run(ctx, d, r, log)
			if ctx.Err() != nil {
				log.V(2).Info("Stopped MPS control daemon")
				return
			}
			m.metrics.mpsRestarts.WithLabelValues(m.node, deviceLabel(t.Index)).Inc()
			m.lock.Lock()
			m.restarts[t.Index]++
			m.lock.Unlock()
			log.Error(err, "MPS control daemon exited; restarting it", "retryIn", backoff)
			if m.clock.Since(started) > time.Minute {
				backoff = time.Second
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-m.clock.After(backoff):
		}
		backoff = min(2*backoff, time.Minute)
	}
}

// errDaemonExited says the daemon exited without an error status.
var errDaemonExited = errors.New("daemon exited")

// run watches a started daemon until it exits or ctx ends, applying its
// limits whenever they change.
func (m *mpsManager) run(ctx context.Context, d *mpsDaemon, r RunningCommand, log logr.Logger) error {
	exited := make(chan error, 1)
	go func() { exited <- r.Wait() }()
	// A daemon just started may not take commands yet: retry until it does.
	var retry <-chan time.Time
	apply := func() {
		t := m.target(d)
		if err := m.control(ctx, t.UUID, limitCommands(t)...); err != nil {
			log.V(2).Info("MPS daemon did not take its default limits; retrying", "err", err)
			retry = m.clock.After(mpsRetry)
			return
		}
		retry = nil
		log.V(2).Info("Set MPS default limits", "memLimitMiB", t.DefaultMemLimitMiB, "threadPercent", t.DefaultThreadPercent)
	}
	apply()
	for {
		select {
		case <-retry:
			apply()
		case <-ctx.Done():
			t := m.target(d)
			qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), mpsStopGrace)
			if err := m.control(qctx, t.UUID, "quit"); err != nil {
				log.V(2).Info("MPS daemon did not take quit; stopping it", "err", err)
			}
			cancel()
			r.Stop()
			if err := <-exited; err != nil {
				log.V(4).Info("MPS daemon stopped", "err", err)
			}
			return ctx.Err()
		case err := <-exited:
			if err == nil {
				err = errDaemonExited
			}
			return err
		case <-d.wake:
			apply()
		}
	}
}

// ExecRunner runs programs on the host (in the agent's container).
type ExecRunner struct{}

var _ CommandRunner = ExecRunner{}

// Start starts cmd in its own process group.
func (ExecRunner) Start(_ context.Context, c Command) (RunningCommand, error) {
	for _, d := range c.Dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("create %s for %s: %w", d, c.Path, err)
		}
	}
	cmd := exec.Command(c.Path, c.Args...) //nolint:gosec // the operator's configured program
	cmd.Env = append(os.Environ(), c.Env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", c.Path, err)
	}
	return &execRunning{cmd: cmd}, nil
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

type execRunning struct {
	cmd    *exec.Cmd
	exited atomic.Bool
}

func (r *execRunning) Wait() error {
	err := r.cmd.Wait()
	r.exited.Store(true)
	return err
}

func (r *execRunning) Stop() {
	pgid := -r.cmd.Process.Pid
	_ = syscall.Kill(pgid, syscall.SIGTERM)
	time.AfterFunc(mpsStopGrace, func() {
		if !r.exited.Load() {
			_ = syscall.Kill(pgid, syscall.SIGKILL)
		}
	})
}

// SimulatedRunner stands in for the MPS programs on simulated nodes: a
// "daemon" runs until stopped, and the control program remembers what each
// daemon was set to ("set_default_<x> ...") and answers "get_default_<x>".
type SimulatedRunner struct {
	lock     sync.Mutex
	settings map[string]string // "<pipe dir> <setting>" → value
}

var _ CommandRunner = (*SimulatedRunner)(nil)

// NewSimulatedRunner returns a runner with no daemon set up.
func NewSimulatedRunner() *SimulatedRunner {
	return &SimulatedRunner{settings: map[string]string{}}
}

// Start starts a simulated daemon.
func (*SimulatedRunner) Start(context.Context, Command) (RunningCommand, error) {
	return &simulatedRunning{stop: make(chan struct{})}, nil
}

// Run answers control commands.
func (r *SimulatedRunner) Run(_ context.Context, c Command, stdin string) ([]byte, error) {
	r.lock.Lock()
	defer r.lock.Unlock()
	pipe := ""
	for _, e := range c.Env {
		if v, ok := strings.CutPrefix(e, "CUDA_MPS_PIPE_DIRECTORY="); ok {
			pipe = v
		}
	}
	var out []string
	for line := range strings.SplitSeq(strings.TrimSpace(stdin), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 2 && strings.HasPrefix(f[0], "set_"):
			r.settings[pipe+" "+strings.TrimPrefix(f[0], "set_")] = strings.Join(f[1:], " ")
		case len(f) >= 1 && strings.HasPrefix(f[0], "get_"):
			out = append(out, r.settings[pipe+" "+strings.TrimPrefix(f[0], "get_")])
		}
	}
	return []byte(strings.Join(out, "\n")), nil
}

type simulatedRunning struct {
	once sync.Once
	stop chan struct{}
}

func (r *simulatedRunning) Wait() error { <-r.stop; return nil }
func (r *simulatedRunning) Stop()       { r.once.Do(func() { close(r.stop) }) }
