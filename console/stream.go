package console

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"
)

type eventsRequest struct {
	Since  uint64 `query:"since" json:"-" description:"the snapshot version the caller last read (MapView.version)"`
	Topics string `query:"topics" json:"-" description:"comma-separated: nodes, queues, workloads (default: all)"`
}

// NodesEvent is the data of a nodes event.
type NodesEvent struct {
	Version uint64 `json:"version"`
	// ChangedAt is when the first change this snapshot shows reached the
	// console, in Unix milliseconds; SentAt when this event was written.
	ChangedAt int64 `json:"changedAt"`
	SentAt    int64 `json:"sentAt"`
	// Full: Nodes are every node, and the page replaces its map.
	Full    bool      `json:"full"`
	Nodes   []MapNode `json:"nodes"`
	Removed []string  `json:"removed"`
}

// VersionEvent is the data of the queues, workloads and hello events.
type VersionEvent struct {
	Version uint64 `json:"version"`
}

// keepAlive is how often an idle stream writes a comment, so proxies keep
// it open and a closed page is noticed.
const keepAlive = 15 * time.Second

// handleEvents streams changes to one page: after each snapshot, the nodes
// that changed since the last one it wrote (filtered for the caller) and
// whether the queues and workloads changed.
func handleEvents(c *call) (any, error) {
	var in eventsRequest
	if err := bind(c.r, &in); err != nil {
		return nil, err
	}
	topics := map[string]bool{"nodes": true, "queues": true, "workloads": true}
	if in.Topics != "" {
		topics = map[string]bool{}
		for t := range strings.SplitSeq(in.Topics, ",") {
			switch t = strings.TrimSpace(t); t {
			case "nodes", "queues", "workloads":
				topics[t] = true
			default:
				return nil, badRequest("topics: %q is not one of nodes, queues, workloads", t)
			}
		}
	}
	v, err := c.viewer()
	if err != nil {
		return nil, err
	}
	if topics["nodes"] && !v.GPUNodes {
		return nil, forbidden("%s may not list gpunodes.partita.dev", c.user.Name)
	}
	w, r := c.w, c.r
	rc := http.NewResponseController(w)
	// The stream lasts as long as the page: no server-wide deadline.
	_ = rc.SetWriteDeadline(time.Time{})
	_ = rc.SetReadDeadline(time.Time{})
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)

	updates, stop := c.s.hub.Subscribe()
	defer stop()
	// Changes that came while no page was open wait in the Source: the
	// builder has a page to build for now.
	c.s.deps.Source.Wake()
	c.s.metrics.stream(1)
	defer c.s.metrics.stream(-1)
	send := func(event string, data any) error {
		b, err := json.Marshal(data)
		if err != nil {
			return err
		}
		_ = rc.SetWriteDeadline(time.Now().Add(30 * time.Second))
		if _, err := fmt.Fprintf(w, "event: %s\ndata: %s\n\n", event, b); err != nil {
			return err
		}
		return rc.Flush()
	}
	last := c.snap
	if err := send("hello", VersionEvent{Version: last.Version}); err != nil {
		return nil, nil
	}
	lastViewer := v
	if topics["nodes"] && in.Since != last.Version {
		if err := send("nodes", c.nodesEvent(nil, last, v)); err != nil {
			return nil, nil
		}
	}
	tick := time.NewTicker(keepAlive)
	defer tick.Stop()
	for {
		select {
		case <-r.Context().Done():
			return nil, nil
		case <-tick.C:
			_ = rc.SetWriteDeadline(time.Now().Add(30 * time.Second))
			if _, err := fmt.Fprint(w, ": keep-alive\n\n"); err != nil {
				return nil, nil
			}
			if rc.Flush() != nil {
				return nil, nil
			}
			continue
		case <-updates:
		}
		next := c.s.Snapshot()
		if next == nil || next.Version == last.Version {
			continue
		}
		nc := &call{s: c.s, r: r, w: w, user: c.user, snap: next}
		nv, err := nc.viewer()
		if err != nil {
			c.s.opts.Log.Error(err, "Work out what a page's viewer may see", "user", c.user.Name)
			continue
		}
		// A change of permissions changes what every node shows.
		prev := last
		if !sameView(lastViewer, nv) {
			prev = nil
		}
		if topics["nodes"] {
			// The map's choice of Topologies, and their levels, came with
			// the page: it reads them again when they change.
			topologies := lastViewer.Topologies != nv.Topologies || nv.Topologies && last.topologyHash != next.topologyHash
			if !nv.GPUNodes || topologies {
				_ = send("resync", VersionEvent{Version: next.Version})
				return nil, nil
			}
			if ev := nc.nodesEvent(prev, next, nv); ev.Full || len(ev.Nodes) > 0 || len(ev.Removed) > 0 {
				if send("nodes", ev) != nil {
					return nil, nil
				}
			}
		}
		if topics["queues"] && (prev == nil || prev.queueHash != next.queueHash) {
			if send("queues", VersionEvent{Version: next.Version}) != nil {
				return nil, nil
			}
		}
		if topics["workloads"] && (prev == nil || prev.workloadHash != next.workloadHash) {
			if send("workloads", VersionEvent{Version: next.Version}) != nil {
				return nil, nil
			}
		}
		last, lastViewer = next, nv
	}
}

// nodesEvent is what changed between prev and next for v; every node when
// prev is nil.
func (c *call) nodesEvent(prev, next *Snapshot, v Viewer) NodesEvent {
	ev := NodesEvent{Version: next.Version, ChangedAt: next.ChangedAt.UnixMilli(), Full: prev == nil, Nodes: []MapNode{}, Removed: []string{}}
	for i := range next.nodes {
		n := &next.nodes[i]
		if prev != nil && prev.nodeHashes[n.Name] == next.nodeHashes[n.Name] {
			if _, ok := prev.nodeHashes[n.Name]; ok {
				continue
			}
		}
		ev.Nodes = append(ev.Nodes, filterNode(n, v))
	}
	if prev != nil {
		for name := range prev.nodeHashes {
			if _, ok := next.nodeHashes[name]; !ok {
				ev.Removed = append(ev.Removed, name)
			}
		}
		slices.Sort(ev.Removed)
	}
	ev.SentAt = time.Now().UnixMilli()
	return ev
}

// sameView reports whether two viewers see the same namespaces.
func sameView(a, b Viewer) bool {
	if a.Pods.All != b.Pods.All || a.GPUNodes != b.GPUNodes || a.Queues != b.Queues || a.Topologies != b.Topologies ||
		len(a.Pods.Names) != len(b.Pods.Names) {
		return false
	}
	for ns := range a.Pods.Names {
		if !b.Pods.Names[ns] {
			return false
		}
	}
	return true
}
