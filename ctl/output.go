package ctl

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// Output is an output format.
type Output string

// Output formats.
const (
	// OutputTable is the human-readable table (the default).
	OutputTable Output = "table"
	// OutputJSON is indented JSON.
	OutputJSON Output = "json"
)

// ParseOutput reads -o's value.
func ParseOutput(s string) (Output, error) {
	switch Output(s) {
	case "", OutputTable:
		return OutputTable, nil
	case OutputJSON:
		return OutputJSON, nil
	}
	return "", fmt.Errorf("unknown output format %q: want table or json", s)
}

func writeJSON(w io.Writer, what string, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("write %s as JSON: %w", what, err)
	}
	return nil
}

// table is a tabwriter whose output loses the padding at the end of lines,
// which an empty last column would otherwise leave.
type table struct {
	tw  *tabwriter.Writer
	buf bytes.Buffer
	out io.Writer
}

func newTable(w io.Writer) *table {
	t := &table{out: w}
	t.tw = tabwriter.NewWriter(&t.buf, 0, 8, 2, ' ', 0)
	return t
}

func (t *table) row(format string, args ...any) { fmt.Fprintf(t.tw, format, args...) }

func (t *table) flush() error {
	if err := t.tw.Flush(); err != nil {
		return err
	}
	lines := strings.SplitAfter(t.buf.String(), "\n")
	for i, l := range lines {
		if strings.HasSuffix(l, "\n") {
			lines[i] = strings.TrimRight(l[:len(l)-1], " ") + "\n"
		}
	}
	_, err := io.WriteString(t.out, strings.Join(lines, ""))
	return err
}

// shortModel drops the vendor prefix from a product name, which every
// device of a Partita cluster shares: NVIDIA-H100-80GB-HBM3 → H100-80GB-HBM3.
func shortModel(product string) string {
	for _, p := range []string{"NVIDIA-", "NVIDIA ", "Tesla-", "Tesla "} {
		if s, ok := strings.CutPrefix(product, p); ok && s != "" {
			return s
		}
	}
	if product == "" {
		return "-"
	}
	return product
}

func plural(n int, one, many string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, one)
	}
	return fmt.Sprintf("%d %s", n, many)
}
