package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestCommandForArgv0(t *testing.T) {
	cases := map[string]struct {
		argv0     string
		args      []string
		wantUsage string
	}{
		"as partita":            {argv0: "/usr/bin/partita", args: []string{"ctl", "why", "--help"}, wantUsage: "partita ctl why POD [flags]"},
		"as the kubectl plugin": {argv0: "/home/me/bin/kubectl-partita", args: []string{"why", "--help"}, wantUsage: "kubectl partita why POD [flags]"},
		"nodes by topology":     {argv0: "/home/me/bin/kubectl-partita", args: []string{"nodes", "--help"}, wantUsage: "--topology string"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			cmd := commandFor(tc.argv0)
			var out bytes.Buffer
			cmd.SetOut(&out)
			cmd.SetArgs(tc.args)
			if err := cmd.Execute(); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(out.String(), tc.wantUsage) {
				t.Errorf("help does not show %q:\n%s", tc.wantUsage, out.String())
			}
		})
	}
}

func TestCtlRefusesUnknownOutput(t *testing.T) {
	cmd := commandFor("kubectl-partita")
	cmd.SetArgs([]string{"nodes", "-o", "yaml", "--kubeconfig", "/nonexistent"})
	cmd.SetOut(&bytes.Buffer{})
	err := cmd.Execute()
	if err == nil || !strings.Contains(err.Error(), `unknown output format "yaml"`) {
		t.Errorf("err = %v, want it to name the unknown output format", err)
	}
}
