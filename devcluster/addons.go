package devcluster

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	certutil "k8s.io/client-go/util/cert"
	"sigs.k8s.io/yaml"
)

// Addon is a workload controller the dev cluster can run beside its control
// plane (`partita dev up --addons`): the real controller, built from its
// release by e2e/clusterbins/build.sh with that release's CRDs and webhook
// configurations, run on the host like kube-controller-manager, with the
// admin's kubeconfig. Controllers that serve admission webhooks serve them
// on a loopback port with a self-signed certificate that `up` registers.
type Addon struct {
	// Name is what --addons takes, and the folder and binary name.
	Name string
	// Version is the release e2e/clusterbins/build.sh builds (its
	// <NAME>_VERSION default; TestAddonVersionsMatchBuildScript).
	Version string
	// Kinds are the workload kinds it brings, for people.
	Kinds string
	// PodLabel restricts its pod webhooks to its own pods, as its release's
	// kustomize patches do.
	PodLabel string
	// args is its command line; config its configuration file, if any.
	args   []string
	config string
	// readyPath, when set, is the readiness path on its {port:NAME}.
	readyPath string
	// noCRDs: it brings no kinds (the S3 store).
	noCRDs bool
}

// Addons are the controllers `partita dev up --addons` knows, by name.
func Addons() []Addon {
	return []Addon{
		{
			Name: "jobset", Version: "v0.12.0", Kinds: "JobSet (jobset.x-k8s.io)", PodLabel: "jobset.sigs.k8s.io/jobset-name",
			args: []string{"--kubeconfig", "{kubeconfig}", "--config", "{addon}/config.yaml", "--zap-log-level", "info"},
			config: `apiVersion: config.jobset.x-k8s.io/v1alpha1
kind: Configuration
leaderElection: {leaderElect: false}
internalCertManagement: {enable: false}
webhook: {host: 127.0.0.1, port: {port:jobset-webhook}, certDir: "{addon}/certs"}
metrics: {bindAddress: "0"}
health: {healthProbeBindAddress: "127.0.0.1:{port:jobset-health}"}
`,
		},
		{
			Name: "lws", Version: "v0.8.0", Kinds: "LeaderWorkerSet (leaderworkerset.x-k8s.io)", PodLabel: "leaderworkerset.sigs.k8s.io/name",
			args: []string{"--kubeconfig", "{kubeconfig}", "--config", "{addon}/config.yaml", "--zap-log-level", "info"},
			config: `apiVersion: config.lws.x-k8s.io/v1alpha1
kind: Configuration
leaderElection: {leaderElect: false}
internalCertManagement: {enable: false}
webhook: {host: 127.0.0.1, port: {port:lws-webhook}, certDir: "{addon}/certs"}
metrics: {bindAddress: "0"}
health: {healthProbeBindAddress: "127.0.0.1:{port:lws-health}"}
`,
		},
		{
			Name: "kuberay", Version: "v1.5.0", Kinds: "RayCluster, RayJob, RayService (ray.io)",
			// KubeRay serves webhooks only with ENABLE_WEBHOOKS=true.
			args: []string{"--kubeconfig", "{kubeconfig}", "--metrics-addr", "0", "--health-probe-bind-address", "127.0.0.1:{port:kuberay-health}",
				"--enable-leader-election=false", "--log-stdout-encoder", "console"},
		},
		{
			// A real S3-compatible server (versitygw's POSIX gateway: a
			// bucket is a directory of the cluster's state) for Models; its
			// endpoint and keys are the Secret partita-system/s3.
			Name: AddonS3, Version: "v1.8.0", Kinds: "an S3-compatible object store (versitygw), its endpoint and keys in Secret " + PartitaNamespace + "/" + S3SecretName,
			args: []string{"--access", "{s3-access}", "--secret", "{s3-secret}", "--port", "127.0.0.1:{port:s3}", "--port", "{host-ip}:{port:s3}",
				"--health", "/health", "--quiet", "posix", "{addon}/data"},
			readyPath: "/health",
			noCRDs:    true,
		},
	}
}

