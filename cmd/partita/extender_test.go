package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/partita-dev/partita/admission"
	"github.com/partita-dev/partita/extender"
)

// TestDevSchedulerConfig renders the dev cluster's scheduler configuration,
// which must name the extender's port placeholder.
func TestDevSchedulerConfig(t *testing.T) {
	got := devSchedulerConfig()
	for _, want := range []string{`urlPrefix: "https://127.0.0.1:{port:extender}"`, `caFile: "{state}/extender-certs/ca.crt"`,
		`certFile: "{state}/extender-certs/client.crt"`, `keyFile: "{state}/extender-certs/client.key"`} {
		if !strings.Contains(got, want) {
			t.Errorf("dev scheduler configuration lacks %s:\n%s", want, got)
		}
	}
}

func TestPrintSchedulerConfig(t *testing.T) {
	cmd := newRootCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"extender", "--print-scheduler-config", "--extender-url", "https://ext.example:8443", "--scheduler-qps", "150"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`urlPrefix: "https://ext.example:8443"`, "enableHTTPS: true", "qps: 150", "nodeCacheCapable: true",
		"name: partita.dev/gpu-milli", "ignoredByScheduler: false", "bindVerb: bind", "preemptVerb: preempt"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

// TestImplicitJobGangsIsADeprecatedAlias: the flag is still accepted, says
// it is deprecated and what replaces it.
func TestImplicitJobGangsIsADeprecatedAlias(t *testing.T) {
	cmd := newRootCommand()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs([]string{"extender", "--implicit-job-gangs", "--print-scheduler-config"})
	if err := cmd.Execute(); err != nil {
		t.Fatalf("the deprecated flag is refused: %v", err)
	}
	if got := errOut.String() + out.String(); !strings.Contains(got, "implicit-job-gangs has been deprecated") || !strings.Contains(got, "docs/workloads.md") {
		t.Errorf("no deprecation notice naming what replaces it:\n%s", got)
	}
}

// TestInflightTTLMatchesAssumeTTL: a single pod the loop releases holds its
// place for as long as the extender keeps an assignment kube-scheduler has
// not bound; the two packages keep their own defaults, which must agree.
func TestInflightTTLMatchesAssumeTTL(t *testing.T) {
	if admission.DefaultInflightTTL != extender.DefaultAssumeTTL {
		t.Errorf("admission.DefaultInflightTTL %s, extender.DefaultAssumeTTL %s: want them equal", admission.DefaultInflightTTL, extender.DefaultAssumeTTL)
	}
}
