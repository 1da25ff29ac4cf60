package admission

import (
	"context"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
)

// DefaultAgentHeartbeatTimeout is how long a node's agent may go without a
// new heartbeat on its GPUNode before the node takes no new GPU pods (see
// gpu.DefaultAgentHeartbeatTimeout).
const DefaultAgentHeartbeatTimeout = gpu.DefaultAgentHeartbeatTimeout

// ReasonAgentReporting is the event on a GPUNode whose agent reports again
// after it was silent (the silence itself is recorded as
// gpu.ReasonAgentSilent).
const ReasonAgentReporting = "AgentReporting"

// HeartbeatMonitor watches the agents' heartbeats in the ledger and marks
// the nodes whose agent stopped reporting (gpu.Ledger.SetAgentSilent):
// filter then drops them with the reason, bind refuses them, and the
// admission loop places gangs elsewhere; pods already there are left
// alone. A node is silent once no newer heartbeat has been seen for the
// timeout, measured on this process's clock from when the last new
// heartbeat arrived (so a skewed agent clock cannot trip or hide it); a
// restarted extender therefore waits one timeout before it calls any agent
// silent. A new heartbeat ends the silence at once (the ledger does it).
//
// Every replica runs one, as every replica answers filter; only the leader
// records the AgentSilent and AgentReporting events on the GPUNode.
type HeartbeatMonitor struct {
	ledger   *gpu.Ledger
	timeout  time.Duration
	clock    clock.WithTicker
	nodes    client.Reader
	recorder events.EventRecorder
	isLeader func() bool
	onChange func()

	// seen is, per node, the latest heartbeat and when it was first seen.
	seen map[string]observation
	// silent are the nodes marked silent, with the silence.
	silent map[string]gpu.AgentSilentError
}

type observation struct {
	heartbeat time.Time
	at        time.Time
}

// MonitorOption configures a HeartbeatMonitor.
type MonitorOption func(*HeartbeatMonitor)

// WithMonitorClock sets the monitor's clock.
func WithMonitorClock(c clock.WithTicker) MonitorOption {
	return func(m *HeartbeatMonitor) { m.clock = c }
}

// WithMonitorEvents records events on the GPUNodes, read from nodes, while
// isLeader says so.
func WithMonitorEvents(nodes client.Reader, recorder events.EventRecorder, isLeader func() bool) MonitorOption {
	return func(m *HeartbeatMonitor) { m.nodes, m.recorder, m.isLeader = nodes, recorder, isLeader }
}

// WithMonitorOnChange calls f after a node turned silent or reports again
// (the admission loop's Notify).
func WithMonitorOnChange(f func()) MonitorOption {
	return func(m *HeartbeatMonitor) { m.onChange = f }
}

// NewHeartbeatMonitor returns a monitor of ledger's nodes with the given
// timeout (DefaultAgentHeartbeatTimeout when not positive).
func NewHeartbeatMonitor(ledger *gpu.Ledger, timeout time.Duration, opts ...MonitorOption) *HeartbeatMonitor {
	if timeout <= 0 {
		timeout = DefaultAgentHeartbeatTimeout
	}
	m := &HeartbeatMonitor{
		ledger: ledger, timeout: timeout, clock: clock.RealClock{},
		isLeader: func() bool { return false }, onChange: func() {},
		seen: map[string]observation{}, silent: map[string]gpu.AgentSilentError{},
	}
	for _, o := range opts {
		o(m)
	}
	return m
}

// Interval is how often the monitor looks: a tenth of the timeout, from 1s
// to 10s.
func (m *HeartbeatMonitor) Interval() time.Duration {
	return min(max(m.timeout/10, time.Second), 10*time.Second)
}

// NeedLeaderElection is false: every replica filters, so every replica
// must know which agents are silent.
func (m *HeartbeatMonitor) NeedLeaderElection() bool { return false }

// Start checks the heartbeats every Interval until ctx ends.
func (m *HeartbeatMonitor) Start(ctx context.Context) error {
	tick := m.clock.NewTicker(m.Interval())
	defer tick.Stop()
	for {
		m.Check(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C():
		}
	}
}

// Check looks at every node's heartbeat once, marks the nodes whose agent
// went silent and notes those that report again.
func (m *HeartbeatMonitor) Check(ctx context.Context) {
	log := logr.FromContextOrDiscard(ctx)
	now := m.clock.Now()
	beats := m.ledger.Heartbeats()
	changed := false
	for name := range m.seen {
		if _, ok := beats[name]; !ok {
			delete(m.seen, name)
		}
	}
	for name, hb := range beats {
		o, ok := m.seen[name]
		if !ok || !hb.Equal(o.heartbeat) {
			o = observation{heartbeat: hb, at: now}
			m.seen[name] = o
		}
		quiet := now.Sub(o.at)
		if quiet <= m.timeout {
			continue
		}
		e := gpu.AgentSilentError{Node: name, LastHeartbeat: hb, For: quiet}
		m.ledger.SetAgentSilent(name, &e)
		if _, was := m.silent[name]; !was {
			log.Info("Agent stopped reporting; its node takes no new GPU pods", "node", name, "lastHeartbeat", hb, "for", quiet.Round(time.Second))
			m.event(ctx, name, corev1.EventTypeWarning, gpu.ReasonAgentSilent, e.Error())
			changed = true
		}
		m.silent[name] = e
	}
	// The ledger ends a silence as soon as a newer heartbeat arrives.
	still := map[string]bool{}
	for _, s := range m.ledger.SilentAgents() {
		still[s.Node] = true
	}
	for name, e := range m.silent {
		if still[name] {
			continue
		}
		delete(m.silent, name)
		if _, ok := beats[name]; !ok {
			continue // the node is gone
		}
		log.Info("Agent reports again; its node takes GPU pods", "node", name, "silentFor", now.Sub(e.LastHeartbeat).Round(time.Second))
		m.event(ctx, name, corev1.EventTypeNormal, ReasonAgentReporting, "the agent on node "+name+" reports again: the node takes new GPU pods")
		changed = true
	}
	if changed {
		m.onChange()
	}
}

// Silent returns the nodes marked silent now, by name.
func (m *HeartbeatMonitor) Silent() []gpu.AgentSilentError { return m.ledger.SilentAgents() }

func (m *HeartbeatMonitor) event(ctx context.Context, node, eventType, reason, note string) {
	if m.recorder == nil || !m.isLeader() {
		return
	}
	gn := &v1alpha1.GPUNode{ObjectMeta: metav1.ObjectMeta{Name: node}}
	if m.nodes != nil {
		if err := m.nodes.Get(ctx, client.ObjectKey{Name: node}, gn); err != nil {
			logr.FromContextOrDiscard(ctx).V(2).Info("Could not read the GPUNode for an event", "node", node, "err", err)
			return
		}
	}
	m.recorder.Eventf(gn, nil, eventType, reason, "Watch", "%s", note)
}
