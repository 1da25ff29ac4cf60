package extender

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"text/template"
	"time"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// SchedulerConfigOptions describe the kube-scheduler configuration that wires
// the extender in (DESIGN §9).
type SchedulerConfigOptions struct {
	// URL is the extender's base URL; https, as the extender serves
	// nothing else.
	URL string
	// Weight multiplies the extender's 0–10 scores; kube-scheduler scales them
	// to its 0–100 plugin scale, so 5 weighs as much as five plugins at their
	// maximum and device-level packing outweighs kube-scheduler's node-level
	// spreading of CPU and memory.
	Weight int64
	// HTTPTimeout bounds each call. kube-scheduler waits for filter and
	// prioritize inside its scheduling cycle, so a hung extender stalls every
	// GPU pod for this long; bind runs beside the cycle and takes one API
	// write, which passes the validating webhook (timeout 3 s).
	HTTPTimeout time.Duration
	// QPS and Burst are kube-scheduler's own client rate limits, raised from
	// the defaults (50, 100): with the extender binding, each GPU pod still
	// costs kube-scheduler an event and status writes.
	QPS   float32
	Burst int32
	// CAFile verifies the extender's serving certificate.
	CAFile string
	// ClientCertFile and ClientKeyFile are kube-scheduler's client
	// certificate, which the extender requires of every call to its verbs
	// (signed by the CA of its --client-ca-file, named in its
	// --client-allowed-names). kube-scheduler re-reads them when they
	// change.
	ClientCertFile string
	ClientKeyFile  string
	// ServerName, when set, is the name kube-scheduler verifies the
	// serving certificate for, when the URL's host is not one of its names
	// (an IP address, a load balancer).
	ServerName string
	// SchedulerName, when set, names the one profile: a kube-scheduler run
	// beside the cluster's default one (the chart's scheduler.mode=second)
	// schedules only the pods that name it, which are GPU pods whose
	// preemption is the admission loop's: the profile turns kube-scheduler's
	// DefaultPreemption off (DESIGN §6). Empty keeps the default profile
	// (default-scheduler), for configuring the cluster's own scheduler,
	// whose preemption stays on for other pods; there the extender's
	// preempt verb keeps it from evicting for GPU pods.
	SchedulerName string
	// LeaseName and LeaseNamespace, when set, name the scheduler's leader
	// election Lease. A second scheduler must not share the default one's
	// (kube-system/kube-scheduler), or only one of the two would run.
	LeaseName      string
	LeaseNamespace string
}

// DefaultSchedulerConfigOptions are the defaults of `partita extender
// --print-scheduler-config`.
func DefaultSchedulerConfigOptions() SchedulerConfigOptions {
	return SchedulerConfigOptions{
		URL:         "https://partita-extender.partita-system.svc:443",
		Weight:      5,
		HTTPTimeout: 5 * time.Second,
		QPS:         100,
		Burst:       200,
		// Where docs/operations.md puts them on a control plane node for
		// the cluster's own kube-scheduler (the chart's
		// scheduler.mode=default).
		CAFile:         "/etc/kubernetes/partita/ca.crt",
		ClientCertFile: "/etc/kubernetes/partita/client.crt",
		ClientKeyFile:  "/etc/kubernetes/partita/client.key",
	}
}

var schedulerConfigTemplate = template.Must(template.New("config").Parse(`# kube-scheduler configuration for Partita's extender; written by
# partita extender --print-scheduler-config. kube-scheduler calls the extender
# only for pods that request {{.Resource}}.
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
# Every feasible node is looked at, not kube-scheduler's sample (46% of 500
# nodes): the admission loop holds a GPU pod's room on one node, which a
# sample misses about half the time (a failed attempt and a backoff).
percentageOfNodesToScore: 100
clientConnection:
  qps: {{.QPS}}
  burst: {{.Burst}}
{{- if .LeaseName}}
leaderElection:
  leaderElect: true
  resourceName: {{.LeaseName}}
  resourceNamespace: {{.LeaseNamespace}}
{{- end}}
{{- if .SchedulerName}}
profiles:
- schedulerName: {{.SchedulerName}}
  plugins:
    postFilter:
      disabled:
      - name: DefaultPreemption
{{- end}}
extenders:
- urlPrefix: {{.URL}}
  filterVerb: {{.Filter}}
  prioritizeVerb: {{.Prioritize}}
  bindVerb: {{.Bind}}
  preemptVerb: {{.Preempt}}
  weight: {{.Weight}}
  httpTimeout: {{.HTTPTimeout}}
  enableHTTPS: true
  tlsConfig:
    caFile: {{.CAFile}}
    certFile: {{.ClientCertFile}}
    keyFile: {{.ClientKeyFile}}
{{- if .ServerName}}
    serverName: {{.ServerName}}
{{- end}}
  nodeCacheCapable: true
  ignorable: false
  managedResources:
  - name: {{.Resource}}
    ignoredByScheduler: false
`))

