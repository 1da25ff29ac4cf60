package ctl

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/partita-dev/partita/gpu"
	"github.com/partita-dev/partita/report"
)

// WriteQueues writes r as a table or JSON.
func WriteQueues(w io.Writer, r report.QueuesReport, o Output) error {
	if o == OutputJSON {
		return writeJSON(w, "queues", r)
	}
	if len(r.Queues) == 0 {
		_, err := fmt.Fprintln(w, "No queues.")
		return err
	}
	// Usage shows only where the admission loop weighs it (time-based fair
	// share), so that the table stays as it was without.
	usage := slices.ContainsFunc(r.Queues, func(q report.QueueReport) bool {
		return q.UsageGPUHours != nil || q.FairShareWithoutUsageMilli != nil
	})
	tw := newTable(w)
	if usage {
		tw.row("QUEUE\tPRIORITY\tQUOTA\tLIMIT\tALLOCATED\tFAIR SHARE\tUSAGE (GPU-H)\tREQUESTED\tPENDING\tRUNNING\tADMITTED\tGATED\n")
	} else {
		tw.row("QUEUE\tPRIORITY\tQUOTA\tLIMIT\tALLOCATED\tFAIR SHARE\tREQUESTED\tPENDING\tRUNNING\tADMITTED\tGATED\n")
	}
	unreported := false
	for _, q := range r.Queues {
		quota, limit := "all", "none"
		if q.QuotaMilli != report.Unlimited {
			quota = gpu.FormatMilli(q.QuotaMilli)
		}
		if q.LimitMilli != report.Unlimited {
			limit = gpu.FormatMilli(q.LimitMilli)
		}
		name := strings.Repeat("  ", q.Depth) + q.Name
		if q.Note != "" {
			name += " (" + q.Note + ")"
		}
		opt := func(m *int64) string {
			if m == nil {
				unreported = true
				return "-"
			}
			return gpu.FormatMilli(*m)
		}
		fairShare := opt(q.FairShareMilli)
		if q.HistoryDecided() {
			fairShare += " (" + gpu.FormatMilli(*q.FairShareWithoutUsageMilli) + " without usage)"
		}
		cells := []any{name, q.Priority, quota, limit, opt(q.AllocatedMilli), fairShare}
		if usage {
			hours := "-"
			if q.UsageGPUHours != nil {
				hours = gpu.FormatHours(*q.UsageGPUHours)
			} else {
				unreported = true
			}
			cells = append(cells, hours)
		}
		cells = append(cells, opt(q.RequestedMilli), q.PendingWorkloads, q.Running, q.Admitted, q.Gated)
		tw.row(strings.Repeat("%v\t", len(cells)-1)+"%v\n", cells...)
	}
	if err := tw.flush(); err != nil {
		return fmt.Errorf("write queues: %w", err)
	}
	if usage {
		if _, err := fmt.Fprintln(w, "usage: "+usageWindows(r)); err != nil {
			return fmt.Errorf("write queues: %w", err)
		}
	}
	if err := writeQueueResources(w, r, &unreported); err != nil {
		return err
	}
	if unreported {
		if _, err := fmt.Fprintln(w, "(- : not reported yet by the admission loop in the queue's status)"); err != nil {
			return fmt.Errorf("write queues: %w", err)
		}
	}
	return nil
}

// usageWindows says what the queues' usage covers: "sliding 168h window,
// half-life 24h", or, while queues carry usage counted with different
// settings (the loop's changed and not every queue was written since),
// each with its queues.
func usageWindows(r report.QueuesReport) string {
	var windows []string
	queues := map[string][]string{}
	for _, q := range r.Queues {
		if q.UsageWindow == "" {
			continue
		}
		if queues[q.UsageWindow] == nil {
			windows = append(windows, q.UsageWindow)
		}
		queues[q.UsageWindow] = append(queues[q.UsageWindow], q.Name)
	}
	if len(windows) == 1 {
		return windows[0]
	}
	for i, win := range windows {
		windows[i] = win + " (" + strings.Join(queues[win], ", ") + ")"
	}
	return strings.Join(windows, "; ")
}

// writeQueueResources writes the CPU and memory table, when some queue
// sets a CPU or memory quota or limit: CPU in CPUs, memory as a quantity.
func writeQueueResources(w io.Writer, r report.QueuesReport, unreported *bool) error {
	if !slices.ContainsFunc(r.Queues, func(q report.QueueReport) bool { return q.CPU.Set || q.Memory.Set }) {
		return nil
	}
	cpu := func(m int64) string { return gpu.FormatMilli(m) }
	mem := func(b int64) string { return resource.NewQuantity(b, resource.BinarySI).String() }
	cells := func(rr report.ResourceReport, f func(int64) string) []any {
		quota, limit := "all", "none"
		if rr.Quota != report.Unlimited {
			quota = f(rr.Quota)
		}
		if rr.Limit != report.Unlimited {
			limit = f(rr.Limit)
		}
		opt := func(v *int64) string {
			if v == nil {
				*unreported = true
				return "-"
			}
			return f(*v)
		}
		return []any{quota, limit, opt(rr.Allocated), opt(rr.FairShare), opt(rr.Requested)}
	}
	if _, err := fmt.Fprintln(w); err != nil {
		return fmt.Errorf("write queues: %w", err)
	}
	tw := newTable(w)
	tw.row("QUEUE\tCPU QUOTA\tCPU LIMIT\tCPU ALLOCATED\tCPU FAIR SHARE\tCPU REQUESTED\tMEMORY QUOTA\tMEMORY LIMIT\tMEMORY ALLOCATED\tMEMORY FAIR SHARE\tMEMORY REQUESTED\n")
	for _, q := range r.Queues {
		args := append([]any{strings.Repeat("  ", q.Depth) + q.Name}, cells(q.CPU, cpu)...)
		args = append(args, cells(q.Memory, mem)...)
		tw.row("%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", args...)
	}
	if err := tw.flush(); err != nil {
		return fmt.Errorf("write queues: %w", err)
	}
	return nil
}
