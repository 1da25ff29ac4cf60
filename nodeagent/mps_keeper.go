package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"
)

// mpsHandover is the content of mps-targets.json: the devices of a node that
// need an MPS control daemon, with their default limits, as the agent
// computed them last.
type mpsHandover struct {
	Node    string      `json:"node"`
	Targets []mpsTarget `json:"targets"`
}

// writeMPSTargets hands targets to the MPS keeper.
func writeMPSTargets(stateDir, node string, targets []mpsTarget) error {
	if stateDir == "" {
		return errors.New("hand MPS daemons to the keeper: no state directory")
	}
	return writeStateFile(filepath.Join(stateDir, mpsTargetsFile), mpsHandover{Node: node, Targets: targets})
}

// readMPSTargets reads what the agent handed to the keeper; ok is false
// while the agent has written nothing.
func readMPSTargets(stateDir string) (f mpsHandover, ok bool, err error) {
	ok, err = readStateFile(filepath.Join(stateDir, mpsTargetsFile), &f)
	return f, ok, err
}

// KeeperOptions configure RunMPSKeeper.
type KeeperOptions struct {
	// Node is the node the keeper runs on.
	Node string
	// MPS configures the daemons; StateDir is where the agent hands over
	// the targets and where the daemons are recorded.
	MPS MPSConfig
	// Interval is how often the targets are read; 1s when zero.
	Interval time.Duration
	// Clock is the clock; the real one when nil.
	Clock clock.WithTicker
	// Metrics receive partita_mps_daemon_restarts_total.
	Metrics *Metrics
}

// MPSKeeper runs the MPS control daemons the agent asks for in
// <state-dir>/mps-targets.json (`partita mps-keeper`). It is a process of
// its own, in a pod of its own that upgrades of the agent do not replace,
// so that the daemons, and the workloads that are their clients, outlive
// the agent's container. It needs no API access: the agent decides, the
// keeper only keeps the daemons running.
type MPSKeeper struct {
	opts  KeeperOptions
	ready chan struct{}
}

// NewMPSKeeper returns a keeper.
func NewMPSKeeper(opts KeeperOptions) (*MPSKeeper, error) {
	if opts.MPS.StateDir == "" {
		return nil, errors.New("configure the MPS keeper: set the state directory the agent writes to")
	}
	if opts.Interval <= 0 {
		opts.Interval = time.Second
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.Metrics == nil {
		opts.Metrics = NewMetrics()
	}
	if opts.MPS.Runner == nil {
		opts.MPS.Runner = ExecRunner{}
	}
	if opts.MPS.ControlPath == "" {
		opts.MPS.ControlPath = "nvidia-cuda-mps-control"
	}
	if opts.MPS.Dir == "" {
		opts.MPS.Dir = "/run/partita/mps"
	}
	return &MPSKeeper{opts: opts, ready: make(chan struct{})}, nil
}

// Ready says whether the keeper has read the agent's targets once.
func (k *MPSKeeper) Ready() error {
	select {
	case <-k.ready:
		return nil
	default:
		return errors.New("the agent has not handed over the MPS daemons yet (" + filepath.Join(k.opts.MPS.StateDir, mpsTargetsFile) + ")")
	}
}

// Run keeps the daemons until ctx ends, then leaves them running, recorded
// for the next keeper.
func (k *MPSKeeper) Run(ctx context.Context) error {
	log := logr.FromContextOrDiscard(ctx)
	m := newMPSManager(ctx, k.opts.Node, k.opts.MPS, k.opts.Clock, k.opts.Metrics)
	defer m.detach()
	tick := k.opts.Clock.NewTicker(k.opts.Interval)
	defer tick.Stop()
	var last []mpsTarget
	lastErr := ""
	for {
		f, ok, err := readMPSTargets(k.opts.MPS.StateDir)
		switch {
		case err != nil:
			// A torn read cannot happen (the agent renames a whole file
			// into place); a bad file is logged once and the daemons kept.
			if err.Error() != lastErr {
				log.Error(err, "Could not read the agent's MPS targets; keeping the daemons as they are")
				lastErr = err.Error()
			}
		case !ok:
			// Nothing handed over yet: keep whatever runs.
		case f.Node != "" && k.opts.Node != "" && f.Node != k.opts.Node:
			if msg := fmt.Sprintf("targets for node %s", f.Node); msg != lastErr {
				log.Error(errors.New(msg), "Ignored MPS targets written for another node", "node", k.opts.Node)
				lastErr = msg
			}
		default:
			lastErr = ""
			if last == nil || !equalTargets(last, f.Targets) {
				log.V(2).Info("Keeping MPS control daemons", "devices", len(f.Targets))
			}
			m.ensure(ctx, f.Targets)
			last = append([]mpsTarget{}, f.Targets...)
			select {
			case <-k.ready:
			default:
				close(k.ready)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C():
		}
	}
}

func equalTargets(a, b []mpsTarget) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
