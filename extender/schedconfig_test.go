package extender

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	configv1 "k8s.io/kube-scheduler/config/v1"
	"sigs.k8s.io/yaml"
)

func TestSchedulerConfig(t *testing.T) {
	extenderWant := func(url string, tls *configv1.ExtenderTLSConfig) configv1.Extender {
		return configv1.Extender{
			URLPrefix: url, FilterVerb: "filter", PrioritizeVerb: "prioritize", BindVerb: "bind", PreemptVerb: "preempt",
			Weight: 5, HTTPTimeout: metav1.Duration{Duration: 5 * time.Second}, EnableHTTPS: true, TLSConfig: tls,
			NodeCacheCapable: true,
			ManagedResources: []configv1.ExtenderManagedResource{{Name: "partita.dev/gpu-milli", IgnoredByScheduler: false}},
		}
	}
	withURL := func(url, ca, cert, key, serverName string) SchedulerConfigOptions {
		o := DefaultSchedulerConfigOptions()
		o.URL, o.CAFile, o.ClientCertFile, o.ClientKeyFile, o.ServerName = url, ca, cert, key, serverName
		return o
	}
	cases := map[string]struct {
		opts SchedulerConfigOptions
		want configv1.Extender
	}{
		"the defaults, for a control plane's scheduler": {
			opts: DefaultSchedulerConfigOptions(),
			want: extenderWant("https://partita-extender.partita-system.svc:443", &configv1.ExtenderTLSConfig{
				CAFile: "/etc/kubernetes/partita/ca.crt", CertFile: "/etc/kubernetes/partita/client.crt", KeyFile: "/etc/kubernetes/partita/client.key"}),
		},
		"in a cluster, both ways verified": {
			opts: withURL("https://partita-extender.partita-system.svc:443", "/etc/partita/ca.crt", "/etc/partita/client/tls.crt", "/etc/partita/client/tls.key", ""),
			want: extenderWant("https://partita-extender.partita-system.svc:443", &configv1.ExtenderTLSConfig{
				CAFile: "/etc/partita/ca.crt", CertFile: "/etc/partita/client/tls.crt", KeyFile: "/etc/partita/client/tls.key"}),
		},
		"an address with the certificate's name": {
			opts: withURL("https://10.0.0.7:8443", "/ca.crt", "/c.crt", "/c.key", "partita-extender.partita-system.svc"),
			want: extenderWant("https://10.0.0.7:8443", &configv1.ExtenderTLSConfig{
				CAFile: "/ca.crt", CertFile: "/c.crt", KeyFile: "/c.key", ServerName: "partita-extender.partita-system.svc"}),
		},
		"dev cluster, loopback with a port placeholder": {
			opts: withURL("https://127.0.0.1:{port:extender}", "{state}/extender-certs/ca.crt", "{state}/extender-certs/client.crt", "{state}/extender-certs/client.key", ""),
			want: extenderWant("https://127.0.0.1:{port:extender}", &configv1.ExtenderTLSConfig{
				CAFile: "{state}/extender-certs/ca.crt", CertFile: "{state}/extender-certs/client.crt", KeyFile: "{state}/extender-certs/client.key"}),
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			b, err := SchedulerConfig(tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			// Strict: every key must be a field of kube-scheduler's v1 types.
			var got configv1.KubeSchedulerConfiguration
			if err := yaml.UnmarshalStrict(b, &got); err != nil {
				t.Fatalf("decode as KubeSchedulerConfiguration: %v\n%s", err, b)
			}
			if got.APIVersion != "kubescheduler.config.k8s.io/v1" || got.Kind != "KubeSchedulerConfiguration" {
				t.Errorf("apiVersion %q kind %q", got.APIVersion, got.Kind)
			}
			if got.ClientConnection.QPS != 100 || got.ClientConnection.Burst != 200 {
				t.Errorf("client QPS %g burst %d, want 100 and 200", got.ClientConnection.QPS, got.ClientConnection.Burst)
			}
			if diff := cmp.Diff([]configv1.Extender{tc.want}, got.Extenders); diff != "" {
				t.Errorf("extenders (-want,+got):\n%s", diff)
			}
			if !strings.Contains(string(b), "ignoredByScheduler: false") {
				t.Errorf("ignoredByScheduler is not spelled out:\n%s", b)
			}
		})
	}
}

// TestSchedulerConfigSecondScheduler: a scheduler beside the default one
// has its own profile name and Lease.
func TestSchedulerConfigSecondScheduler(t *testing.T) {
	o := DefaultSchedulerConfigOptions()
	o.SchedulerName, o.LeaseName, o.LeaseNamespace = "partita", "partita-scheduler", "partita-system"
	b, err := SchedulerConfig(o)
	if err != nil {
		t.Fatal(err)
	}
	var got configv1.KubeSchedulerConfiguration
	if err := yaml.UnmarshalStrict(b, &got); err != nil {
		t.Fatalf("decode as KubeSchedulerConfiguration: %v\n%s", err, b)
	}
	if len(got.Profiles) != 1 || got.Profiles[0].SchedulerName == nil || *got.Profiles[0].SchedulerName != "partita" {
		t.Fatalf("profiles = %+v, want one named partita", got.Profiles)
	}
	// GPU pods are preempted by the admission loop alone.
	if p := got.Profiles[0].Plugins; p == nil || !slices.Equal(p.PostFilter.Disabled, []configv1.Plugin{{Name: "DefaultPreemption"}}) {
		t.Errorf("profile plugins = %+v, want DefaultPreemption disabled", p)
	}
	le := got.LeaderElection
	if le.LeaderElect == nil || !*le.LeaderElect || le.ResourceName != "partita-scheduler" || le.ResourceNamespace != "partita-system" {
		t.Errorf("leaderElection = %+v, want partita-system/partita-scheduler", le)
	}
}

func TestSchedulerConfigRefuses(t *testing.T) {
	cases := map[string]func(*SchedulerConfigOptions){
		"no scheme":                    func(o *SchedulerConfigOptions) { o.URL = "127.0.0.1:8443" },
		"ftp":                          func(o *SchedulerConfigOptions) { o.URL = "ftp://host" },
		"a line break":                 func(o *SchedulerConfigOptions) { o.URL = "http://host\nkind: Pod" },
		"weight 0":                     func(o *SchedulerConfigOptions) { o.Weight = 0 },
		"no timeout":                   func(o *SchedulerConfigOptions) { o.HTTPTimeout = 0 },
		"negative QPS":                 func(o *SchedulerConfigOptions) { o.QPS = -1 },
		"burst of zero":                func(o *SchedulerConfigOptions) { o.Burst = 0 },
		"lease name without namespace": func(o *SchedulerConfigOptions) { o.LeaseName = "x" },
		// The extender serves HTTPS to kube-scheduler's certificate only.
		"plain HTTP":     func(o *SchedulerConfigOptions) { o.URL = "http://127.0.0.1:8080" },
		"no CA":          func(o *SchedulerConfigOptions) { o.CAFile = "" },
		"no client cert": func(o *SchedulerConfigOptions) { o.ClientCertFile = "" },
		"no client key":  func(o *SchedulerConfigOptions) { o.ClientKeyFile = "" },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			o := DefaultSchedulerConfigOptions()
			mutate(&o)
			if b, err := SchedulerConfig(o); err == nil {
				t.Errorf("rendered:\n%s", b)
			}
		})
	}
}
