package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
	"k8s.io/utils/clock"
	crcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/internal/version"
	"github.com/partita-dev/partita/models/cache"
	"github.com/partita-dev/partita/models/csi"
	"github.com/partita-dev/partita/models/fetch"
	"github.com/partita-dev/partita/models/node"
	"github.com/partita-dev/partita/models/peer"
	"github.com/partita-dev/partita/nodeagent"
)

type modelCacheFlags struct {
	kubeconfig  string
	nodeName    string
	kubeletDir  string
	cacheDir    string
	cacheSize   string
	stateDir    string
	fileRoots   []string
	chunkSize   string
	concurrency int
	buffers     int
	healthAddr  string
	verbosity   int
	peerAddr    string
	podIP       string
	peerToken   string
	peerAccount string
	// simulateNodes is fleet mode's node selector.
	simulateNodes string
}

func newModelCacheCommand() *cobra.Command {
	f := &modelCacheFlags{}
	cmd := &cobra.Command{
		Use:   "model-cache",
		Short: "Run a node's model cache: the CSI node plugin that serves Models to pods at /models/NAME",
		Long: `model-cache runs on every node (a container of the agent's DaemonSet, privileged
to mount). The kubelet calls it, as the CSI driver ` + v1alpha1.ModelCSIDriver + `, for each
model volume the webhook gives a pod that asks for partita.dev/model: it fetches
the Model's files once into the node's cache (concurrent ranged reads, resumed
after a restart, every file checksummed, safetensors headers validated), and
bind-mounts them read-only into the pod, which starts only then. It reports the
node's copy in the Model's status (status.nodes). See docs/models.md.

--simulate-nodes is for a dev cluster's simulated nodes, which run no kubelet:
one process fetches, verifies and reports the models that the admission loop
or spec.prefetch asks of each node the selector matches, as a real node's
cache would, without mounting anything.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runModelCache(cmd, f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig file; empty means $KUBECONFIG, ~/.kube/config or the in-cluster config")
	fl.StringVar(&f.nodeName, "node-name", os.Getenv("NODE_NAME"), "the node this cache serves (default $NODE_NAME, else the host name)")
	fl.StringVar(&f.kubeletDir, "kubelet-dir", csi.DefaultKubeletDir, "the kubelet's root directory: the plugin registers in plugins_registry/ and serves in plugins/"+v1alpha1.ModelCSIDriver+"/")
	fl.StringVar(&f.cacheDir, "cache-dir", "/var/lib/partita-models/cache", "the node's model cache directory (apart from /var/lib/partita, which only Partita's own node components may mount)")
	fl.StringVar(&f.cacheSize, "cache-size", "100Gi", "the most bytes the cache holds; the least recently used models no pod uses are evicted to make room")
	fl.StringVar(&f.stateDir, "state-dir", "/var/lib/partita-models/state", "directory that keeps the published volumes (their pins) across restarts")
	fl.StringSliceVar(&f.fileRoots, "file-roots", nil, "the node's directories that file:// Models may name (comma-separated); none refuses file:// sources")
	fl.StringVar(&f.chunkSize, "chunk-size", "8Mi", "the length of one ranged read")
	fl.IntVar(&f.concurrency, "concurrency", fetch.DefaultConcurrency, "ranged reads in flight per file")
	fl.IntVar(&f.buffers, "buffers", 16, "chunk buffers shared by every fetch on the node: streaming holds at most buffers × chunk-size bytes in memory")
	fl.StringVar(&f.healthAddr, "health-addr", ":8083", "address of the /metrics, /healthz and /readyz endpoints")
	fl.StringVar(&f.peerAddr, "peer-addr", ":8484", "address of the HTTPS server other nodes' caches fetch this node's models from; empty serves no peer")
	fl.StringVar(&f.podIP, "pod-ip", os.Getenv("POD_IP"), "the address peers reach --peer-addr at (default $POD_IP)")
	fl.StringVar(&f.peerToken, "peer-token-file", "", "a ServiceAccount token of audience "+peer.Audience+" (a projected volume) presented to other nodes' caches, to fetch models from them before their source; empty fetches from sources only")
	fl.StringVar(&f.peerAccount, "peer-service-account", "", "the username peers' tokens must have, system:serviceaccount:NAMESPACE:NAME of the model caches; required with --peer-addr")
	fl.StringVar(&f.simulateNodes, "simulate-nodes", "", "fleet mode, for simulated nodes (kwok's), which run no kubelet: one process takes up the prefetch requests of every node this label selector matches, each node with a cache of its own under --cache-dir/NODE (and state under --state-dir/NODE); it serves no CSI and no peers (default selector "+v1alpha1.LabelGPUNode+"=true; give a value with --simulate-nodes=SELECTOR)")
	fl.Lookup("simulate-nodes").NoOptDefVal = v1alpha1.LabelGPUNode + "=true"
	fl.IntVarP(&f.verbosity, "v", "v", 0, "log verbosity (1 logs every failed CSI call)")
	return cmd
}

func runModelCache(cmd *cobra.Command, f *modelCacheFlags) error {
	log := textlogger.NewLogger(textlogger.NewConfig(textlogger.Verbosity(f.verbosity), textlogger.Output(cmd.ErrOrStderr())))
	klog.SetLogger(log)
	ctx := logr.NewContext(cmd.Context(), log)
	size, err := resource.ParseQuantity(f.cacheSize)
	if err != nil || size.Value() <= 0 {
		return fmt.Errorf("--cache-size %q: want a positive quantity such as 200Gi", f.cacheSize)
	}
	chunk, err := resource.ParseQuantity(f.chunkSize)
	if err != nil || chunk.Value() < 64<<10 || chunk.Value() > 256<<20 {
		return fmt.Errorf("--chunk-size %q: want a quantity from 64Ki to 256Mi", f.chunkSize)
	}
	if f.concurrency < 1 || f.buffers < 1 {
		return fmt.Errorf("--concurrency %d, --buffers %d: want at least 1 each", f.concurrency, f.buffers)
	}
	for i, r := range f.fileRoots {
		if r = strings.TrimSpace(r); !strings.HasPrefix(r, "/") {
			return fmt.Errorf("--file-roots %q: want absolute directories", r)
		}
		f.fileRoots[i] = r
	}
	var fleet labels.Selector
	if f.simulateNodes != "" {
		if fleet, err = labels.Parse(f.simulateNodes); err != nil {
			return fmt.Errorf("--simulate-nodes %q: %w", f.simulateNodes, err)
		}
		for _, name := range []string{"node-name", "kubelet-dir", "peer-token-file", "peer-service-account", "pod-ip"} {
			if cmd.Flags().Changed(name) {
				return fmt.Errorf("--%s: the fleet of simulated nodes (--simulate-nodes) has no kubelet and serves no peers; leave it out", name)
			}
		}
		if cmd.Flags().Changed("peer-addr") && f.peerAddr != "" {
			return errors.New("--peer-addr: the fleet of simulated nodes (--simulate-nodes) serves no peers; leave it out")
		}
		f.peerAddr = ""
	}
	if f.nodeName == "" && fleet == nil {
		if f.nodeName, err = os.Hostname(); err != nil {
			return fmt.Errorf("find the node name (set --node-name): %w", err)
		}
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = f.kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return fmt.Errorf("load kubeconfig: %w", err)
	}
	cfg.UserAgent = "partita-model-cache/" + version.Get()
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return err
	}
	cl, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return fmt.Errorf("create client: %w", err)
	}

	if f.peerAddr != "" && (f.peerAccount == "" || f.podIP == "") {
		return errors.New("--peer-addr serves peers: set --peer-service-account (the model caches' ServiceAccount, system:serviceaccount:NS:NAME) and --pod-ip (or $POD_IP), or --peer-addr= to serve none")
	}
	reg := prometheus.NewRegistry()
	metrics := node.NewMetrics(reg)
	fetchOpts := fetch.Options{
		ChunkSize:   chunk.Value(),
		Concurrency: f.concurrency,
		Pool:        fetch.NewPool(f.buffers, int(chunk.Value())),
	}
	if fleet != nil {
		return runModelCacheFleet(ctx, f, cfg, scheme, cl, fleet, size.Value(), fetchOpts, reg, metrics)
	}
	var svc *node.Service
	c, err := cache.New(f.cacheDir, size.Value(), cache.WithLogger(log.WithName("cache")), cache.WithOnEvict(func(key string) {
		if svc != nil {
			svc.Evicted(key)
		}
	}))
	if err != nil {
		return err
	}
	var self *v1alpha1.ModelPeer
	var peerCert tls.Certificate
	if f.peerAddr != "" {
		_, port, err := net.SplitHostPort(f.peerAddr)
		if err != nil {
			return fmt.Errorf("--peer-addr %q: %w", f.peerAddr, err)
		}
		cert, sum, err := peer.Certificate(f.podIP)
		if err != nil {
			return fmt.Errorf("make the peer server's certificate: %w", err)
		}
		peerCert = cert
		self = &v1alpha1.ModelPeer{URL: "https://" + net.JoinHostPort(f.podIP, port), CertSHA256: sum}
	}
	var peerToken func() (string, error)
	if f.peerToken != "" {
		peerToken = func() (string, error) {
			b, err := os.ReadFile(f.peerToken)
			return strings.TrimSpace(string(b)), err
		}
	}
	svc, err = node.New(ctx, node.Config{
		Peer:       self,
		PeerToken:  peerToken,
		NodeName:   f.nodeName,
		Cache:      c,
		Client:     cl,
		StateDir:   f.stateDir,
		FileRoots:  f.fileRoots,
		Fetch:      fetchOpts,
		HTTPClient: &http.Client{Timeout: 5 * time.Minute},
		Log:        log.WithName("models"),
		Metrics:    metrics,
	})
	if err != nil {
		return err
	}
	// Prefetch requests (a Pending entry for this node in a Model's status,
	// written when a workload is admitted here) start a fill at once.
	informers, err := crcache.New(cfg, crcache.Options{Scheme: scheme, DefaultTransform: crcache.TransformStripManagedFields()})
	if err != nil {
		return fmt.Errorf("create Model informer: %w", err)
	}
	if err := onModels(ctx, informers, func(m *v1alpha1.Model) {
		if svc.WantsPrefetch(m) {
			go svc.Prefetch(ctx, m.DeepCopy())
		}
	}); err != nil {
		return err
	}
	srv := csi.NewServer(f.nodeName, version.Get(), svc, nil, log.WithName("csi"))
	log.Info("Model cache", "node", f.nodeName, "dir", f.cacheDir, "size", size.String(), "fileRoots", f.fileRoots)

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return nodeagent.Serve(gctx, f.healthAddr, modelCacheMux(reg)) })
	g.Go(func() error { return csi.Serve(gctx, srv, f.kubeletDir, log.WithName("csi")) })
	g.Go(func() error { return informers.Start(gctx) })
	if self != nil {
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return fmt.Errorf("create client: %w", err)
		}
		ps := &peer.Server{Cache: c, Log: log.WithName("peers"),
			Auth:   &peer.TokenReviewer{Client: cs.AuthenticationV1(), Allowed: f.peerAccount, Clock: clock.RealClock{}},
			Served: func(n int64) { metrics.ServedBytes.Add(float64(n)) }}
		log.Info("Serving peers", "url", self.URL, "certSHA256", self.CertSHA256)
		g.Go(func() error { return servePeers(gctx, f.peerAddr, peerCert, ps) })
	}
	if err := g.Wait(); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// onModels calls fn with every Model added or updated (prefetch requests
// arrive as updates of a Model's status).
func onModels(ctx context.Context, informers crcache.Cache, fn func(*v1alpha1.Model)) error {
	inf, err := informers.GetInformer(ctx, &v1alpha1.Model{})
	if err != nil {
		return fmt.Errorf("get Model informer: %w", err)
	}
	handle := func(obj any) {
		if m, ok := obj.(*v1alpha1.Model); ok {
			fn(m)
		}
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    handle,
		UpdateFunc: func(_, obj any) { handle(obj) },
	}); err != nil {
		return fmt.Errorf("watch Models: %w", err)
	}
	return nil
}

// modelCacheMux serves the cache's metrics and health.
func modelCacheMux(reg *prometheus.Registry) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	ok := func(w http.ResponseWriter, _ *http.Request) { _, _ = fmt.Fprintln(w, "ok") }
	mux.HandleFunc("/healthz", ok)
	mux.HandleFunc("/readyz", ok)
	return mux
}

// runModelCacheFleet serves the prefetch requests of the simulated nodes
// that sel matches (node.Fleet), each node with a cache of its own under
// --cache-dir/NODE, until ctx ends. The size limit is each node's.
func runModelCacheFleet(ctx context.Context, f *modelCacheFlags, cfg *rest.Config, scheme *runtime.Scheme, cl client.Client,
	sel labels.Selector, size int64, fetchOpts fetch.Options, reg *prometheus.Registry, metrics *node.Metrics) error {
	log := logr.FromContextOrDiscard(ctx)
	if err := corev1.AddToScheme(scheme); err != nil {
		return err
	}
	informers, err := crcache.New(cfg, crcache.Options{Scheme: scheme, DefaultTransform: crcache.TransformStripManagedFields(),
		ByObject: map[client.Object]crcache.ByObject{&corev1.Node{}: {Label: sel}}})
	if err != nil {
		return fmt.Errorf("create informers: %w", err)
	}
	if _, err := informers.GetInformer(ctx, &corev1.Node{}); err != nil {
		return fmt.Errorf("watch Nodes: %w", err)
	}
	httpClient := &http.Client{Timeout: 5 * time.Minute}
	fl := &node.Fleet{
		Log: log.WithName("fleet"),
		Serves: func(ctx context.Context, name string) bool {
			return informers.Get(ctx, client.ObjectKey{Name: name}, &corev1.Node{}) == nil
		},
		NewService: func(ctx context.Context, name string) (*node.Service, error) {
			var svc *node.Service
			c, err := cache.New(filepath.Join(f.cacheDir, name), size, cache.WithLogger(log.WithName("cache").WithValues("node", name)),
				cache.WithOnEvict(func(key string) {
					if svc != nil {
						svc.Evicted(key)
					}
				}))
			if err != nil {
				return nil, err
			}
			svc, err = node.New(ctx, node.Config{NodeName: name, Cache: c, Client: cl, StateDir: filepath.Join(f.stateDir, name),
				FileRoots: f.fileRoots, Fetch: fetchOpts, HTTPClient: httpClient, Log: log.WithName("models").WithValues("node", name), Metrics: metrics})
			return svc, err
		},
	}
	if err := onModels(ctx, informers, func(m *v1alpha1.Model) { fl.Prefetch(ctx, m) }); err != nil {
		return err
	}
	log.Info("Model caches of simulated nodes", "selector", sel.String(), "dir", f.cacheDir, "sizePerNode", size, "fileRoots", f.fileRoots)
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return nodeagent.Serve(gctx, f.healthAddr, modelCacheMux(reg)) })
	g.Go(func() error { return informers.Start(gctx) })
	if err := g.Wait(); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// servePeers serves ps over TLS on addr until ctx ends.
func servePeers(ctx context.Context, addr string, cert tls.Certificate, ps *peer.Server) error {
	l, err := tls.Listen("tcp", addr, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13})
	if err != nil {
		return fmt.Errorf("listen on %s: %w", addr, err)
	}
	srv := &http.Server{Handler: ps, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve peers on %s: %w", addr, err)
	}
	return nil
}
