package ctl

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
	"github.com/partita-dev/partita/report"
)

// WriteNodes writes r as a table or JSON.
func WriteNodes(w io.Writer, r report.NodesReport, o Output) error {
	if o == OutputJSON {
		return writeJSON(w, "nodes", r)
	}
	if len(r.Nodes) == 0 {
		_, err := fmt.Fprintln(w, "No GPUNodes: no node runs Partita's agent yet.")
		return err
	}
	tw := newTable(w)
	tw.row("NODE\tDEVICE\tMODEL\tHEALTH\tUSED\tFREE\tSLICES\n")
	for _, n := range r.Nodes {
		for _, row := range deviceRows(n.Devices) {
			tw.row("%s\t%s\t%s\t%s\t%s\t%s\t%s\n", n.Name, row.devices, shortModel(row.d.Model), row.d.Health,
				gpu.FormatMilli(row.d.UsedMilli), row.free, formatSlices(row.d.Slices))
		}
	}
	tw.row("\n")
	if r.Topology != nil {
		writeTopology(tw, r)
	} else {
		// ENFORCED only once some agent reports it (older agents do not).
		enforced := slices.ContainsFunc(r.Nodes, func(n report.NodeReport) bool { return n.Enforcement != nil })
		if enforced {
			tw.row("NODE\tGPUS\tHEALTHY\tUSED\tFREE\tLARGEST FREE\tPODS\tISOLATION\tENFORCED\n")
		} else {
			tw.row("NODE\tGPUS\tHEALTHY\tUSED\tFREE\tLARGEST FREE\tPODS\tISOLATION\n")
		}
		for _, n := range r.Nodes {
			if enforced {
				tw.row("%s\t%s\t%s\n", n.Name, nodeCells(n), enforcedCell(n.Enforcement))
			} else {
				tw.row("%s\t%s\n", n.Name, nodeCells(n))
			}
		}
	}
	t := r.Total
	tw.row("TOTAL (%s)\t", plural(len(r.Nodes), "node", "nodes"))
	if r.Topology != nil {
		tw.row("%d\t", len(r.Nodes))
	}
	tw.row("%s\t\n", totalsCells(t))
	if err := tw.flush(); err != nil {
		return fmt.Errorf("write nodes: %w", err)
	}
	if r.Topology != nil && r.Topology.Note != "" {
		if _, err := fmt.Fprintln(w, "note: "+r.Topology.Note); err != nil {
			return fmt.Errorf("write nodes: %w", err)
		}
	}
	for _, n := range r.Nodes {
		if note := draNote(n); note != "" {
			if _, err := fmt.Fprintln(w, note); err != nil {
				return fmt.Errorf("write nodes: %w", err)
			}
		}
	}
	for _, s := range r.Stranded {
		msg := fmt.Sprintf("stranded: %s on %s: %s", s.Pod, s.Node, s.Reason)
		if s.Detail != "" {
			msg += " (" + s.Detail + ")"
		}
		if _, err := fmt.Fprintln(w, msg); err != nil {
			return fmt.Errorf("write nodes: %w", err)
		}
	}
	return nil
}

// totalsCells are the GPUS to PODS cells of a node, domain or total line.
func totalsCells(t report.NodeTotals) string {
	return fmt.Sprintf("%d\t%d\t%s\t%s\t%s\t%d", t.GPUs, t.Healthy, gpu.FormatMilli(t.UsedMilli),
		gpu.FormatMilli(t.FreeMilli), gpu.FormatMilli(t.LargestFreeMilli), t.Pods)
}

// nodeCells are a node line's cells after its name.
func nodeCells(n report.NodeReport) string {
	return totalsCells(n.NodeTotals) + "\t" + string(n.Isolation)
}

// enforcedCell is how the node applies slices: the container path and what
// caps a slice's memory ("nri/kernel"), "-" before its agent says.
func enforcedCell(e *v1alpha1.Enforcement) string {
	if e == nil || e.ContainerPath == "" {
		return "-"
	}
	if e.MemoryCap == "" {
		return string(e.ContainerPath)
	}
	return string(e.ContainerPath) + "/" + string(e.MemoryCap)
}

