package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strconv"
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

// DaemonProcess names one running MPS control daemon: its PID and its start
// time (clock ticks since boot), which together tell it from any later
// process that gets the same PID.
type DaemonProcess struct {
	// PID is the daemon's PID in the PID namespace of whoever runs it.
	PID int `json:"pid"`
	// StartTicks is when it started, from /proc/<pid>/stat.
	StartTicks uint64 `json:"startTicks"`
}

// CommandRunner starts, finds, watches and ends the MPS control daemons and
// runs their control client. ExecRunner does it on the host; the simulated
// backend uses SimulatedRunner.
//
// The daemons are not the agent's children in any way that ties them to
// it: they start in a session of their own, daemonise, and are found again
// by the PID file they write in their pipe directory, so that a restarted
// agent adopts the daemons the last one started and their clients keep
// running.
type CommandRunner interface {
	// Launch runs the daemon's start command (nvidia-cuda-mps-control -d)
	// to completion, in a session of its own.
	Launch(ctx context.Context, cmd Command) error
	// Run runs a program to completion with stdin as its input and returns
	// its combined output.
	Run(ctx context.Context, cmd Command, stdin string) ([]byte, error)
	// Find returns the control daemon that serves pipeDir, read from the
	// PID file it writes there, when that process runs and is program.
	Find(pipeDir, program string) (DaemonProcess, bool)
	// Alive reports whether p still runs as the same process.
	Alive(p DaemonProcess) bool
	// Signal sends sig to p, unless p's PID no longer names p.
	Signal(p DaemonProcess, sig syscall.Signal) error
}

// MPSConfig configures the MPS control daemons of mps mode.
type MPSConfig struct {
	// ControlPath is the nvidia-cuda-mps-control program.
	ControlPath string
	// Dir holds one directory per device, named by UUID, with the daemon's
	// pipe/ and log/ directories. A pod's containers reach their device's
	// daemon through CUDA_MPS_PIPE_DIRECTORY=<Dir>/<UUID>/pipe.
	Dir string
	// StateDir keeps the record of the daemons running for the node
	// (mps-daemons.json), so that a restarted agent adopts them instead of
	// starting others; empty keeps no record.
	StateDir string
	// Keeper hands the daemons to `partita mps-keeper` on the node: the
	// agent writes the devices that need one to <StateDir>/mps-targets.json
	// and the keeper, whose process outlives the agent's container, runs
	// them. Requires StateDir.
	Keeper bool
	// Runner runs the programs.
	Runner CommandRunner
	// OnDrift, when set, hears of limits a daemon no longer had when they
	// were checked: a client of the daemon reached its control pipe and
	// changed them (docs/operations.md). The agent records an event; the
	// keeper, which has no API access, only logs and counts.
	OnDrift func(device int32, drift []string)
}

// mpsPIDFile is the file nvidia-cuda-mps-control -d writes its PID to, in
// its pipe directory.
const mpsPIDFile = "nvidia-cuda-mps-control.pid"

// mpsStopGrace is how long a daemon gets to quit before it is signalled.
const mpsStopGrace = 5 * time.Second

// mpsStartTimeout is how long a launched daemon has to write its PID file.
const mpsStartTimeout = 10 * time.Second

// mpsRetry is how soon limits a daemon did not take are sent again.
const mpsRetry = 500 * time.Millisecond

// mpsPoll is how often a daemon is checked for being alive: it is not the
// agent's child, so its exit is not reported to the agent.
const mpsPoll = time.Second

// mpsVerify is how often a daemon's limits are read back and set again
// where they drifted: any client of the daemon can change them through the
// control pipe, so they are a level to hold, not a value set once.
const mpsVerify = 10 * time.Second

