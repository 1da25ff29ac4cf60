package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestConsoleRefusesFlagsThatWouldDoNothing: a flag of the other mode, a
// non-loopback address for a local console, and -o under kubectl partita
// are refused before anything connects.
func TestConsoleRefusesFlagsThatWouldDoNothing(t *testing.T) {
	cases := map[string]struct {
		argv0   string
		args    []string
		wantErr string
	}{
		"a local console on every interface": {argv0: "partita", args: []string{"console", "--addr", "0.0.0.0:8080"}, wantErr: "loopback only"},
		"a TLS file in local mode":           {argv0: "partita", args: []string{"console", "--tls-cert-file", "x.crt"}, wantErr: "--tls-cert-file is for --mode shared"},
		"proxy headers without its CA":       {argv0: "partita", args: []string{"console", "--mode", "shared", "--proxy-username-headers", "X-User"}, wantErr: "needs --proxy-client-ca-file"},
		"an unknown mode":                    {argv0: "partita", args: []string{"console", "--mode", "remote"}, wantErr: `--mode "remote"`},
		"-o under kubectl partita":           {argv0: "kubectl-partita", args: []string{"console", "-o", "json"}, wantErr: "console has no -o"},
		"kubectl partita console, local":     {argv0: "kubectl-partita", args: []string{"console", "--addr", "10.0.0.1:80"}, wantErr: "loopback only"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			cmd := commandFor(tc.argv0)
			cmd.SetArgs(append(tc.args, "--kubeconfig", "/nonexistent"))
			cmd.SetOut(&bytes.Buffer{})
			cmd.SetErr(&bytes.Buffer{})
			err := cmd.Execute()
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("err = %v, want it to say %q", err, tc.wantErr)
			}
		})
	}
}
