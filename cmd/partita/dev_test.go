package main

import (
	"io"
	"testing"
)

func TestDevExtenderProxyFlags(t *testing.T) {
	for name, args := range map[string][]string{
		"no backend":  {"--listen", "127.0.0.1:0"},
		"no listen":   {"--backend", "127.0.0.1:1"},
		"no interval": {"--listen", "127.0.0.1:0", "--backend", "127.0.0.1:1", "--probe-interval", "0s"},
	} {
		t.Run(name, func(t *testing.T) {
			cmd := newRootCommand()
			cmd.SetOut(io.Discard)
			cmd.SetErr(io.Discard)
			cmd.SetArgs(append([]string{"dev", "extender-proxy"}, args...))
			if err := cmd.Execute(); err == nil {
				t.Errorf("dev extender-proxy %v ran", args)
			}
		})
	}
}
