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
	tw := newTable(w)
	tw.row("QUEUE\tPRIORITY\tQUOTA\tLIMIT\tALLOCATED\tFAIR SHARE\tREQUESTED\tPENDING\tRUNNING\tADMITTED\tGATED\n")
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
		tw.row("%s\t%d\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\n", name, q.Priority, quota, limit,
			opt(q.AllocatedMilli), opt(q.FairShareMilli), opt(q.RequestedMilli), q.PendingWorkloads, q.Running, q.Admitted, q.Gated)
	}
	if err := tw.flush(); err != nil {
		return fmt.Errorf("write queues: %w", err)
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
