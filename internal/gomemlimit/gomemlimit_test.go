package gomemlimit

import (
	"math"
	"runtime/debug"
	"testing"

	"github.com/go-logr/logr"
)

func TestSet(t *testing.T) {
	before := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(before) })
	cases := map[string]struct {
		flag    string
		want    int64
		wantErr bool
	}{
		"a size":          {flag: "900Mi", want: 900 << 20},
		"decimal units":   {flag: "1G", want: 1_000_000_000},
		"not a size":      {flag: "lots", wantErr: true},
		"zero":            {flag: "0", wantErr: true},
		"a negative size": {flag: "-1Gi", wantErr: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			debug.SetMemoryLimit(math.MaxInt64)
			got, err := Set(logr.Discard(), tc.flag)
			if (err != nil) != tc.wantErr {
				t.Fatalf("Set(%q) error = %v, want an error: %v", tc.flag, err, tc.wantErr)
			}
			if tc.wantErr {
				if now := debug.SetMemoryLimit(-1); now != math.MaxInt64 {
					t.Errorf("a refused flag changed the runtime's limit to %d", now)
				}
				return
			}
			if got != tc.want || debug.SetMemoryLimit(-1) != tc.want {
				t.Errorf("Set(%q) = %d, runtime limit %d; want %d", tc.flag, got, debug.SetMemoryLimit(-1), tc.want)
			}
		})
	}
}