// AddonS3 is the S3 store's addon name; S3SecretName its Secret in
// partita-system, with the keys endpoint, AWS_ACCESS_KEY_ID and
// AWS_SECRET_ACCESS_KEY.
const (
	AddonS3      = "s3"
	S3SecretName = "s3"
)

// AddonNames are the names --addons takes.
func AddonNames() []string {
	var out []string
	for _, a := range Addons() {
		out = append(out, a.Name)
	}
	return out
}

// addon returns the addon of that name.
func addon(name string) (Addon, bool) {
	i := slices.IndexFunc(Addons(), func(a Addon) bool { return a.Name == name })
	if i < 0 {
		return Addon{}, false
	}
	return Addons()[i], true
}

// AddonDir is where build.sh puts an addon: bin/<name>, crds/, and
// webhooks.yaml for controllers that serve webhooks.
func (c *Cluster) AddonDir(a Addon) string {
	return filepath.Join(c.opts.AddonsDir, a.Name+"-"+a.Version)
}

// addonState is the cluster's own folder for an addon: its configuration
// and serving certificate.
func (c *Cluster) addonState(a Addon) string {
	return filepath.Join(c.stateDir(), "addons", a.Name)
}

// checkAddons reports every requested addon that is not built, with the
// command that builds it.
func (c *Cluster) checkAddons() error {
	var missing []string
	for _, name := range c.opts.Addons {
		a, ok := addon(name)
		if !ok {
			return fmt.Errorf("--addons %s: unknown addon; known: %s", name, strings.Join(AddonNames(), ", "))
		}
		if _, err := os.Stat(filepath.Join(c.AddonDir(a), "bin", a.Name)); err != nil {
			missing = append(missing, a.Name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("addon controllers not built in %s: %s; build them with 'make addon-bins' (about 3 minutes each the first time; 'make cluster-bins' builds every group the tests use), or only these with 'ADDONS=\"%s\" bash e2e/clusterbins/build.sh addons'",
			c.opts.AddonsDir, strings.Join(missing, ", "), strings.Join(missing, " "))
	}
	return nil
}

// addonProcesses are the host processes of the requested addons.
func (c *Cluster) addonProcesses() []HostProcess {
	var out []HostProcess
	for _, name := range c.opts.Addons {
		a, ok := addon(name)
		if !ok {
			continue
		}
		vals := c.addonValues(a)
		args := make([]string, len(a.args))
		for i, s := range a.args {
			args[i] = vals.Replace(s)
		}
		ready := ""
		if p := healthPort(a); p != "" {
			ready = "http://127.0.0.1:{port:" + p + "}/readyz"
		}
		if a.readyPath != "" {
			ready = "http://127.0.0.1:{port:" + a.Name + "}" + a.readyPath
		}
		out = append(out, HostProcess{Name: "addon-" + a.Name, Binary: filepath.Join(c.AddonDir(a), "bin", a.Name), Args: args, ReadyURL: ready})
	}
	return out
}

func healthPort(a Addon) string {
	for _, s := range append(slices.Clone(a.args), a.config) {
		if i := strings.Index(s, "{port:"+a.Name+"-health}"); i >= 0 {
			return a.Name + "-health"
		}
	}
	return ""
}

// startAddons writes the addons' configuration and certificates, starts
// their controllers and registers their webhooks (Up installs their CRDs
// first).
func (c *Cluster) startAddons(ctx context.Context, cfg *rest.Config) error {
	if len(c.opts.Addons) == 0 {
		return nil
	}
	for _, name := range c.opts.Addons {
		a, _ := addon(name)
		if err := c.prepareAddon(a); err != nil {
			return err
		}
	}
	if err := c.startHostProcesses(ctx, "", c.addonProcesses()); err != nil {
		return err
	}
	for _, name := range c.opts.Addons {
		a, _ := addon(name)
		if err := c.registerAddonWebhooks(ctx, cfg, a); err != nil {
			return err
		}
		if a.Name == AddonS3 {
			if err := c.writeS3Secret(ctx, a); err != nil {
				return err
			}
		}
		c.printf("Addon %s %s runs: %s", a.Name, a.Version, a.Kinds)
	}
	return nil
}

// installAddonCRDs applies the CRDs of the addon's release and waits until
// they are served.
func (c *Cluster) installAddonCRDs(ctx context.Context, cfg *rest.Config, a Addon) error {
	if a.noCRDs {
		return nil
	}
	files, err := filepath.Glob(filepath.Join(c.AddonDir(a), "crds", "*.yaml"))
	if err != nil || len(files) == 0 {
		return fmt.Errorf("addon %s: no CRDs in %s; build it again with 'make addon-bins' (or 'make cluster-bins')", a.Name, filepath.Join(c.AddonDir(a), "crds"))
	}
	var names []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("read %s: %w", f, err)
		}
		if err := Apply(ctx, cfg, b); err != nil {
			return fmt.Errorf("addon %s: install CRDs from %s: %w", a.Name, f, err)
		}
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.Unmarshal(b, &crd); err == nil && crd.Name != "" {
			names = append(names, crd.Name)
		}
	}
	cs, err := apiextensionsclient.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("create apiextensions client: %w", err)
	}
	for _, name := range names {
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			cur, err := cs.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, nil //nolint:nilerr // transient: keep polling until the timeout
			}
			for _, cond := range cur.Status.Conditions {
				if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			return fmt.Errorf("addon %s: wait for CRD %s to be established: %w", a.Name, name, err)
		}
	}
	return nil
}

