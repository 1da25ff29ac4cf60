package csi

import (
	"os"
	"testing"
)

// shortTempDir is under /tmp: a unix socket's path must stay under 108
// bytes, which t.TempDir's long names can exceed.
func shortTempDir(t *testing.T) (string, error) {
	d, err := os.MkdirTemp("", "csi")
	if err != nil {
		return "", err
	}
	t.Cleanup(func() { _ = os.RemoveAll(d) })
	return d, nil
}