// writeTopology writes the node lines as a tree of r.Topology's domains,
// each line with the sums of its nodes, indented a step per level, the
// node lines under the narrowest level's domains.
func writeTopology(tw *table, r report.NodesReport) {
	byName := make(map[string]report.NodeReport, len(r.Nodes))
	for _, n := range r.Nodes {
		byName[n.Name] = n
	}
	tw.row("TOPOLOGY %s\tNODES\tGPUS\tHEALTHY\tUSED\tFREE\tLARGEST FREE\tPODS\tISOLATION\n", r.Topology.Name)
	var walk func(ds []report.TopologyDomain, depth int)
	walk = func(ds []report.TopologyDomain, depth int) {
		indent := strings.Repeat("  ", depth)
		for _, d := range ds {
			tw.row("%s%s\t%d\t%s\t\n", indent, report.DomainName(d.Level, d.Value, d.Missing), d.NodeCount, totalsCells(d.NodeTotals))
			walk(d.Domains, depth+1)
			for _, name := range d.Nodes {
				tw.row("%s  %s\t\t%s\n", indent, name, nodeCells(byName[name]))
			}
		}
	}
	walk(r.Topology.Domains, 0)
}

// draNote says which of n's GPUs other DRA drivers manage: "n1: GPUs 0, 1
// managed by DRA driver gpu.nvidia.com; Partita offers no gpu-milli on
// them (claims of that driver's DeviceClass hold them)".
func draNote(n report.NodeReport) string {
	var parts []string
	for _, drv := range n.DRADrivers {
		var idx []string
		for _, d := range n.Devices {
			if d.DRADriver == drv {
				idx = append(idx, fmt.Sprint(d.Index))
			}
		}
		what := "GPUs " + strings.Join(idx, ", ")
		if len(idx) == 1 {
			what = "GPU " + idx[0]
		}
		parts = append(parts, fmt.Sprintf("%s managed by DRA driver %s", what, drv))
	}
	if len(parts) == 0 {
		return ""
	}
	return fmt.Sprintf("%s: %s; Partita offers no gpu-milli on them (claims of the driver's DeviceClass hold them)", n.Name, strings.Join(parts, "; "))
}

type deviceRow struct {
	devices string
	free    string
	d       report.DeviceReport
}

// deviceRows collapses runs of idle healthy devices of one model into one
// row ("1-7", free "1 / 79.6Gi each"): on a cluster of 8-GPU nodes most rows
// would otherwise say the same thing, and the JSON keeps every device.
func deviceRows(devs []report.DeviceReport) []deviceRow {
	idle := func(d report.DeviceReport) bool {
		return len(d.Slices) == 0 && d.Health == "Healthy" && d.UsedMilli == 0
	}
	var rows []deviceRow
	for i := 0; i < len(devs); {
		d := devs[i]
		j := i + 1
		if idle(d) {
			for j < len(devs) && idle(devs[j]) && devs[j].Model == d.Model && devs[j].MemoryMiB == d.MemoryMiB &&
				devs[j].Index == devs[j-1].Index+1 {
				j++
			}
		}
		row := deviceRow{devices: fmt.Sprint(d.Index), d: d, free: "-"}
		if d.Health == "Healthy" {
			row.free = gpu.FormatMilli(d.FreeMilli) + " / " + report.FormatMiB(d.FreeMemoryMiB)
		}
		if j-i > 1 {
			row.devices = fmt.Sprintf("%d-%d", d.Index, devs[j-1].Index)
			row.free += " each"
		}
		rows = append(rows, row)
		i = j
	}
	return rows
}

// formatSlices writes a device's slices as "ns/pod 0.25, ns/pod2 20Gi":
// each slice in the words its pod asked in.
func formatSlices(ss []report.SliceReport) string {
	parts := make([]string, 0, len(ss))
	for _, s := range ss {
		name := s.Namespace + "/" + s.Pod
		if s.MultiContainer {
			name += ":" + s.Container
		}
		amount := gpu.FormatMilli(s.Milli)
		switch {
		case s.Whole:
			amount = "whole"
		case s.ByMemory:
			amount = report.FormatMiB(s.MemoryMiB)
		}
		parts = append(parts, name+" "+amount)
	}
	return strings.Join(parts, ", ")
}