// prepareAddon writes the addon's configuration file and, for controllers
// that serve webhooks, a self-signed serving certificate for 127.0.0.1
// (kept while it lasts).
func (c *Cluster) prepareAddon(a Addon) error {
	dir := c.addonState(a)
	if err := os.MkdirAll(filepath.Join(dir, "certs"), 0o755); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	if a.config != "" {
		content, err := c.expand(strings.ReplaceAll(a.config, "{addon}", dir))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, "config.yaml"), []byte(content), 0o644); err != nil {
			return fmt.Errorf("write configuration of addon %s: %w", a.Name, err)
		}
	}
	if a.Name == AddonS3 {
		if err := os.MkdirAll(filepath.Join(dir, "data"), 0o700); err != nil {
			return fmt.Errorf("create the S3 store's data directory: %w", err)
		}
		if _, err := c.s3Credentials(); err != nil {
			return err
		}
	}
	if !c.addonHasWebhooks(a) {
		return nil
	}
	crt, key := filepath.Join(dir, "certs", "tls.crt"), filepath.Join(dir, "certs", "tls.key")
	if pem, err := os.ReadFile(crt); err == nil {
		if certs, err := certutil.ParseCertsPEM(pem); err == nil && len(certs) > 0 && time.Until(certs[0].NotAfter) > 30*24*time.Hour {
			return nil
		}
	}
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey("127.0.0.1", []net.IP{net.IPv4(127, 0, 0, 1)}, nil)
	if err != nil {
		return fmt.Errorf("addon %s: make a serving certificate: %w", a.Name, err)
	}
	if err := os.WriteFile(key, keyPEM, 0o600); err != nil {
		return fmt.Errorf("write %s: %w", key, err)
	}
	if err := os.WriteFile(crt, certPEM, 0o644); err != nil {
		return fmt.Errorf("write %s: %w", crt, err)
	}
	return nil
}

func (c *Cluster) addonHasWebhooks(a Addon) bool {
	_, err := os.Stat(filepath.Join(c.AddonDir(a), "webhooks.yaml"))
	return err == nil
}

// registerAddonWebhooks registers the addon release's webhook
// configurations, pointed at the controller's loopback port with its
// certificate, and its pod webhooks limited to its own pods.
func (c *Cluster) registerAddonWebhooks(ctx context.Context, cfg *rest.Config, a Addon) error {
	if !c.addonHasWebhooks(a) {
		return nil
	}
	raw, err := os.ReadFile(filepath.Join(c.AddonDir(a), "webhooks.yaml"))
	if err != nil {
		return fmt.Errorf("read webhooks of addon %s: %w", a.Name, err)
	}
	ca, err := os.ReadFile(filepath.Join(c.addonState(a), "certs", "tls.crt"))
	if err != nil {
		return fmt.Errorf("read certificate of addon %s: %w", a.Name, err)
	}
	port, err := c.Port(a.Name + "-webhook")
	if err != nil {
		return err
	}
	out, err := addonWebhooks(raw, a, fmt.Sprintf("https://127.0.0.1:%d", port), ca)
	if err != nil {
		return err
	}
	if err := Apply(ctx, cfg, out); err != nil {
		return fmt.Errorf("register webhooks of addon %s: %w", a.Name, err)
	}
	return nil
}