// mpsTarget is a device that should have a daemon, with the limits its
// servers hold every client to. The daemon sets them as its defaults (the
// next server's) and on each running server; a client's own
// CUDA_MPS_PINNED_DEVICE_MEM_LIMIT and CUDA_MPS_ACTIVE_THREAD_PERCENTAGE can
// only lower them, never raise them (NVIDIA's MPS documentation), so they
// are the ceiling a client that drops its env reaches.
//
// The JSON names are those of the defaults older agents handed to the
// keeper, which is not upgraded with the agent: an older keeper reads these
// limits as defaults, which is what they are for the next server.
type mpsTarget struct {
	Index int32  `json:"index"`
	UUID  string `json:"uuid"`
	// MemLimitMiB is the pinned device memory limit of each client: the
	// largest slice on the device (1 MiB while it has none), so that no
	// client gets more than the largest slice, and none of Partita's gets
	// less than its own.
	MemLimitMiB int64 `json:"defaultMemLimitMiB"`
	// ThreadPercent is the active thread percentage of each client: 100,
	// unless every slice on the device has a compute limit, then the
	// largest of them.
	ThreadPercent int32 `json:"defaultThreadPercent"`
}

// mpsRecord is one daemon in mps-daemons.json.
type mpsRecord struct {
	UUID  string `json:"uuid"`
	Index int32  `json:"index"`
	DaemonProcess
	PipeDir string `json:"pipeDir"`
	LogDir  string `json:"logDir"`
	// Started is when the daemon was started or found, for people.
	Started time.Time `json:"started"`
	// MemLimitMiB is the pinned memory limit the daemon last took, as its
	// default and on every server; 0 until it took one. The NRI plugin
	// holds an MPS client's container until it covers the client's slice
	// (a client keeps the limit it connected under).
	MemLimitMiB int64 `json:"memLimitMiB,omitempty"`
}

// mpsState is the content of mps-daemons.json.
type mpsState struct {
	Node    string      `json:"node"`
	Daemons []mpsRecord `json:"daemons"`
}

// mpsManager keeps one MPS control daemon running per shared device of a
// node, restarts a daemon that exits, applies its default limits, and
// records the daemons so that the next agent adopts them. Daemons outlive
// the manager: only ensure (for devices that need none any more) and
// stopAll (the node left) end them.
type mpsManager struct {
	node    string
	cfg     MPSConfig
	clock   clock.WithTicker
	metrics *Metrics

	lock    sync.Mutex
	daemons map[string]*mpsDaemon // supervised, by UUID
	// records are the daemons known to run, by UUID: the supervised ones
	// and, until the first ensure, those adopted from the state file.
	records  map[string]mpsRecord
	restarts map[int32]int // by device index
	// saveLock serialises writes of the state file.
	saveLock sync.Mutex
}

// mpsDaemon is the supervisor of one device's daemon.
type mpsDaemon struct {
	target mpsTarget // guarded by the manager's lock
	cancel context.CancelFunc
	done   chan struct{}
	wake   chan struct{} // the target's limits changed
	// quit makes the supervisor end the daemon when it stops; otherwise
	// the daemon is left running for the next agent.
	quit atomic.Bool
}

// newMPSManager returns the manager of node's daemons. It reads the daemons
// an earlier agent recorded in cfg.StateDir and keeps those that still run,
// as the same process, to adopt them.
func newMPSManager(ctx context.Context, node string, cfg MPSConfig, clk clock.WithTicker, m *Metrics) *mpsManager {
	mm := &mpsManager{
		node: node, cfg: cfg, clock: clk, metrics: m,
		daemons: map[string]*mpsDaemon{}, records: map[string]mpsRecord{}, restarts: map[int32]int{},
	}
	if cfg.StateDir == "" {
		return mm
	}
	log := logr.FromContextOrDiscard(ctx)
	var st mpsState
	ok, err := readStateFile(filepath.Join(cfg.StateDir, mpsStateFile), &st)
	switch {
	case err != nil:
		log.Error(err, "Could not read the record of the MPS control daemons; daemons still running are found through their PID files")
	case ok && st.Node != "" && st.Node != node:
		log.Info("Ignored a record of MPS control daemons made for another node", "recordedNode", st.Node)
	case ok:
		for _, r := range st.Daemons {
			if r.PipeDir == mm.pipeDir(r.UUID) && cfg.Runner.Alive(r.DaemonProcess) {
				mm.records[r.UUID] = r
				log.V(2).Info("Found a running MPS control daemon to adopt", "device", r.Index, "uuid", r.UUID, "pid", r.PID)
			}
		}
	}
	mm.save(log)
	return mm
}