// SchedulerConfig renders the KubeSchedulerConfiguration (v1) that wires
// the extender in: all four verbs, nodeCacheCapable (kube-scheduler sends
// node names, the extender has its own ledger), partita.dev/gpu-milli as the
// managed resource that kube-scheduler still accounts for itself
// (ignoredByScheduler false), not ignorable (a GPU pod must never be bound
// without its devices), raised client QPS, and HTTPS both ways: the
// extender's certificate verified against CAFile, kube-scheduler's client
// certificate presented from ClientCertFile and ClientKeyFile.
func SchedulerConfig(o SchedulerConfigOptions) ([]byte, error) {
	// The URL is checked loosely: the dev cluster renders it with a
	// {port:extender} placeholder that url.Parse would refuse.
	scheme, rest, ok := strings.Cut(o.URL, "://")
	if !ok || (scheme != "http" && scheme != "https") || rest == "" || strings.ContainsAny(o.URL, " \n\t") {
		return nil, fmt.Errorf("render scheduler configuration: extender URL %q is not an https URL", o.URL)
	}
	if scheme != "https" {
		return nil, fmt.Errorf("render scheduler configuration: extender URL %q is plain HTTP; the extender serves HTTPS only, to kube-scheduler's client certificate", o.URL)
	}
	var missing []string
	for _, f := range []struct{ name, value string }{
		{"the extender's CA (--extender-ca-file)", o.CAFile},
		{"kube-scheduler's client certificate (--extender-client-cert-file)", o.ClientCertFile},
		{"its key (--extender-client-key-file)", o.ClientKeyFile},
	} {
		if f.value == "" {
			missing = append(missing, f.name)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("render scheduler configuration: missing %s: the extender answers only kube-scheduler's client certificate (docs/operations.md)", strings.Join(missing, ", "))
	}
	if (o.LeaseName == "") != (o.LeaseNamespace == "") {
		return nil, fmt.Errorf("render scheduler configuration: lease name %q and namespace %q must be set together", o.LeaseName, o.LeaseNamespace)
	}
	if o.Weight < 1 || o.HTTPTimeout <= 0 || o.QPS <= 0 || o.Burst < 1 {
		return nil, fmt.Errorf("render scheduler configuration: weight %d, timeout %s, QPS %g and burst %d must all be positive", o.Weight, o.HTTPTimeout, o.QPS, o.Burst)
	}
	quote := func(s string) string { b, _ := json.Marshal(s); return string(b) }
	data := map[string]any{
		"URL": quote(o.URL), "Weight": o.Weight, "HTTPTimeout": quote(o.HTTPTimeout.String()),
		"QPS": o.QPS, "Burst": o.Burst, "CAFile": quote(o.CAFile),
		"ClientCertFile": quote(o.ClientCertFile), "ClientKeyFile": quote(o.ClientKeyFile), "ServerName": "",
		"Filter": VerbFilter, "Prioritize": VerbPrioritize, "Bind": VerbBind, "Preempt": VerbPreempt,
		"Resource":      string(v1alpha1.ResourceGPUMilli),
		"SchedulerName": "", "LeaseName": "", "LeaseNamespace": "",
	}
	if o.SchedulerName != "" {
		data["SchedulerName"] = quote(o.SchedulerName)
	}
	if o.LeaseName != "" {
		data["LeaseName"], data["LeaseNamespace"] = quote(o.LeaseName), quote(o.LeaseNamespace)
	}
	if o.ServerName != "" {
		data["ServerName"] = quote(o.ServerName)
	}
	var b bytes.Buffer
	if err := schedulerConfigTemplate.Execute(&b, data); err != nil {
		return nil, fmt.Errorf("render scheduler configuration: %w", err)
	}
	return b.Bytes(), nil
}
