package ctl

import (
	"fmt"
	"io"

	"github.com/partita-dev/partita/report"
)

// WriteWhy writes r as text or JSON.
func WriteWhy(w io.Writer, r report.WhyReport, o Output) error {
	if o == OutputJSON {
		return writeJSON(w, "why", r)
	}
	tw := newTable(w)
	tw.row("%s\n\n", r.Summary)
	tw.row("STATUS\tCHECK\tFINDING\n")
	for _, f := range r.Findings {
		tw.row("%s\t%s\t%s\n", f.Status, f.Check, f.Message)
	}
	if err := tw.flush(); err != nil {
		return fmt.Errorf("write why: %w", err)
	}
	return nil
}
