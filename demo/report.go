package demo

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/partita-dev/partita/gpu"
	"github.com/partita-dev/partita/report"
)

// usage is what some slices of the device map add up to.
type usage struct {
	// pods counts the pods holding the slices.
	pods int
	// milli is the sum of the slices.
	milli int64
	// devices counts the devices holding at least one of the slices.
	devices int
	// whole is what whole-GPU allocation would give the same pods: a device
	// for each pod on each of its devices, however small its slice.
	whole int
	// devs are the devices holding the slices, in the map's order.
	devs []deviceUse
}

// deviceUse is one device and the slices of interest on it.
type deviceUse struct {
	node      string
	index     int32
	usedMilli int64
	// slices are "pod fraction" (or "pod whole").
	slices []string
}

// usageOf adds up the slices of r that keep selects.
func usageOf(r report.NodesReport, keep func(report.SliceReport) bool) usage {
	var u usage
	pods := map[string]bool{}
	for _, n := range r.Nodes {
		for _, d := range n.Devices {
			du := deviceUse{node: n.Name, index: d.Index, usedMilli: d.UsedMilli}
			for _, sl := range d.Slices {
				if !keep(sl) {
					continue
				}
				pods[sl.Namespace+"/"+sl.Pod] = true
				u.milli += sl.Milli
				u.whole++
				amount := gpu.FormatMilli(sl.Milli)
				if sl.Whole {
					amount = "whole"
				}
				du.slices = append(du.slices, sl.Pod+" "+amount)
			}
			if len(du.slices) > 0 {
				u.devices++
				u.devs = append(u.devs, du)
			}
		}
	}
	u.pods = len(pods)
	return u
}

// isNotebook selects the notebooks' slices: team A's fractions.
func isNotebook(sl report.SliceReport) bool { return sl.Namespace == TeamA && !sl.Whole }

// isDemo selects the slices of the demo's pods.
func isDemo(sl report.SliceReport) bool { return sl.Namespace == TeamA || sl.Namespace == TeamB }

// idleDevices counts the healthy devices that hold nothing.
func idleDevices(r report.NodesReport) int {
	n := 0
	for _, node := range r.Nodes {
		for _, d := range node.Devices {
			if d.Health == "Healthy" && len(d.Slices) == 0 {
				n++
			}
		}
	}
	return n
}

// writeDeviceMap writes one row per node and one column per GPU, each cell
// naming the pods on that device: the whole cluster on one screen, where
// `kubectl partita nodes` gives a row to each busy device.
func writeDeviceMap(w io.Writer, r report.NodesReport) error {
	most := 0
	for _, n := range r.Nodes {
		most = max(most, len(n.Devices))
	}
	tw := newTable(w)
	tw.row("  NODE \\ GPU")
	for i := range most {
		tw.row("\t%d", i)
	}
	tw.row("\n")
	for _, n := range r.Nodes {
		tw.row("  %s", n.Name)
		for _, d := range n.Devices {
			cell := "-"
			if len(d.Slices) > 0 {
				pods := make([]string, 0, len(d.Slices))
				for _, sl := range d.Slices {
					pods = append(pods, sl.Pod)
				}
				cell = strings.Join(pods, "+")
			}
			if d.Health != "Healthy" {
				cell += " (" + d.Health + ")"
			}
			tw.row("\t%s", cell)
		}
		tw.row("\n")
	}
	if err := tw.flush(); err != nil {
		return err
	}
	t := r.Total
	_, err := fmt.Fprintf(w, "  %s GPUs on %d nodes: %s allocated, %s free (%d pods)\n", strconv.Itoa(t.GPUs), len(r.Nodes),
		gpu.FormatMilli(t.UsedMilli), gpu.FormatMilli(t.FreeMilli), t.Pods)
	return err
}

// demoQueues keeps the demo's queues of r.
func demoQueues(r report.QueuesReport) []report.QueueReport {
	var out []report.QueueReport
	for _, q := range r.Queues {
		switch q.Name {
		case ParentQueue, TeamA, TeamB:
			out = append(out, q)
		}
	}
	return out
}

// table is a tabwriter for the demo's own tables.
type table struct{ tw *tabwriter.Writer }

func newTable(w io.Writer) *table { return &table{tw: tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)} }

func (t *table) row(format string, args ...any) { _, _ = fmt.Fprintf(t.tw, format, args...) }

func (t *table) flush() error {
	if err := t.tw.Flush(); err != nil {
		return fmt.Errorf("write table: %w", err)
	}
	return nil
}

// indentWriter starts every line with two spaces, to set a ctl table
// inside the story.
type indentWriter struct {
	w       io.Writer
	midLine bool
}

func indent(w io.Writer) io.Writer { return &indentWriter{w: w} }

func (iw *indentWriter) Write(p []byte) (int, error) {
	var b strings.Builder
	for _, c := range string(p) {
		if !iw.midLine && c != '\n' {
			b.WriteString("  ")
		}
		b.WriteRune(c)
		iw.midLine = c != '\n'
	}
	if _, err := io.WriteString(iw.w, b.String()); err != nil {
		return 0, err
	}
	return len(p), nil
}

// amount is a quota or limit in GPUs, or unlimited's word.
func amount(milli int64, unlimited string) string {
	if milli == report.Unlimited {
		return unlimited
	}
	return gpu.FormatMilli(milli)
}

// gib writes MiB of GPU memory as GiB with one decimal.
func gib(mib int64) string { return strconv.FormatFloat(float64(mib)/1024, 'f', 1, 64) + "Gi" }

// plural writes "1 GPU", "2 GPUs".
func plural(n int, what string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, what)
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// times writes a/b as "3×" or "1.5×".
func times(a, b int) string {
	if b == 0 {
		return "∞×"
	}
	if a%b == 0 {
		return strconv.Itoa(a/b) + "×"
	}
	return strconv.FormatFloat(float64(a)/float64(b), 'f', 1, 64) + "×"
}
