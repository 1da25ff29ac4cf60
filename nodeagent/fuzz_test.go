package nodeagent

import (
	"strings"
	"testing"
)

// FuzzParseProcStat: /proc/<pid>/stat as any bytes never panics the parser,
// and what it accepts has a one-letter state taken after the last ')'.
func FuzzParseProcStat(f *testing.F) {
	f.Add("42 (sleep) S 1 1 1 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 5125 1000 100 18446744073709551615")
	f.Add("42 (a) b (c) R 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 77 0 0 0")
	f.Add("7 ()) Z 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 9")
	f.Add("")
	f.Add(")")
	f.Fuzz(func(t *testing.T, content string) {
		st, err := parseProcStat(content)
		if err != nil {
			return
		}
		rest := content[strings.LastIndexByte(content, ')')+1:]
		if fields := strings.Fields(rest); len(fields) < 20 || fields[0] != string(st.State) {
			t.Errorf("accepted %q with state %q", content, st.State)
		}
	})
}

// FuzzParseDeviceSelector: any annotation value either parses into a
// selector that names something, or is refused; never a panic.
func FuzzParseDeviceSelector(f *testing.F) {
	for _, s := range []string{"all", "0,3", "GPU-8c1f,2", " , ", "five", "-1", "ALL,1", "MIG-1", "99999999999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sel, err := ParseDeviceSelector(s)
		if err != nil {
			return
		}
		if !sel.All && len(sel.UUIDs) == 0 && len(sel.Indexes) == 0 {
			t.Errorf("%q parsed into a selector that names nothing", s)
		}
		for _, i := range sel.Indexes {
			if i < 0 {
				t.Errorf("%q parsed a negative index %d", s, i)
			}
		}
	})
}
