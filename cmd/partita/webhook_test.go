package main

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/policy"
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
