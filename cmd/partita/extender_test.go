package main

import (
	"bytes"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/partita-dev/partita/admission"
	"github.com/partita-dev/partita/extender"
)

// TestDevSchedulerConfig renders the dev cluster's scheduler configuration,
// which must name the port placeholder of the proxy in front of the
// extender's replicas.
func TestDevSchedulerConfig(t *testing.T) {
	got := devSchedulerConfig()
	for _, want := range []string{`urlPrefix: "https://127.0.0.1:{port:extender-proxy}"`, `caFile: "{state}/extender-certs/ca.crt"`,
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

// TestExtenderTakesTheChartsUsageFlags: the flags the chart passes for
// time-based fair share (helm's TestChartFairShareUsage) get past the
// extender's checks, which come before it needs its certificates, and a
// half-life of 0 is refused with a message naming the flag and the value.
func TestExtenderTakesTheChartsUsageFlags(t *testing.T) {
	chart := []string{"--fair-share-usage-weight=0.5", "--fair-share-usage-half-life=1h", "--fair-share-usage-window=24h", "--fair-share-usage-window-type=tumbling"}
	cases := map[string]struct {
		args []string
		want string
	}{
		"the chart's flags":  {args: chart, want: "the extender serves HTTPS to kube-scheduler's client certificate only"},
		"a zero half-life":   {args: append(slices.Clone(chart), "--fair-share-usage-half-life=0"), want: "--fair-share-usage-half-life must be above 0, got 0s"},
		"without admission":  {args: append(slices.Clone(chart), "--admission=false"), want: "--fair-share-usage-weight weighs usage in the admission loop's fair share: it needs --admission=true"},
		"a window too short": {args: append(slices.Clone(chart), "--fair-share-usage-window=500ms"), want: "(the chart sets these from extender.admission.fairShareUsage)"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			cmd := newRootCommand()
			cmd.SetOut(io.Discard)
			cmd.SetErr(io.Discard)
			cmd.SetArgs(append([]string{"extender"}, tc.args...))
			err := cmd.Execute()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("extender %v: error %v, want one saying %q", tc.args, err, tc.want)
			}
		})
	}
}

// TestExtenderLeaderElectionFlags: the Lease timings the dev cluster's
// replicas use get past the checks (to the certificates'), and timings
// client-go's elector would refuse are refused first, naming the flags.
func TestExtenderLeaderElectionFlags(t *testing.T) {
	const certs = "the extender serves HTTPS to kube-scheduler's client certificate only"
	cases := map[string]struct {
		args []string
		want string
	}{
		"the defaults":        {want: certs},
		"the dev cluster's":   {args: devLeaderElectionFlags, want: certs},
		"with a replica name": {args: []string{"--replica-name=extender-2"}, want: certs},
		"renew as long":       {args: []string{"--leader-election-lease-duration=4s", "--leader-election-renew-deadline=4s"}, want: "--leader-election-renew-deadline 4s: want it below --leader-election-lease-duration 4s"},
		"retry too long":      {args: []string{"--leader-election-renew-deadline=3s", "--leader-election-retry-period=3s"}, want: "--leader-election-retry-period 3s: want it below --leader-election-renew-deadline 3s divided by 1.2"},
		"a zero lease":        {args: []string{"--leader-election-lease-duration=0"}, want: "want positive durations"},
		"a negative retry":    {args: []string{"--leader-election-retry-period=-1s"}, want: "want positive durations"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			cmd := newRootCommand()
			cmd.SetOut(io.Discard)
			cmd.SetErr(io.Discard)
			cmd.SetArgs(append([]string{"extender"}, tc.args...))
			if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("extender %v: error %v, want one saying %q", tc.args, err, tc.want)
			}
		})
	}
}
