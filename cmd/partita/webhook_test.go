package main

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/policy"
	"github.com/partita-dev/partita/webhook"
)

func TestWebhookFlags(t *testing.T) {
	cases := map[string]struct {
		flags     webhookFlags
		want      policy.Config
		wantModes []v1alpha1.IsolationMode
		wantErr   bool
	}{
		"defaults": {flags: webhookFlags{isolationModes: "auto"}},
		"ceilings": {
			flags:     webhookFlags{maxGPUsPerPod: "8", minGPUFraction: "0.1", requireQueue: true, isolationModes: "mps, hami-core"},
			want:      policy.Config{MaxGPUMilliPerPod: 8000, MinGPUMilli: 100, RequireQueue: true},
			wantModes: []v1alpha1.IsolationMode{v1alpha1.IsolationMPS, v1alpha1.IsolationHAMiCore},
		},
		"fractional ceiling": {flags: webhookFlags{maxGPUsPerPod: "1.5"}, want: policy.Config{MaxGPUMilliPerPod: 1500}},
		"bad ceiling":        {flags: webhookFlags{maxGPUsPerPod: "-1"}, wantErr: true},
		"fraction over one":  {flags: webhookFlags{minGPUFraction: "2"}, wantErr: true},
		"unknown mode":       {flags: webhookFlags{isolationModes: "mig"}, wantErr: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := tc.flags.policyConfig()
			modes, merr := tc.flags.modes()
			if (err != nil || merr != nil) != tc.wantErr {
				t.Fatalf("errors = %v, %v; want error %v", err, merr, tc.wantErr)
			}
			if tc.wantErr {
				return
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("policyConfig() (-want,+got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantModes, modes); diff != "" {
				t.Errorf("modes() (-want,+got):\n%s", diff)
			}
		})
	}
}

func TestWebhookTrustedIdentities(t *testing.T) {
	const extender = "system:serviceaccount:partita-system:partita-extender"
	cases := map[string]struct {
		flags webhookFlags
		want  webhook.Identities
	}{
		"default: every service account of the namespace": {
			flags: webhookFlags{namespace: "partita-system"},
			want:  webhook.Identities{Groups: []string{"system:serviceaccounts:partita-system"}},
		},
		"a user replaces the default group": {
			flags: webhookFlags{namespace: "partita-system", trustedUsers: []string{extender}},
			want:  webhook.Identities{Users: []string{extender}},
		},
		"groups as given": {
			flags: webhookFlags{namespace: "partita-system", trustedGroups: []string{"ops"}},
			want:  webhook.Identities{Groups: []string{"ops"}},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, tc.flags.trusted()); diff != "" {
				t.Errorf("trusted() (-want,+got):\n%s", diff)
			}
		})
	}
}

// TestWebhookSchedulerNameFlag: --scheduler-name reaches the flags the pod
// admission is built from (its effect on pods is in webhook's
// mutate-scheduler-name golden case).
func TestWebhookSchedulerNameFlag(t *testing.T) {
	cmd := newWebhookCommand()
	if err := cmd.ParseFlags([]string{"--scheduler-name", "partita"}); err != nil {
		t.Fatal(err)
	}
	if got, _ := cmd.Flags().GetString("scheduler-name"); got != "partita" {
		t.Errorf("--scheduler-name = %q, want partita", got)
	}
}
