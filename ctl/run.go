package ctl

import (
	"context"
	"io"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/report"
)

// RunNodes reads the cluster and writes `nodes`.
func RunNodes(ctx context.Context, r client.Reader, w io.Writer, o Output) error {
	return RunNodesByTopology(ctx, r, w, o, "")
}

// RunNodesByTopology is RunNodes with the nodes grouped by the levels of
// the Topology called topology; "" groups nothing (`nodes --topology`).
func RunNodesByTopology(ctx context.Context, r client.Reader, w io.Writer, o Output, topology string) error {
	c, err := report.Load(ctx, r, report.What{GPUNodes: true, Topologies: topology != ""})
	if err != nil {
		return err
	}
	if topology == "" {
		return WriteNodes(w, report.Nodes(c), o)
	}
	rep, err := report.NodesByTopology(c, topology)
	if err != nil {
		return err
	}
	return WriteNodes(w, rep, o)
}

// RunQueues reads the cluster and writes `queues`.
func RunQueues(ctx context.Context, r client.Reader, w io.Writer, o Output) error {
	c, err := report.Load(ctx, r, report.What{Queues: true})
	if err != nil {
		return err
	}
	return WriteQueues(w, report.Queues(c), o)
}

// RunWhy reads the cluster and writes `why` for the pod namespace/name.
func RunWhy(ctx context.Context, r client.Reader, w io.Writer, namespace, name string, o Output, now time.Time) error {
	return RunWhyWithOptions(ctx, r, w, namespace, name, o, now, report.WhyOptions{})
}

// RunWhyWithOptions is RunWhy with options.
func RunWhyWithOptions(ctx context.Context, r client.Reader, w io.Writer, namespace, name string, o Output, now time.Time, opts report.WhyOptions) error {
	c, err := report.Load(ctx, r, report.What{GPUNodes: true, Queues: true, PodGroupsAndEvents: true, Namespace: namespace})
	if err != nil {
		return err
	}
	rep, err := report.WhyWithOptions(c, namespace, name, now, opts)
	if err != nil {
		return err
	}
	return WriteWhy(w, rep, o)
}
