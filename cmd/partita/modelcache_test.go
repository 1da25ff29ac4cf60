package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestModelCacheFleetRefusesFlagsThatWouldDoNothing: the fleet of simulated
// nodes has no kubelet and serves no peers, so their flags are refused
// before anything connects.
func TestModelCacheFleetRefusesFlagsThatWouldDoNothing(t *testing.T) {
	cases := map[string]struct {
		args    []string
		wantErr string
	}{
		"a node name":         {args: []string{"--simulate-nodes", "--node-name", "n1"}, wantErr: "--node-name: the fleet of simulated nodes"},
		"a kubelet directory": {args: []string{"--simulate-nodes", "--kubelet-dir", "/var/lib/kubelet"}, wantErr: "--kubelet-dir: the fleet"},
		"a peer server":       {args: []string{"--simulate-nodes", "--peer-addr", ":8484"}, wantErr: "--peer-addr: the fleet"},
		"a peer token":        {args: []string{"--simulate-nodes", "--peer-token-file", "/t"}, wantErr: "--peer-token-file: the fleet"},
		"a bad selector":      {args: []string{"--simulate-nodes=a in (b"}, wantErr: "--simulate-nodes"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			cmd := commandFor("partita")
			cmd.SetArgs(append([]string{"model-cache", "--kubeconfig", "/nonexistent"}, tc.args...))
			cmd.SetOut(&bytes.Buffer{})
			cmd.SetErr(&bytes.Buffer{})
			err := cmd.Execute()
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("err = %v, want it to say %q", err, tc.wantErr)
			}
		})
	}
}
