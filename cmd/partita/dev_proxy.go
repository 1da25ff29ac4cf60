package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"k8s.io/klog/v2/textlogger"

	"github.com/partita-dev/partita/devcluster"
	"github.com/partita-dev/partita/devcluster/tcpproxy"
)

// devProxyFlags are the flags of `partita dev extender-proxy`.
type devProxyFlags struct {
	listen        string
	backends      []string
	probeCAFile   string
	probeInterval time.Duration
	verbosity     int
}

// newDevExtenderProxyCommand is the dev cluster's stand-in for the
// extender's Service (devExtenderProxy runs it): hidden, as only dev up
// runs it.
func newDevExtenderProxyCommand() *cobra.Command {
	f := &devProxyFlags{}
	cmd := &cobra.Command{
		Use:    "extender-proxy",
		Short:  "Forward kube-scheduler's connections to the dev cluster's extender replicas, the leader first (run by dev up)",
		Hidden: true,
		Long: `Accept TCP connections on --listen and forward each, bytes only (TLS and
kube-scheduler's client certificate stay end to end), to the first
--backend that accepts it: every second each backend's /readyz and /metrics
are read over HTTPS, and the leader (partita_extender_leader 1) is tried
first, then the other ready replicas, then the rest. A replica that is
down is skipped. Only the leader binds; a follower answers bind with an
error and closes the connection, so kube-scheduler's retry reaches the
leader through this proxy.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := textlogger.NewLogger(textlogger.NewConfig(textlogger.Verbosity(f.verbosity), textlogger.Output(cmd.ErrOrStderr())))
			return runDevExtenderProxy(logr.NewContext(cmd.Context(), log), f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.listen, "listen", "", "address to accept kube-scheduler's connections on (host:port)")
	fl.StringArrayVar(&f.backends, "backend", nil, "an extender replica's address (host:port), in order of preference among equals; repeat for each")
	fl.StringVar(&f.probeCAFile, "probe-ca-file", "", "CA to verify the replicas' serving certificates with when probing them, read at every probe; empty skips verification")
	fl.DurationVar(&f.probeInterval, "probe-interval", time.Second, "how often each replica is probed")
	fl.IntVarP(&f.verbosity, "v", "v", 0, "log verbosity (1 logs connections no replica took, 2 every replica that refused one, 4 every connection)")
	return cmd
}

func runDevExtenderProxy(ctx context.Context, f *devProxyFlags) error {
	log := logr.FromContextOrDiscard(ctx)
	if f.listen == "" || len(f.backends) == 0 {
		return errors.New("set --listen and at least one --backend")
	}
	if f.probeInterval <= 0 {
		return fmt.Errorf("--probe-interval %s: want a positive duration", f.probeInterval)
	}
	p, err := tcpproxy.New(f.backends, tcpproxy.WithLogger(log), tcpproxy.WithProbe(extenderProbe(f.probeCAFile), f.probeInterval))
	if err != nil {
		return err
	}
	l, err := net.Listen("tcp", f.listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", f.listen, err)
	}
	log.Info("Forwarding to the extender's replicas", "listen", l.Addr().String(), "backends", f.backends)
	return p.Serve(ctx, l)
}

// extenderProbe says what a replica is: Preferred when it is ready and
// leads, Ready when it is ready, else NotReady. The CA is read at every
// probe, so that certificates dev up renews are trusted without a restart.
func extenderProbe(caFile string) tcpproxy.Probe {
	return func(ctx context.Context, backend string) tcpproxy.State {
		tlsConfig := &tls.Config{MinVersion: tls.VersionTLS12}
		if caFile == "" {
			tlsConfig.InsecureSkipVerify = true //nolint:gosec // loopback probe of our own replicas, asked for with an empty --probe-ca-file
		} else {
			pem, err := os.ReadFile(caFile)
			if err != nil {
				return tcpproxy.NotReady
			}
			tlsConfig.RootCAs = x509.NewCertPool()
			tlsConfig.RootCAs.AppendCertsFromPEM(pem)
		}
		// A client per probe: connections are not kept between probes, so
		// a restarted replica is seen as it is now.
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsConfig, DisableKeepAlives: true}}
		// An error after /readyz (metrics without the leader gauge)
		// leaves it ready, not preferred.
		ready, leader, _ := devcluster.ProbeExtender(ctx, hc, backend)
		switch {
		case !ready:
			return tcpproxy.NotReady
		case leader:
			return tcpproxy.Preferred
		default:
			return tcpproxy.Ready
		}
	}
}
