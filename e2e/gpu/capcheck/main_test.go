package main

import (
	"errors"
	"testing"
)

// TestWithoutADriver: a machine without the CUDA driver is told apart (exit
// 2) from a failed check.
func TestWithoutADriver(t *testing.T) {
	cases := map[string]struct {
		library      string
		step         int64
		wantNoDevice bool
	}{
		"no driver library": {library: "libcuda-partita-missing.so.1", step: 256, wantNoDevice: true},
		"zero step":         {library: "libcuda.so.1", step: 0},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := measure(tc.library, 0, tc.step, 0, 0)
			if err == nil {
				t.Fatal("no error")
			}
			if got := errors.As(err, new(noDevice)); got != tc.wantNoDevice {
				t.Errorf("%v: no-device %v, want %v", err, got, tc.wantNoDevice)
			}
		})
	}
}