// ensure makes the running daemons match targets: it starts (or adopts)
// the missing ones under ctx, which should live as long as the node is
// served, ends the ones no target wants, and hands changed limits to the
// running ones.
func (m *mpsManager) ensure(ctx context.Context, targets []mpsTarget) {
	want := make(map[string]mpsTarget, len(targets))
	for _, t := range targets {
		want[t.UUID] = t
	}
	var stopping []*mpsDaemon
	var orphans []mpsRecord
	m.lock.Lock()
	// Recorded daemons nobody supervises (adopted from the state file) that
	// no target wants are ended here; supervised ones by their supervisor.
	for uuid, r := range m.records {
		if _, ok := want[uuid]; !ok && m.daemons[uuid] == nil {
			orphans = append(orphans, r)
		}
	}
	for uuid, d := range m.daemons {
		if _, ok := want[uuid]; !ok {
			d.quit.Store(true)
			d.cancel()
			stopping = append(stopping, d)
			delete(m.daemons, uuid)
		}
	}
	for uuid, t := range want {
		d, ok := m.daemons[uuid]
		if !ok {
			var adopted *mpsRecord
			if r, ok := m.records[uuid]; ok {
				adopted = &r
			}
			dctx, cancel := context.WithCancel(ctx)
			d = &mpsDaemon{target: t, cancel: cancel, done: make(chan struct{}), wake: make(chan struct{}, 1)}
			m.daemons[uuid] = d
			go m.supervise(dctx, d, t, adopted)
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
	log := logr.FromContextOrDiscard(ctx)
	for _, r := range orphans {
		m.stopProcess(ctx, r.UUID, r.DaemonProcess, log.WithValues("device", r.Index, "uuid", r.UUID))
		m.forget(log, r.UUID)
	}
	for _, d := range stopping {
		<-d.done
	}
}

// stopAll ends every daemon and waits for them: the node left mps mode, or
// the agent stopped serving it.
func (m *mpsManager) stopAll(ctx context.Context) { m.ensure(ctx, nil) }

// detach stops supervising the daemons and leaves them running, recorded
// for the next agent: the agent is shutting down (an upgrade, a restart),
// and their clients must not notice.
func (m *mpsManager) detach() {
	m.lock.Lock()
	daemons := m.daemons
	m.daemons = map[string]*mpsDaemon{}
	m.lock.Unlock()
	for _, d := range daemons {
		d.cancel()
	}
	for _, d := range daemons {
		<-d.done
	}
}

// recorded reports whether any daemon is known to run.
func (m *mpsManager) recorded() bool {
	m.lock.Lock()
	defer m.lock.Unlock()
	return len(m.records) > 0
}

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
func (m *mpsManager) logDir(uuid string) string  { return filepath.Join(m.cfg.Dir, uuid, "log") }

// daemonCommand starts the control daemon of one device: it daemonises,
// leaving the agent free to exit without taking the daemon along.
func (m *mpsManager) daemonCommand(uuid string) Command {
	return Command{
		Path: m.cfg.ControlPath,
		Args: []string{"-d"},
		Env:  []string{"CUDA_VISIBLE_DEVICES=" + uuid, "CUDA_MPS_PIPE_DIRECTORY=" + m.pipeDir(uuid), "CUDA_MPS_LOG_DIRECTORY=" + m.logDir(uuid)},
		Dirs: []string{m.pipeDir(uuid), m.logDir(uuid)},
	}
}

// record notes a daemon that runs for t and saves the record.
func (m *mpsManager) record(log logr.Logger, t mpsTarget, p DaemonProcess) {
	m.lock.Lock()
	m.records[t.UUID] = mpsRecord{UUID: t.UUID, Index: t.Index, DaemonProcess: p, PipeDir: m.pipeDir(t.UUID), LogDir: m.logDir(t.UUID), Started: m.clock.Now().UTC()}
	m.lock.Unlock()
	m.save(log)
}

// took notes the memory limit a device's daemon took and saves the record
// when it changed.
func (m *mpsManager) took(log logr.Logger, uuid string, memLimitMiB int64) {
	m.lock.Lock()
	r, ok := m.records[uuid]
	changed := ok && r.MemLimitMiB != memLimitMiB
	if changed {
		r.MemLimitMiB = memLimitMiB
		m.records[uuid] = r
	}
	m.lock.Unlock()
	if changed {
		m.save(log)
	}
}

// memLimit is the memory limit a device's daemon last took.
func (m *mpsManager) memLimit(uuid string) (int64, bool) {
	m.lock.Lock()
	defer m.lock.Unlock()
	r, ok := m.records[uuid]
	return r.MemLimitMiB, ok && r.MemLimitMiB > 0
}

// forget drops the record of a daemon that ended.
func (m *mpsManager) forget(log logr.Logger, uuid string) {
	m.lock.Lock()
	_, ok := m.records[uuid]
	delete(m.records, uuid)
	m.lock.Unlock()
	if ok {
		m.save(log)
	}
}

// save writes the records to the state directory. A failed write is
// logged: the daemons are still found through their PID files.
func (m *mpsManager) save(log logr.Logger) {
	if m.cfg.StateDir == "" {
		return
	}
	// One save at a time, each taking the records when it starts: the last
	// write holds the latest records.
	m.saveLock.Lock()
	defer m.saveLock.Unlock()
	m.lock.Lock()
	st := mpsState{Node: m.node, Daemons: make([]mpsRecord, 0, len(m.records))}
	for _, r := range m.records {
		st.Daemons = append(st.Daemons, r)
	}
	m.lock.Unlock()
	slices.SortFunc(st.Daemons, func(a, b mpsRecord) int { return int(a.Index) - int(b.Index) })
	if err := writeStateFile(filepath.Join(m.cfg.StateDir, mpsStateFile), st); err != nil {
		log.Error(err, "Could not record the MPS control daemons")
	}
}

// control sends commands to a device's daemon.
func (m *mpsManager) control(ctx context.Context, uuid string, commands ...string) error {
	_, err := m.controlOutput(ctx, uuid, commands...)
	return err
}

// controlOutput sends commands to a device's daemon and returns its answer.
func (m *mpsManager) controlOutput(ctx context.Context, uuid string, commands ...string) (string, error) {
	cmd := Command{Path: m.cfg.ControlPath, Env: []string{"CUDA_MPS_PIPE_DIRECTORY=" + m.pipeDir(uuid), "CUDA_MPS_LOG_DIRECTORY=" + m.logDir(uuid)}}
	out, err := m.cfg.Runner.Run(ctx, cmd, strings.Join(commands, "\n")+"\n")
	if err != nil {
		return "", fmt.Errorf("send %q to the MPS daemon of %s: %w: %s", commands, uuid, err, strings.TrimSpace(string(out)))
	}
	return strings.TrimSpace(string(out)), nil
}

// start returns a daemon for t: one that already serves its pipe directory
// (started by an agent whose record is lost), else a new one.
func (m *mpsManager) start(ctx context.Context, t mpsTarget) (p DaemonProcess, found bool, err error) {
	pipe := m.pipeDir(t.UUID)
	if p, ok := m.cfg.Runner.Find(pipe, m.cfg.ControlPath); ok {
		return p, true, nil
	}
	if err := m.cfg.Runner.Launch(ctx, m.daemonCommand(t.UUID)); err != nil {
		return DaemonProcess{}, false, err
	}
	deadline := m.clock.Now().Add(mpsStartTimeout)
	for {
		if p, ok := m.cfg.Runner.Find(pipe, m.cfg.ControlPath); ok {
			return p, false, nil
		}
		if m.clock.Now().After(deadline) {
			return DaemonProcess{}, false, fmt.Errorf("start the MPS control daemon of %s: no running daemon wrote %s within %s", t.UUID, filepath.Join(pipe, mpsPIDFile), mpsStartTimeout)
		}
		select {
		case <-ctx.Done():
			return DaemonProcess{}, false, ctx.Err()
		case <-m.clock.After(100 * time.Millisecond):
		}
	}
}

// supervise keeps one device's daemon running until ctx ends: it adopts the
// recorded daemon or starts one, applies its limits after each start and
// each change, and starts it again with backoff when it exits. When ctx
// ends it leaves the daemon running, unless d.quit says to end it.
func (m *mpsManager) supervise(ctx context.Context, d *mpsDaemon, t mpsTarget, adopted *mpsRecord) {
	defer close(d.done)
	log := logr.FromContextOrDiscard(ctx).WithValues("device", t.Index, "uuid", t.UUID)
	backoff := time.Second
	var proc DaemonProcess
	running := adopted != nil
	if running {
		proc = adopted.DaemonProcess
		log.Info("Adopted the MPS control daemon a previous agent started", "pid", proc.PID)
	}
	for {
		started := m.clock.Now()
		if !running {
			p, found, err := m.start(ctx, t)
			switch {
			case ctx.Err() != nil:
				// Stopped while starting: a daemon launched just now must not
				// outlive a device that no longer wants it.
				if d.quit.Load() {
					if p, ok := m.cfg.Runner.Find(m.pipeDir(t.UUID), m.cfg.ControlPath); ok {
						m.stopProcess(context.WithoutCancel(ctx), t.UUID, p, log)
					}
				}
				return
			case err != nil:
				log.Error(err, "Could not start the MPS control daemon", "retryIn", backoff)
			default:
				proc, running = p, true
				m.record(log, t, p)
				if found {
					log.Info("Adopted an MPS control daemon found running for the device", "pid", p.PID)
				} else {
					log.V(2).Info("Started MPS control daemon", "pid", p.PID)
				}
			}
		}
		if running {
			err := m.run(ctx, d, proc, log)
			if ctx.Err() != nil {
				if d.quit.Load() {
					m.forget(log, t.UUID)
					log.V(2).Info("Stopped MPS control daemon", "pid", proc.PID)
				} else {
					log.V(2).Info("Left the MPS control daemon running for the next agent", "pid", proc.PID)
				}
				return
			}
			running = false
			m.forget(log, t.UUID)
			m.metrics.mpsRestarts.WithLabelValues(m.node, deviceLabel(t.Index)).Inc()
			m.lock.Lock()
			m.restarts[t.Index]++
			m.lock.Unlock()
			log.Error(err, "MPS control daemon exited; starting it again", "pid", proc.PID, "retryIn", backoff)
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

// errDaemonExited says the daemon is gone.
var errDaemonExited = errors.New("daemon exited")

// run watches a running daemon until it exits or ctx ends, applying its
// limits whenever they change and holding them: every mpsVerify it reads
// them back and sets them again where they drifted. When ctx ends and
// d.quit is set it ends the daemon.
func (m *mpsManager) run(ctx context.Context, d *mpsDaemon, p DaemonProcess, log logr.Logger) error {
	// A daemon just started may not take commands yet: retry until it does.
	var retry <-chan time.Time
	apply := func() {
		t := m.target(d)
		if err := m.applyLimits(ctx, t); err != nil {
			log.V(2).Info("MPS daemon did not take its limits; retrying", "err", err)
			retry = m.clock.After(mpsRetry)
			return
		}
		retry = nil
		m.took(log, t.UUID, t.MemLimitMiB)
		log.V(2).Info("Set MPS limits", "memLimitMiB", t.MemLimitMiB, "threadPercent", t.ThreadPercent)
	}
	apply()
	poll := m.clock.NewTicker(mpsPoll)
	defer poll.Stop()
	verify := m.clock.NewTicker(mpsVerify)
	defer verify.Stop()
	for {
		select {
		case <-retry:
			apply()
		case <-d.wake:
			apply()
		case <-verify.C():
			if retry == nil {
				t := m.target(d)
				if err := m.holdLimits(ctx, t, log); err != nil {
					log.V(2).Info("Could not check the MPS daemon's limits; retrying", "err", err)
					retry = m.clock.After(mpsRetry)
				} else {
					m.took(log, t.UUID, t.MemLimitMiB)
				}
			}
		case <-poll.C():
			if !m.cfg.Runner.Alive(p) {
				return errDaemonExited
			}
		case <-ctx.Done():
			if d.quit.Load() {
				m.stopProcess(context.WithoutCancel(ctx), m.target(d).UUID, p, log)
			}
			return ctx.Err()
		}
	}
}

// applyLimits sets t's limits as the daemon's defaults, for the next
// server, and on each server running now, for its next clients.
func (m *mpsManager) applyLimits(ctx context.Context, t mpsTarget) error {
	if err := m.control(ctx, t.UUID, defaultLimitCommands(t)...); err != nil {
		return err
	}
	servers, err := m.servers(ctx, t.UUID)
	if err != nil || len(servers) == 0 {
		return err
	}
	return m.control(ctx, t.UUID, serverLimitCommands(t, servers)...)
}

// servers are the PIDs of the daemon's MPS servers (get_server_list).
func (m *mpsManager) servers(ctx context.Context, uuid string) ([]int, error) {
	out, err := m.controlOutput(ctx, uuid, "get_server_list")
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range strings.Fields(out) {
		pid, err := strconv.Atoi(f)
		if err != nil || pid <= 0 {
			return nil, fmt.Errorf("read the MPS servers of %s: %q is not a PID", uuid, f)
		}
		pids = append(pids, pid)
	}
	return pids, nil
}

// holdLimits reads t's limits back from the daemon and its servers and sets
// them again when any differs, or when the answer does not read. A limit
// that differs was changed by a client through the control pipe: it is
// logged, counted (partita_mps_limit_drift_total) and handed to OnDrift.
func (m *mpsManager) holdLimits(ctx context.Context, t mpsTarget, log logr.Logger) error {
	servers, err := m.servers(ctx, t.UUID)
	if err != nil {
		return err
	}
	checks := limitChecks(t, servers)
	gets := make([]string, len(checks))
	for i, c := range checks {
		gets[i] = c.get
	}
	out, err := m.controlOutput(ctx, t.UUID, gets...)
	if err != nil {
		return err
	}
	var lines []string
	for l := range strings.SplitSeq(out, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	var drift []string
	unread := len(lines) != len(checks)
	for i := 0; !unread && i < len(checks); i++ {
		ok, read := checks[i].holds(lines[i])
		switch {
		case !read:
			unread = true
		case !ok:
			drift = append(drift, fmt.Sprintf("%s answered %q", checks[i].get, lines[i]))
		}
	}
	if len(drift) > 0 {
		m.metrics.mpsDrift.WithLabelValues(m.node, deviceLabel(t.Index)).Inc()
		log.Info("MPS limits changed through the control pipe; setting them again", "drift", drift, "memLimitMiB", t.MemLimitMiB, "threadPercent", t.ThreadPercent)
		if m.cfg.OnDrift != nil {
			m.cfg.OnDrift(t.Index, drift)
		}
	}
	if len(drift) == 0 && !unread {
		return nil
	}
	if unread {
		// The driver's answers did not read as expected: set the limits
		// again anyway, as they are the same commands every time.
		log.V(4).Info("MPS limits did not read back; setting them again", "answer", out)
	}
	return m.applyLimits(ctx, t)
}

// stopProcess ends a daemon: quit through its control pipe, which also ends
// its MPS server; SIGTERM if it is still there after mpsStopGrace, SIGKILL
// after as long again. Signals reach it only while its PID still names it.
func (m *mpsManager) stopProcess(ctx context.Context, uuid string, p DaemonProcess, log logr.Logger) {
	gone := func(d time.Duration) bool {
		deadline := m.clock.Now().Add(d)
		for m.cfg.Runner.Alive(p) {
			if m.clock.Now().After(deadline) {
				return false
			}
			select {
			case <-ctx.Done():
				return false
			case <-m.clock.After(100 * time.Millisecond):
			}
		}
		return true
	}
	qctx, cancel := context.WithTimeout(ctx, mpsStopGrace)
	err := m.control(qctx, uuid, "quit")
	cancel()
	if err != nil {
		log.V(2).Info("MPS daemon did not take quit", "err", err)
	}
	if gone(mpsStopGrace) {
		return
	}
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		log.Info("MPS daemon did not quit; signalling it", "pid", p.PID, "signal", sig)
		if err := m.cfg.Runner.Signal(p, sig); err != nil {
			log.V(2).Info("Could not signal the MPS daemon", "err", err)
		}
		if gone(mpsStopGrace) {
			return
		}
	}
	log.Error(errors.New("still running"), "MPS control daemon did not end", "pid", p.PID)
}

// TryMPS starts an MPS control daemon for every device of inv as mps mode
// does, checks that each answers with the default limits the agent set
// within hold and never exited, and stops them. It is the real-GPU check of
// mps mode (`partita agent --once --mode mps`). It refuses to run where a
// daemon already serves a device (an agent runs on the node), as it would
// stop that daemon.
func TryMPS(ctx context.Context, cfg MPSConfig, inv *Inventory, hold time.Duration) error {
	if cfg.Runner == nil {
		cfg.Runner = ExecRunner{}
	}
	cfg.StateDir, cfg.Keeper = "", false
	m := newMPSManager(ctx, inv.Node, cfg, clock.RealClock{}, NewMetrics())
	targets := planMPS(inv.Devices, nil).targets
	if len(targets) == 0 {
		return errors.New("try MPS: no device can be shared")
	}
	for _, t := range targets {
		if p, ok := cfg.Runner.Find(m.pipeDir(t.UUID), cfg.ControlPath); ok {
			return fmt.Errorf("try MPS: a control daemon (PID %d) already serves device %d in %s; run the check on a node where no agent runs mps mode, or with another --mps-dir", p.PID, t.Index, m.pipeDir(t.UUID))
		}
	}
	m.ensure(ctx, targets)
	defer m.stopAll(ctx)
	// Each daemon must answer with the defaults the agent set, within hold.
	deadline := time.Now().Add(hold)
	var errs []error
	for _, t := range targets {
		for {
			out, err := m.controlOutput(ctx, t.UUID, "get_default_active_thread_percentage")
			if err == nil && strings.HasPrefix(out, fmt.Sprint(t.ThreadPercent)) {
				break
			}
			if time.Now().After(deadline) {
				if err == nil {
					err = fmt.Errorf("active thread percentage is %q, want %d", out, t.ThreadPercent)
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

// defaultLimitCommands set t's limits as the daemon's defaults: what the
// next server it starts holds its clients to. The daemon sees only its own
// device, as device 0.
func defaultLimitCommands(t mpsTarget) []string {
	return []string{
		fmt.Sprintf("set_default_active_thread_percentage %d", t.ThreadPercent),
		fmt.Sprintf("set_default_device_pinned_mem_limit 0 %dM", t.MemLimitMiB),
	}
}

// serverLimitCommands set t's limits on running servers, for the clients
// that connect to them from now on (those connected keep theirs).
func serverLimitCommands(t mpsTarget, servers []int) []string {
	var out []string
	for _, pid := range servers {
		out = append(out,
			fmt.Sprintf("set_active_thread_percentage %d %d", pid, t.ThreadPercent),
			fmt.Sprintf("set_device_pinned_mem_limit %d 0 %dM", pid, t.MemLimitMiB))
	}
	return out
}

// limitCheck is one limit read back: the get command and whether its
// answer holds the limit (read is false when the answer does not parse).
type limitCheck struct {
	get   string
	holds func(answer string) (ok, read bool)
}

// limitChecks read back what defaultLimitCommands and serverLimitCommands
// set.
func limitChecks(t mpsTarget, servers []int) []limitCheck {
	threads := func(answer string) (bool, bool) {
		v, err := strconv.ParseFloat(strings.TrimSuffix(answer, "%"), 64)
		if err != nil {
			return false, false
		}
		return math.Abs(v-float64(t.ThreadPercent)) < 1, true
	}
	memory := func(answer string) (bool, bool) { return memLimitHolds(answer, t.MemLimitMiB) }
	out := []limitCheck{
		{get: "get_default_active_thread_percentage", holds: threads},
		{get: "get_default_device_pinned_mem_limit 0", holds: memory},
	}
	for _, pid := range servers {
		out = append(out,
			limitCheck{get: fmt.Sprintf("get_active_thread_percentage %d", pid), holds: threads},
			limitCheck{get: fmt.Sprintf("get_device_pinned_mem_limit %d 0", pid), holds: memory})
	}
	return out
}

// memLimitHolds reports whether a pinned memory limit as the control daemon
// prints it ("40960M", or in whole GiB rounded down, "40G") is wantMiB.
func memLimitHolds(answer string, wantMiB int64) (ok, read bool) {
	a := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSpace(answer), "B"), "iB")
	if a == "" {
		return false, false
	}
	unit := a[len(a)-1]
	n, err := strconv.ParseInt(a[:len(a)-1], 10, 64)
	if err != nil {
		return false, false
	}
	switch unit {
	case 'M', 'm':
		return n == wantMiB, true
	case 'G', 'g':
		return n == wantMiB/1024, true
	}
	return false, false
}