// addonWebhooks rewrites a release's webhook configurations (written for a
// Service of the release's kustomization) for the controller on the host:
// each named after the addon, each webhook called at base+path with the CA
// bundle ca, and each pod webhook limited to pods with a.PodLabel.
func addonWebhooks(raw []byte, a Addon, base string, ca []byte) ([]byte, error) {
	var out bytes.Buffer
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(raw)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read webhooks of addon %s: %w", a.Name, err)
		}
		var obj unstructured.Unstructured
		if err := yaml.Unmarshal(doc, &obj.Object); err != nil {
			return nil, fmt.Errorf("decode webhooks of addon %s: %w", a.Name, err)
		}
		if len(obj.Object) == 0 {
			continue
		}
		obj.SetName(a.Name + "-" + obj.GetName())
		hooks, _, _ := unstructured.NestedSlice(obj.Object, "webhooks")
		for i, h := range hooks {
			hook, ok := h.(map[string]any)
			if !ok {
				continue
			}
			path, _, _ := unstructured.NestedString(hook, "clientConfig", "service", "path")
			hook["clientConfig"] = map[string]any{"url": base + path, "caBundle": base64.StdEncoding.EncodeToString(ca)}
			if a.PodLabel != "" && targetsPods(hook) {
				hook["objectSelector"] = map[string]any{"matchExpressions": []any{map[string]any{"key": a.PodLabel, "operator": "Exists"}}}
			}
			hooks[i] = hook
		}
		if err := unstructured.SetNestedSlice(obj.Object, hooks, "webhooks"); err != nil {
			return nil, err
		}
		b, err := yaml.Marshal(obj.Object)
		if err != nil {
			return nil, err
		}
		out.WriteString("---\n")
		out.Write(b)
	}
	return out.Bytes(), nil
}

func targetsPods(hook map[string]any) bool {
	rules, _, _ := unstructured.NestedSlice(hook, "rules")
	for _, r := range rules {
		rm, _ := r.(map[string]any)
		res, _, _ := unstructured.NestedStringSlice(rm, "resources")
		if slices.Contains(res, "pods") {
			return true
		}
	}
	return false
}

// createdWith is what a cluster was created with that only creation can
// set.
type createdWith struct {
	FeatureGates  string `json:"featureGates,omitempty"`
	RuntimeConfig string `json:"runtimeConfig,omitempty"`
}

func (c *Cluster) createdWithFile() string {
	return filepath.Join(c.Dir(), "partita-created-with.yaml")
}

func (c *Cluster) recordCreatedWith() error {
	b, err := yaml.Marshal(createdWith{FeatureGates: c.opts.FeatureGates, RuntimeConfig: c.opts.RuntimeConfig})
	if err != nil {
		return err
	}
	if err := os.WriteFile(c.createdWithFile(), b, 0o644); err != nil {
		return fmt.Errorf("record the cluster's feature gates: %w", err)
	}
	return nil
}

// checkCreatedWith refuses an `up` of an existing cluster that asks for
// other feature gates or runtime config than it was created with: kwokctl
// sets them at creation only.
func (c *Cluster) checkCreatedWith() error {
	var was createdWith
	if b, err := os.ReadFile(c.createdWithFile()); err == nil {
		if err := yaml.Unmarshal(b, &was); err != nil {
			return fmt.Errorf("read %s: %w", c.createdWithFile(), err)
		}
	}
	if was.FeatureGates != c.opts.FeatureGates || was.RuntimeConfig != c.opts.RuntimeConfig {
		return fmt.Errorf("cluster %q was created with --feature-gates %q --runtime-config %q, not %q %q: they are set when a cluster is created; "+
			"run 'partita dev down --name %s' first, or give the other settings a cluster of another --name",
			c.opts.Name, was.FeatureGates, was.RuntimeConfig, c.opts.FeatureGates, c.opts.RuntimeConfig, c.opts.Name)
	}
	return nil
}
