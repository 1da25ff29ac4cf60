package main

import (
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/partita-dev/partita/console"
	"github.com/partita-dev/partita/ctl"
	"github.com/partita-dev/partita/dra"
	"github.com/partita-dev/partita/internal/clientscheme"
	"github.com/partita-dev/partita/internal/gomemlimit"
)

// consoleFlags are `partita console`'s own flags; the connection flags are
// kubectl's (ctl.Connection).
type consoleFlags struct {
	mode                 string
	addr                 string
	partitaNamespace     string
	topologyKey          string
	gpuDeviceClasses     []string
	webhookConfiguration string
	prometheusURL        string
	sampleInterval       time.Duration
	history              time.Duration
	accessTTL            time.Duration
	maxUsers             int
	tlsCert, tlsKey      string
	tokenFile            string
	tokenAudiences       []string
	proxyCA              string
	proxyNames           []string
	proxyUserHeaders     []string
	proxyGroupHeaders    []string
	proxyExtraPrefixes   []string
	verbosity            int
}

// newConsoleCommand is `partita console`, and `kubectl partita console`
// under the ctl tree, where conn is the tree's (its flags are the tree's
// persistent flags). conn nil: the command binds its own.
func newConsoleCommand(conn *ctl.Connection) *cobra.Command {
	f := &consoleFlags{}
	own := conn == nil
	if own {
		conn = ctl.NewConnection()
	}
	cmd := &cobra.Command{
		Use:   "console",
		Short: "The Partita console: a web UI of the GPUs, queues and workloads, within your permissions",
		Long: `Serves the Partita console: the workload map (every GPU and its slices), the
queues against quota and fair share, every workload with why it waits,
utilisation over time and the policy in force, with the few actions you need
(edit queues, delete or suspend a workload, submit a small one).

By default (--mode local) it runs on your machine with your kubeconfig, on
127.0.0.1, and prints the URL it serves on its first line: open it in a
browser. Every call it makes is made with your own credentials, so you see
what your RBAC allows and no more. The URL carries a random token that keeps
out other users of this machine.

--mode shared is how the chart runs it (console.enabled=true): behind a
Service, it authenticates each request (a bearer token, checked with a
TokenReview, or the headers of an authenticating proxy whose client
certificate it verifies) and acts as that user by impersonation.

See docs/guide/console.md.`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if fl := cmd.Flags().Lookup("output"); fl != nil && fl.Changed {
				return errors.New("console has no -o/--output: it serves a web page and a JSON API (/api/v1)")
			}
			return runConsole(cmd, conn, f)
		},
	}
	fs := cmd.Flags()
	if own {
		conn.AddFlags(fs)
	}
	fs.StringVar(&f.mode, "mode", string(console.ModeLocal), "local: on your machine with your kubeconfig, on loopback; shared: in the cluster for many users (the chart), authenticating each request and impersonating its caller")
	fs.StringVar(&f.addr, "addr", "127.0.0.1:0", "address to serve on (port 0: any free port); in local mode a loopback address")
	fs.StringVar(&f.partitaNamespace, "partita-namespace", "partita-system", "namespace Partita runs in: its policy ConfigMaps and their events")
	fs.StringVar(&f.topologyKey, "topology-key", console.DefaultTopologyKey, "node label whose values group the map's nodes (empty: no grouping)")
	fs.StringSliceVar(&f.gpuDeviceClasses, "gpu-device-classes", dra.DefaultGPUClasses, "DeviceClasses whose devices are GPUs, for pods that ask through ResourceClaims (set it to the extender's --gpu-device-classes; the chart does)")
	fs.StringVar(&f.webhookConfiguration, "webhook-configuration", "partita", "the webhook's MutatingWebhookConfiguration, whose endpoints are scraped for denials when there is no Prometheus")
	fs.StringVar(&f.prometheusURL, "prometheus-url", "", "Prometheus that scrapes Partita's components: utilisation history and denials come from it (empty: the console samples its own history)")
	fs.DurationVar(&f.sampleInterval, "sample-interval", 15*time.Second, "how often the console samples allocation for its own history")
	fs.DurationVar(&f.history, "history", 6*time.Hour, "how long the console keeps its own samples")
	fs.DurationVar(&f.accessTTL, "access-cache-ttl", 20*time.Second, "how long answers of access reviews and token reviews are kept")
	fs.IntVar(&f.maxUsers, "max-users", 512, "shared mode: users whose clients and reviews are cached at once")
	fs.StringVar(&f.tokenFile, "token-file", "", "local mode: keep the URL's token in this file (made with mode 0600 if missing), so that the console started again serves the same URL; empty: a new token each start")
	fs.StringVar(&f.tlsCert, "tls-cert-file", "", "shared mode: serving certificate (empty: self-signed at start)")
	fs.StringVar(&f.tlsKey, "tls-key-file", "", "shared mode: serving certificate's key")
	fs.StringSliceVar(&f.tokenAudiences, "token-audiences", nil, "shared mode: audiences bearer tokens must carry (empty: the API server's)")
	fs.StringVar(&f.proxyCA, "proxy-client-ca-file", "", "shared mode: CA of the authenticating proxy's client certificate; identity headers are read only from a connection with a certificate it signed")
	fs.StringSliceVar(&f.proxyNames, "proxy-allowed-names", nil, "shared mode: common names the proxy's certificate may have (empty: any the CA signed)")
	fs.StringSliceVar(&f.proxyUserHeaders, "proxy-username-headers", []string{"X-Remote-User"}, "shared mode: headers the proxy puts the user name in")
	fs.StringSliceVar(&f.proxyGroupHeaders, "proxy-group-headers", []string{"X-Remote-Group"}, "shared mode: headers the proxy puts the groups in")
	fs.StringSliceVar(&f.proxyExtraPrefixes, "proxy-extra-headers-prefix", []string{"X-Remote-Extra-"}, "shared mode: header prefixes of the user's extra information")
	fs.IntVar(&f.verbosity, "v", 0, "log verbosity")
	return cmd
}

