package fairshare

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"

	"k8s.io/apimachinery/pkg/api/resource"
)

// jsonDivision is the JSON form of a Division.
type jsonDivision struct {
	Queues []jsonQueue `json:"queues"`
}

type jsonQueue struct {
	Name        string               `json:"name"`
	FairShare   map[Resource]float64 `json:"fairShare"`
	Allocatable map[Resource]float64 `json:"allocatable"`
	// Usage is the usage weighed, when the division weighed any.
	Usage map[Resource]float64 `json:"usage,omitempty"`
}

// WriteJSON writes d as {"queues": [{"name", "fairShare", "allocatable"}]}, in
// input order. Amounts are numbers in GPUs, CPU cores and memory bytes,
// rounded to 3 decimals so that a share of 4.5 never prints as 4.499999.
func WriteJSON(w io.Writer, d Division) error {
	out := jsonDivision{Queues: make([]jsonQueue, len(d.Queues))}
	for i, q := range d.Queues {
		out.Queues[i] = jsonQueue{Name: q.Name, FairShare: rounded(q.FairShare), Allocatable: rounded(q.Allocatable)}
		if q.EffectiveUsage != nil {
			out.Queues[i].Usage = rounded(q.EffectiveUsage)
		}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		return fmt.Errorf("write fair shares as JSON: %w", err)
	}
	return nil
}

func rounded(m map[Resource]float64) map[Resource]float64 {
	out := make(map[Resource]float64, len(m))
	for r, v := range m {
		out[r] = round3(v)
	}
	return out
}

// round3 rounds through the decimal text, which, unlike math.Round(v*1000)/1000,
// neither overflows for petabytes nor lands next to the decimal.
func round3(v float64) float64 {
	f, _ := strconv.ParseFloat(strconv.FormatFloat(v, 'f', 3, 64), 64)
	return f
}

// WriteTable writes one aligned table per resource, queues in tree order
// (each parent above its children, indented by depth; siblings in input order):
//
//	gpu: capacity 16
//	QUEUE     PRIORITY  QUOTA  LIMIT  WEIGHT  DEMAND  FAIR SHARE  ALLOCATABLE
//	org       100       8      none   1       10      10          16
//	  team-a  100       4      none   2       10      10          16
//
// A quota of -1 prints as "all" and a limit of -1 as "none". Memory prints as
// a Kubernetes quantity (64Gi), GPUs and CPU cores as decimals. A division
// that weighed usage adds a USAGE column (a share of the capacity over the
// window) and says its weight on the capacity line.
func WriteTable(w io.Writer, d Division) error {
	order := treeOrder(d.Queues)
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	for i, r := range d.Resources() {
		if i > 0 {
			fmt.Fprintln(tw)
		}
		withUsage := d.UsageWeight > 0
		if withUsage {
			fmt.Fprintf(tw, "%s: capacity %s, usage weight %s\n", r, formatAmount(r, d.Capacity[r]), strconv.FormatFloat(d.UsageWeight, 'f', -1, 64))
			fmt.Fprintln(tw, "QUEUE\tPRIORITY\tQUOTA\tLIMIT\tWEIGHT\tUSAGE\tDEMAND\tFAIR SHARE\tALLOCATABLE")
		} else {
			fmt.Fprintf(tw, "%s: capacity %s\n", r, formatAmount(r, d.Capacity[r]))
			fmt.Fprintln(tw, "QUEUE\tPRIORITY\tQUOTA\tLIMIT\tWEIGHT\tDEMAND\tFAIR SHARE\tALLOCATABLE")
		}
		for _, q := range order {
			s := q.settings(r)
			quota, limit := "all", "none"
			if s.Quota != Unlimited {
				quota = formatAmount(r, s.Quota)
			}
			if s.Limit != Unlimited {
				limit = formatAmount(r, s.Limit)
			}
			usage := ""
			if withUsage {
				usage = strconv.FormatFloat(round3(q.EffectiveUsage[r]), 'f', -1, 64) + "\t"
			}
			fmt.Fprintf(tw, "%s%s\t%d\t%s\t%s\t%s\t%s%s\t%s\t%s\n",
				strings.Repeat("  ", q.Depth), q.Name, q.Priority, quota, limit,
				strconv.FormatFloat(s.OverQuotaWeight, 'f', -1, 64), usage,
				formatAmount(r, q.Request[r]), formatAmount(r, q.FairShare[r]), formatAmount(r, q.Allocatable[r]))
		}
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write fair-share table: %w", err)
	}
	return nil
}

// treeOrder lists queues depth first, siblings in input order.
func treeOrder(queues []QueueShare) []QueueShare {
	children := map[string][]QueueShare{}
	for _, q := range queues {
		children[q.Parent] = append(children[q.Parent], q)
	}
	out := make([]QueueShare, 0, len(queues))
	var walk func(parent string)
	walk = func(parent string) {
		for _, q := range children[parent] {
			out = append(out, q)
			walk(q.Name)
		}
	}
	walk("")
	return out
}

// formatAmount prints memory as the shorter of its binary and decimal
// quantity (64Gi, 500M) when it is whole bytes, anything else as a decimal.
func formatAmount(r Resource, v float64) string {
	v = round3(v)
	if r == Memory && v == math.Trunc(v) && math.Abs(v) < 1<<62 {
		bin := resource.NewQuantity(int64(v), resource.BinarySI).String()
		dec := resource.NewQuantity(int64(v), resource.DecimalSI).String()
		if len(dec) < len(bin) {
			return dec
		}
		return bin
	}
	return strconv.FormatFloat(v, 'f', -1, 64)
}