func runConsole(cmd *cobra.Command, conn *ctl.Connection, f *consoleFlags) error {
	log := textlogger.NewLogger(textlogger.NewConfig(textlogger.Verbosity(f.verbosity), textlogger.Output(cmd.ErrOrStderr())))
	// A container with a memory limit: the garbage collector works harder near it.
	_, _ = gomemlimit.Set(log, "")
	klog.SetLogger(log)
	ctrllog.SetLogger(log)
	ctx := logr.NewContext(cmd.Context(), log)
	mode := console.Mode(f.mode)
	switch mode {
	case console.ModeLocal:
		if err := console.CheckLocalAddr(f.addr); err != nil {
			return err
		}
	case console.ModeShared:
	default:
		return fmt.Errorf("--mode %q: want local or shared", f.mode)
	}
	if mode == console.ModeLocal {
		for _, name := range []string{"tls-cert-file", "tls-key-file", "token-audiences", "proxy-client-ca-file", "proxy-allowed-names", "max-users"} {
			if cmd.Flags().Changed(name) {
				return fmt.Errorf("--%s is for --mode shared; a local console authenticates with the token in its URL", name)
			}
		}
	}
	if mode == console.ModeShared && cmd.Flags().Changed("token-file") {
		return errors.New("--token-file is for --mode local; a shared console authenticates each request with the caller's own token")
	}
	if f.proxyCA == "" {
		for _, name := range []string{"proxy-allowed-names", "proxy-username-headers", "proxy-group-headers", "proxy-extra-headers-prefix"} {
			if cmd.Flags().Changed(name) {
				return fmt.Errorf("--%s needs --proxy-client-ca-file: without the proxy's CA the console trusts no identity headers", name)
			}
		}
	}
	cfg, err := conn.RESTConfig()
	if err != nil {
		return err
	}
	ns, err := conn.Namespace()
	if err != nil {
		return err
	}
	scheme, err := clientscheme.New()
	if err != nil {
		return err
	}
	c := console.Config{
		Mode: mode, Rest: cfg, Scheme: scheme, Addr: f.addr, DefaultNamespace: ns,
		PartitaNamespace: f.partitaNamespace, TopologyKey: f.topologyKey, GPUClasses: f.gpuDeviceClasses, WebhookConfiguration: f.webhookConfiguration,
		PrometheusURL: f.prometheusURL, SampleInterval: f.sampleInterval, History: f.history, AccessTTL: f.accessTTL,
		MaxUsers: f.maxUsers, TLSCertFile: f.tlsCert, TLSKeyFile: f.tlsKey, TokenAudiences: f.tokenAudiences, Log: log,
	}
	if f.tokenFile != "" {
		if c.Token, err = console.LocalToken(f.tokenFile); err != nil {
			return err
		}
	}
	if f.proxyCA != "" {
		pem, err := os.ReadFile(f.proxyCA)
		if err != nil {
			return fmt.Errorf("--proxy-client-ca-file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("--proxy-client-ca-file %s holds no PEM certificate", f.proxyCA)
		}
		c.Proxy = &console.ProxyOptions{ClientCA: pool, AllowedNames: f.proxyNames, UsernameHeaders: f.proxyUserHeaders,
			GroupHeaders: f.proxyGroupHeaders, ExtraHeaderPrefixes: f.proxyExtraPrefixes}
	}
	inst, err := console.Start(ctx, c)
	if err != nil {
		return err
	}
	// The URL is the first line of stdout: scripts (and make demo) read it.
	if _, err := fmt.Fprintln(cmd.OutOrStdout(), inst.URL); err != nil {
		return err
	}
	log.Info("Serving the Partita console", "mode", mode, "addr", inst.Addr.String())
	return inst.Wait()
}
