package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/partita-dev/partita/admission"
	"github.com/partita-dev/partita/admission/claims"
	"github.com/partita-dev/partita/admission/workloadmap"
	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/devcluster"
	"github.com/partita-dev/partita/dra"
	"github.com/partita-dev/partita/extender"
	"github.com/partita-dev/partita/gpu"
	"github.com/partita-dev/partita/gpu/ledgerfeed"
	"github.com/partita-dev/partita/internal/clientscheme"
	"github.com/partita-dev/partita/internal/gomemlimit"
	"github.com/partita-dev/partita/internal/podtrim"
	"github.com/partita-dev/partita/models/locate"
	"github.com/partita-dev/partita/models/podcondition"
	"github.com/partita-dev/partita/models/prefetch"
	"github.com/partita-dev/partita/models/summary"
	"github.com/partita-dev/partita/policy"
)

// extenderFlags are the flags of `partita extender`.
type extenderFlags struct {
	kubeconfig        string
	impersonateUser   string
	impersonateGroups []string
	addr              string
	certDir           string
	clientCAFile      string
	clientNames       []string
	debugEndpoints    bool
	leaderElect       bool
	leaseNamespace    string
	leaseName         string
	leaseDuration     time.Duration
	renewDeadline     time.Duration
	retryPeriod       time.Duration
	replicaName       string
	placement         string
	assumeTTL         time.Duration
	heartbeatTimeout  time.Duration
	maxRequestBytes   int64
	qps               float32
	burst             int
	profiling         bool
	memoryLimit       string
	onLostLeadership  string
	verbosity         int

	admission        bool
	admitter         admission.AdmitterOptions
	gpuDeviceClasses []string
	policyNamespace  string
	implicitJobGangs bool

	printConfig bool
	config      extender.SchedulerConfigOptions
}

func newExtenderCommand() *cobra.Command {
	ns := os.Getenv("POD_NAMESPACE")
	if ns == "" {
		ns = defaultPartitaNamespace
	}
	def := extender.DefaultSchedulerConfigOptions()
	f := &extenderFlags{leaseNamespace: ns, policyNamespace: ns, config: def, admitter: admission.DefaultAdmitterOptions()}
	cmd := &cobra.Command{
		Use:   "extender",
		Short: "Serve the kube-scheduler extender: device-level filter, prioritize, bind and preempt for GPU pods",
		Long: `Serve kube-scheduler's HTTP extender verbs (/filter, /prioritize, /bind,
/preempt) with /metrics, /healthz and /readyz. The GPU ledger is built from
GPUNodes and pods through informers, so a restarted extender picks up where
the last one stopped. Every replica answers filter and prioritize; only the
elected leader binds (others answer bind with an error, and kube-scheduler
retries).

HTTPS only. --cert-dir holds the serving certificate (tls.crt, tls.key),
reloaded when it changes. The verbs (and /debug/*) answer only kube-scheduler:
a client certificate signed by the CA in --client-ca-file (re-read when it
changes) whose common name is in --client-allowed-names; a caller without one
gets 401, one of another name 403, and one of another CA fails the
handshake. /healthz, /readyz and /metrics answer without a certificate.
/debug/ledger is served only with --debug-endpoints, /debug/pprof/ only with
--profiling.

Bind binds only pods that request partita.dev/gpu-milli, and only to a node
they may run on (it exists, matches their nodeSelector and required node
affinity, has no taint they do not tolerate, is not cordoned, is the node the
admission loop pinned them to), whoever asks.

--print-scheduler-config prints the KubeSchedulerConfiguration that wires the
extender in (kube-scheduler --config) and exits.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if f.printConfig {
				b, err := extender.SchedulerConfig(f.config)
				if err != nil {
					return err
				}
				_, err = cmd.OutOrStdout().Write(b)
				return err
			}
			return runExtender(cmd, f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig file; empty means $KUBECONFIG, ~/.kube/config or the in-cluster config")
	fl.StringVar(&f.impersonateUser, "as", "", "user to impersonate for every API request (the dev cluster binds as Partita's service account)")
	fl.StringSliceVar(&f.impersonateGroups, "as-group", nil, "groups to impersonate, with --as")
	fl.StringVar(&f.addr, "addr", ":8443", "address to serve the extender on")
	fl.StringVar(&f.certDir, "cert-dir", "", "directory with the serving certificate, tls.crt and tls.key (required)")
	fl.StringVar(&f.clientCAFile, "client-ca-file", "", "CA bundle that kube-scheduler's client certificate must be signed by (required); only callers with such a certificate reach the verbs")
	fl.StringSliceVar(&f.clientNames, "client-allowed-names", []string{extender.DefaultClientName}, "common names of the client certificates accepted; empty accepts any certificate the --client-ca-file CA signed")
	fl.BoolVar(&f.debugEndpoints, "debug-endpoints", false, "serve /debug/ledger (the ledger checked against its invariants), to kube-scheduler's client certificate only")
	fl.BoolVar(&f.leaderElect, "leader-elect", true, "elect a leader among replicas; only the leader binds")
	fl.StringVar(&f.leaseNamespace, "leader-election-namespace", f.leaseNamespace, "namespace of the leader election Lease (default $POD_NAMESPACE, else "+defaultPartitaNamespace+")")
	fl.StringVar(&f.leaseName, "leader-election-id", extender.DefaultLeaseName, "name of the leader election Lease")
	// controller-runtime's defaults; the dev cluster's replicas take
	// shorter ones, so that its tests see a killed leader replaced quickly.
	fl.DurationVar(&f.leaseDuration, "leader-election-lease-duration", 15*time.Second, "how long after the leader's last renewal another replica may take the Lease: how long binds wait when the leader dies without giving it up")
	fl.DurationVar(&f.renewDeadline, "leader-election-renew-deadline", 10*time.Second, "how long the leader keeps trying to renew the Lease before it stops leading (and exits); below --leader-election-lease-duration")
	fl.DurationVar(&f.retryPeriod, "leader-election-retry-period", 2*time.Second, "how often each replica tries to take or renew the Lease")
	fl.StringVar(&f.onLostLeadership, "on-lost-leadership", lostLeadershipExit, "what a leader does when it cannot renew its Lease in time: "+lostLeadershipExit+" (the process ends with an error, for a supervisor that starts it again: the kubelet, systemd) or "+lostLeadershipRestart+" (it starts itself again in place, same pid, and comes back as a standby: for a host with no supervisor, as the dev cluster runs it)")
	fl.StringVar(&f.replicaName, "replica-name", "", "this replica's name, which starts its identity in the Lease (<name>_<random>) so that the Lease says which replica leads; empty: the host name (a pod's name), as controller-runtime names it")
	fl.StringVar(&f.placement, "placement", string(gpu.PlacementBinpack), "device placement for pods that do not choose one with "+v1alpha1.AnnotationPlacement+": binpack or spread")
	fl.DurationVar(&f.assumeTTL, "assume-ttl", extender.DefaultAssumeTTL, "how long a GPU assignment may wait to show on its pod before it is checked and, if the pod is unbound, dropped")
	fl.DurationVar(&f.heartbeatTimeout, "agent-heartbeat-timeout", admission.DefaultAgentHeartbeatTimeout, "a node whose agent has written no new GPUNode heartbeat for this long takes no new GPU pods (filter, bind and the admission loop say why) until it reports again; keep it well above the agents' --heartbeat-interval")
	fl.Int64Var(&f.maxRequestBytes, "max-request-bytes", extender.DefaultMaxRequestBytes, "largest request body accepted; larger ones get 413")
	fl.Float32Var(&f.qps, "kube-api-qps", def.QPS, "the most API requests per second, sustained (as kube-scheduler's, see --scheduler-qps)")
	fl.IntVar(&f.burst, "kube-api-burst", int(def.Burst), "the most API requests in a burst")
	fl.BoolVar(&f.profiling, "profiling", false, "serve Go's profiler at /debug/pprof/ on --addr, to kube-scheduler's client certificate only")
	fl.StringVar(&f.memoryLimit, "memory-limit", "", "the Go runtime's soft memory limit (e.g. 900Mi); empty: 90% of the container's memory limit, if it has one, unless GOMEMLIMIT is set")
	fl.IntVarP(&f.verbosity, "v", "v", 0, "log verbosity (2 logs every bind, 3 every filter, 4 every node)")
	fl.StringSliceVar(&f.gpuDeviceClasses, "gpu-device-classes", dra.DefaultGPUClasses, "DeviceClasses whose devices are GPUs: a pod that asks for them through ResourceClaims (its own, from templates, or an extended resource the class backs) is a GPU pod of its queue, charged 1 GPU per device (its share once allocated)")
	fl.BoolVar(&f.admission, "admission", true, "run the queue and gang admission loop on the leader: it admits pods gated with "+v1alpha1.SchedulingGateAdmission)
	fl.DurationVar(&f.admitter.ScheduleTimeout, "schedule-timeout", f.admitter.ScheduleTimeout, "how long an admitted gang may take to bind fully when its PodGroup sets no scheduleTimeoutSeconds")
	fl.DurationVar(&f.admitter.RefusedPinTimeout, "refused-pin-timeout", f.admitter.RefusedPinTimeout, "how long kube-scheduler may refuse a gang member at the node the loop pinned it to before the loop evicts it to place it again (or requeues the gang when none of it runs), when that is sooner than the schedule timeout; 0 leaves it to the schedule timeout")
	fl.DurationVar(&f.admitter.PreemptMinRuntime, "preempt-min-runtime", f.admitter.PreemptMinRuntime, "a workload admitted less than this long ago is never evicted by reclaim or preemption")
	fl.BoolVar(&f.admitter.DisablePreemption, "disable-preemption", false, "never evict workloads to reclaim fair share or for higher priority")
	fl.DurationVar(&f.admitter.StarvationBound, "starvation-bound", f.admitter.StarvationBound, "once a queue's head of line has waited this long, the admission loop holds room for it: workloads behind it are admitted only where they do not take that room (0 turns it off)")
	fl.BoolVar(&f.implicitJobGangs, "implicit-job-gangs", false, "deprecated: makes every parallel Job a gang (the workload map's Job rule with data.partita.config.workloads.jobs = \"all\"); without it Indexed Jobs are gangs, and a rule in a policy ConfigMap scopes which Jobs are (docs/workloads.md)")
	_ = fl.MarkDeprecated("implicit-job-gangs", "the workload map's Job rule makes Indexed Jobs gangs by default; scope it with a rule in a policy ConfigMap (docs/workloads.md). The flag still makes every parallel Job a gang, for this release")
	fl.StringVar(&f.admitter.DefaultQueue, "default-queue", f.admitter.DefaultQueue, "the queue of GPU workloads whose pods and PodGroup name none (pods the webhook never gave one, e.g. from before it did); the webhook's --default-queue; empty admits them on free room alone")
	fl.DurationVar(&f.admitter.Interval, "admission-interval", f.admitter.Interval, "the longest wait between admission cycles while anything waits")
	fl.Float64Var(&f.admitter.Usage.Weight, "fair-share-usage-weight", 0, "how much each queue's past usage counts in fair share (KAI's kValue): over-quota weights w become max(0, w + weight×(w − usage)), usage being the queue's share of the cluster over the window; 0 (the default) turns time-based fair share off, 1 is KAI's default")
	fl.DurationVar(&f.admitter.Usage.HalfLife, "fair-share-usage-half-life", f.admitter.Usage.HalfLife, "with --fair-share-usage-weight: the age at which usage counts half; must be above 0")
	fl.DurationVar(&f.admitter.Usage.Window, "fair-share-usage-window", f.admitter.Usage.Window, "with --fair-share-usage-weight: how far back usage counts; at least one --admission-interval")
	fl.StringVar(&f.admitter.Usage.WindowType, "fair-share-usage-window-type", f.admitter.Usage.WindowType, "with --fair-share-usage-weight: sliding (always the last window) or tumbling (starts afresh every window, counted from Monday 00:00 UTC)")
	fl.StringVar(&f.policyNamespace, "policy-namespace", f.policyNamespace, "namespace of the ConfigMaps labelled "+v1alpha1.LabelPolicy+"=rego that override the quota policy (default $POD_NAMESPACE, else "+defaultPartitaNamespace+")")

	fl.BoolVar(&f.printConfig, "print-scheduler-config", false, "print the kube-scheduler configuration for this extender and exit")
	fl.StringVar(&f.config.URL, "extender-url", def.URL, "with --print-scheduler-config: the URL kube-scheduler reaches the extender at")
	fl.StringVar(&f.config.CAFile, "extender-ca-file", def.CAFile, "with --print-scheduler-config: CA file kube-scheduler verifies the extender's serving certificate with")
	fl.StringVar(&f.config.ClientCertFile, "extender-client-cert-file", def.ClientCertFile, "with --print-scheduler-config: kube-scheduler's client certificate, signed by the extender's --client-ca-file")
	fl.StringVar(&f.config.ClientKeyFile, "extender-client-key-file", def.ClientKeyFile, "with --print-scheduler-config: the key of that certificate")
	fl.StringVar(&f.config.ServerName, "extender-server-name", "", "with --print-scheduler-config: the name to verify the serving certificate for, when --extender-url's host is not one of its names (an IP address)")
	fl.Int64Var(&f.config.Weight, "scheduler-weight", def.Weight, "with --print-scheduler-config: weight of the extender's scores")
	fl.DurationVar(&f.config.HTTPTimeout, "scheduler-http-timeout", def.HTTPTimeout, "with --print-scheduler-config: kube-scheduler's timeout for each call")
	fl.Float32Var(&f.config.QPS, "scheduler-qps", def.QPS, "with --print-scheduler-config: kube-scheduler's client QPS")
	fl.Int32Var(&f.config.Burst, "scheduler-burst", def.Burst, "with --print-scheduler-config: kube-scheduler's client burst")
	fl.StringVar(&f.config.SchedulerName, "scheduler-name", "", "with --print-scheduler-config: profile name of a kube-scheduler beside the default one (e.g. partita); empty configures the default scheduler")
	fl.StringVar(&f.config.LeaseName, "scheduler-lease-name", "", "with --print-scheduler-config: name of that scheduler's leader election Lease (with --scheduler-lease-namespace)")
	fl.StringVar(&f.config.LeaseNamespace, "scheduler-lease-namespace", "", "with --print-scheduler-config: namespace of that Lease")
	return cmd
}

func runExtender(cmd *cobra.Command, f *extenderFlags) error {
	log := textlogger.NewLogger(textlogger.NewConfig(textlogger.Verbosity(f.verbosity), textlogger.Output(cmd.ErrOrStderr())))
	if _, err := gomemlimit.Set(log, f.memoryLimit); err != nil {
		return err
	}
	klog.SetLogger(log)
	ctrllog.SetLogger(log)
	gin.SetMode(gin.ReleaseMode)
	ctx := logr.NewContext(cmd.Context(), log)

	if f.onLostLeadership != lostLeadershipExit && f.onLostLeadership != lostLeadershipRestart {
		return fmt.Errorf("--on-lost-leadership %q: want %s or %s", f.onLostLeadership, lostLeadershipExit, lostLeadershipRestart)
	}
	placement := gpu.Placement(f.placement)
	if placement != gpu.PlacementBinpack && placement != gpu.PlacementSpread {
		return fmt.Errorf("--placement %q: want binpack or spread", f.placement)
	}
	if err := f.admitter.Usage.Validate(f.admitter.Interval); err != nil {
		return fmt.Errorf("%w (the chart sets these from extender.admission.fairShareUsage)", err)
	}
	if f.admitter.Usage.Enabled() && !f.admission {
		return errors.New("--fair-share-usage-weight weighs usage in the admission loop's fair share: it needs --admission=true")
	}
	if err := checkLeaderElection(f.leaseDuration, f.renewDeadline, f.retryPeriod); err != nil {
		return err
	}
	if f.certDir == "" || f.clientCAFile == "" {
		return errors.New("the extender serves HTTPS to kube-scheduler's client certificate only: set --cert-dir (tls.crt, tls.key) and --client-ca-file (the CA of kube-scheduler's client certificate); the chart and partita dev up set both, docs/operations.md says how")
	}
	clientCAs, err := extender.NewClientCAs(f.clientCAFile, clock.RealClock{})
	if err != nil {
		return fmt.Errorf("--client-ca-file: %w", err)
	}
	l, err := net.Listen("tcp", f.addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", f.addr, err)
	}
	log.Info("Answering the verbs to client certificates of this CA only", "clientCAFile", f.clientCAFile,
		"allowedNames", f.clientNames, "debugEndpoints", f.debugEndpoints, "profiling", f.profiling)

	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = f.kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return fmt.Errorf("load kubeconfig: %w", err)
	}
	cfg.QPS, cfg.Burst = f.qps, f.burst
	cfg.Impersonate.UserName, cfg.Impersonate.Groups = f.impersonateUser, f.impersonateGroups
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("create client: %w", err)
	}
	scheme, err := clientscheme.New()
	if err != nil {
		return err
	}
	var lock resourcelock.Interface
	if f.leaderElect && f.replicaName != "" {
		events := record.NewBroadcaster()
		events.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: cs.CoreV1().Events("")})
		defer events.Shutdown()
		id := f.replicaName + "_" + string(uuid.NewUUID())
		if lock, err = newLeaseLock(cfg, f.leaseNamespace, f.leaseName, f.renewDeadline, resourcelock.ResourceLockConfig{
			Identity:      id,
			EventRecorder: events.NewRecorder(clientgoscheme.Scheme, corev1.EventSource{Component: "partita-extender", Host: f.replicaName}),
		}); err != nil {
			return err
		}
		log.Info("Electing a leader", "lease", f.leaseNamespace+"/"+f.leaseName, "identity", id)
	}
	mgr, err := manager.New(cfg, manager.Options{
		Scheme:                              scheme,
		Logger:                              log,
		Metrics:                             metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress:              "0",
		LeaderElection:                      f.leaderElect,
		LeaderElectionID:                    f.leaseName,
		LeaderElectionNamespace:             f.leaseNamespace,
		LeaderElectionReleaseOnCancel:       true,
		LeaderElectionResourceLockInterface: lock,
		LeaseDuration:                       &f.leaseDuration,
		RenewDeadline:                       &f.renewDeadline,
		RetryPeriod:                         &f.retryPeriod,
		Cache: cache.Options{DefaultTransform: cache.TransformStripManagedFields(), ByObject: map[client.Object]cache.ByObject{
			// Pods are most of the process's memory at scale: only what
			// places them is kept (internal/podtrim).
			&corev1.Pod{}: {Transform: podtrim.Transform},
			// Only the policy ConfigMaps of Partita's namespace are cached.
			&corev1.ConfigMap{}: {
				Namespaces: map[string]cache.Config{f.policyNamespace: {}},
				Label:      labels.SelectorFromSet(labels.Set{v1alpha1.LabelPolicy: policy.PolicyLabelValue}),
			},
		}},
	})
	if err != nil {
		return fmt.Errorf("create manager: %w", err)
	}
	if err := extender.IndexPodsByUID(ctx, mgr.GetCache()); err != nil {
		return err
	}
	// Bind reads the node it is asked for; the informer starts with the
	// others rather than on the first bind.
	if _, err := mgr.GetCache().GetInformer(ctx, &corev1.Node{}); err != nil {
		return fmt.Errorf("get node informer: %w", err)
	}
	ledger := gpu.NewLedger()
	feed := ledgerfeed.New(ledger)
	if err := feed.Watch(ctx, mgr.GetCache()); err != nil {
		return err
	}
	elected := mgr.Elected()
	isLeader := func() bool {
		select {
		case <-elected:
			return true
		default:
			return false
		}
	}
	// The loop's releases, for bind while the pod informer lags them.
	released := extender.NewReleasedPods(clock.RealClock{}, time.Minute)
	// Models: their phase, summed up from the nodes' caches, and where they
	// are, for prioritize and the loop. An API server without the Model CRD
	// (a chart upgraded without its new CRDs) skips both.
	var models *locate.Locator
	if _, err := mgr.GetRESTMapper().RESTMapping(schema.GroupKind{Group: v1alpha1.GroupVersion.Group, Kind: "Model"}, v1alpha1.GroupVersion.Version); err != nil {
		log.Info("Models are not read: the API server does not serve them; apply the chart's CRDs (crds/)", "error", err.Error())
	} else {
		requests := &prefetch.Requester{Reader: mgr.GetClient(), Client: mgr.GetClient(), Clock: clock.RealClock{}}
		if err := summary.Setup(mgr, clock.RealClock{}, requests.Request); err != nil {
			return fmt.Errorf("add the Model summary: %w", err)
		}
		if err := podcondition.Setup(mgr, clock.RealClock{}); err != nil {
			return fmt.Errorf("add the models' pod condition: %w", err)
		}
		if _, err := mgr.GetCache().GetInformer(ctx, &v1alpha1.Model{}); err != nil {
			return fmt.Errorf("get Model informer: %w", err)
		}
		models = locate.New(mgr.GetClient())
	}
	extOpts := []extender.Option{}
	if models != nil {
		extOpts = append(extOpts, extender.WithModels(models))
	}
	extOpts = append(extOpts,
		extender.WithLiveReader(mgr.GetAPIReader()),
		extender.WithReleasedPods(released),
		extender.WithSynced(feed.Synced),
		extender.WithLeader(isLeader),
		extender.WithPlacement(placement),
		extender.WithAssumeTTL(f.assumeTTL),
		extender.WithMetrics(extender.NewMetrics(metrics.Registry, ledger, isLeader)))
	ext := extender.New(ledger, mgr.GetClient(), extender.ClientsetBinder{Client: cs}, extOpts...)
	if err := mgr.Add(ext); err != nil {
		return fmt.Errorf("add bind expiry: %w", err)
	}
	if f.heartbeatTimeout <= 0 {
		return fmt.Errorf("--agent-heartbeat-timeout %s: want a positive duration, well above the agents' --heartbeat-interval", f.heartbeatTimeout)
	}
	var notifyAdmitter func()
	monitor := admission.NewHeartbeatMonitor(ledger, f.heartbeatTimeout,
		admission.WithMonitorEvents(mgr.GetClient(), mgr.GetEventRecorder("partita-extender"), isLeader),
		admission.WithMonitorOnChange(func() {
			if notifyAdmitter != nil {
				notifyAdmitter()
			}
		}))
	if err := mgr.Add(monitor); err != nil {
		return fmt.Errorf("add agent heartbeat monitor: %w", err)
	}
	if f.admission {
		adm, err := addAdmitter(ctx, mgr, cs, ledger, feed, f, placement, released, models)
		if err != nil {
			return err
		}
		notifyAdmitter = adm.Notify
	}
	srv := extender.NewServer(log.WithName("http"), ext,
		extender.WithMetricsHandler(promhttp.HandlerFor(metrics.Registry, promhttp.HandlerOpts{})),
		extender.WithMaxRequestBytes(f.maxRequestBytes),
		extender.WithProfiling(f.profiling),
		extender.WithDebugEndpoints(f.debugEndpoints),
		extender.WithClientAuth(extender.ClientAuth{AllowedNames: f.clientNames}),
		extender.WithReady(func() error {
			if !feed.Synced() {
				return extender.ErrNotSynced
			}
			return nil
		}))

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return mgr.Start(gctx) })
	g.Go(func() error {
		cw, err := watchCertificates(gctx, f.certDir)
		if err != nil {
			return err
		}
		return extender.Serve(gctx, l, srv.Handler(), extender.TLSConfig(cw.GetCertificate, clientCAs, log.WithName("tls")))
	})
	err = g.Wait()
	if lostLeadership(err) && f.onLostLeadership == lostLeadershipRestart {
		// Everything the leader ran has stopped with the manager; a fresh
		// process (its listening sockets close on exec) joins as a standby.
		log.Info("Lost the Lease; starting again as a standby (--on-lost-leadership=restart)")
		return restartSelf()
	}
	return err
}

// The values of --on-lost-leadership.
const (
	lostLeadershipExit    = "exit"
	lostLeadershipRestart = "restart"
)

// lostLeadership says whether err is the manager's end after its leader
// could not renew the Lease (controller-runtime exports no error value for
// it, only this message).
func lostLeadership(err error) bool {
	return err != nil && strings.Contains(err.Error(), "leader election lost")
}

// restartSelf replaces the process with a fresh run of the same binary and
// arguments; it returns only when that fails.
func restartSelf() error {
	bin, err := os.Executable()
	if err != nil {
		return fmt.Errorf("leader election lost; restart: find the binary: %w", err)
	}
	if err := syscall.Exec(bin, os.Args, os.Environ()); err != nil {
		return fmt.Errorf("leader election lost; restart %s: %w", bin, err)
	}
	return nil
}

// checkLeaderElection checks the Lease timings as client-go's elector
// would, but before anything starts and naming the flags.
func checkLeaderElection(lease, renew, retry time.Duration) error {
	switch {
	case lease <= 0 || renew <= 0 || retry <= 0:
		return fmt.Errorf("--leader-election-lease-duration %s, --leader-election-renew-deadline %s, --leader-election-retry-period %s: want positive durations", lease, renew, retry)
	case renew >= lease:
		return fmt.Errorf("--leader-election-renew-deadline %s: want it below --leader-election-lease-duration %s, or two replicas could lead at once", renew, lease)
	case float64(renew) <= leaderelection.JitterFactor*float64(retry):
		return fmt.Errorf("--leader-election-retry-period %s: want it below --leader-election-renew-deadline %s divided by %.1f, so that the leader tries to renew more than once", retry, renew, leaderelection.JitterFactor)
	}
	return nil
}

// newLeaseLock is the Lease lock controller-runtime would make, under an
// identity of our choosing (--replica-name): controller-runtime's is the
// host name, the same for every replica on one host (the dev cluster's).
// Its client times out at half the renew deadline (at least a second), as
// controller-runtime's does, so that one hung request does not cost the
// Lease.
func newLeaseLock(cfg *rest.Config, namespace, name string, renewDeadline time.Duration, rlc resourcelock.ResourceLockConfig) (resourcelock.Interface, error) {
	cfg = rest.AddUserAgent(rest.CopyConfig(cfg), "leader-election")
	cfg.Timeout = max(renewDeadline/2, time.Second)
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("create leader election client: %w", err)
	}
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, namespace, name, cs.CoreV1(), cs.CoordinationV1(), rlc)
	if err != nil {
		return nil, fmt.Errorf("create leader election lock: %w", err)
	}
	return lock, nil
}

// watchCertificates serves the certificate in dir and reloads it on change.
func watchCertificates(ctx context.Context, dir string) (*certwatcher.CertWatcher, error) {
	cw, err := certwatcher.New(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"))
	if err != nil {
		return nil, fmt.Errorf("load serving certificate from %s: %w", dir, err)
	}
	cw = cw.WithWatchInterval(10 * time.Second)
	go func() {
		if err := cw.Start(ctx); err != nil {
			logr.FromContextOrDiscard(ctx).Error(err, "Stopped watching the serving certificate", "dir", dir)
		}
	}()
	return cw, nil
}

// devExtenderCertDir is where `partita dev up` keeps the extender's dev
// certificates (extender.EnsureDevCertificates): the serving certificate,
// kube-scheduler's client certificate, and the CA of both.
const devExtenderCertDir = "{state}/extender-certs"

// devExtenderURL is where the dev cluster's kube-scheduler reaches the
// extender: the proxy in front of its replicas (devExtenderProxy), on a
// loopback port chosen once per cluster.
const devExtenderURL = "https://127.0.0.1:{port:" + devcluster.ExtenderProxyName + "}"

// devSchedulerConfig is the kube-scheduler configuration of the dev cluster,
// rendered as --print-scheduler-config does, with the {port:extender-proxy} and
// {state} placeholders the dev cluster fills in. Its options are constants,
// so an error is a bug (TestDevSchedulerConfig).
func devSchedulerConfig() string {
	o := extender.DefaultSchedulerConfigOptions()
	o.URL = devExtenderURL
	o.CAFile = devExtenderCertDir + "/" + extender.DevCAFile
	o.ClientCertFile = devExtenderCertDir + "/" + extender.DevClientCertFile
	o.ClientKeyFile = devExtenderCertDir + "/" + extender.DevClientKeyFile
	b, err := extender.SchedulerConfig(o)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// addWorkloadMap adds the workload map (docs/workloads.md) to mgr: owner
// informers of the kinds the policy names, and its answers for the
// admitter's cache. Every replica runs it, so that a new leader's map is
// warm.
func addWorkloadMap(ctx context.Context, mgr manager.Manager, engine *policy.Engine, remap func([]types.UID)) (*workloadmap.Mapper, error) {
	clients, err := workloadmap.ClientsFor(mgr.GetConfig())
	if err != nil {
		return nil, err
	}
	reader := mgr.GetCache()
	pods := func(ns, name string) (*corev1.Pod, bool) {
		var p corev1.Pod
		if err := reader.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &p); err != nil {
			return nil, false
		}
		return &p, true
	}
	log := logr.FromContextOrDiscard(ctx).WithName("workload-map")
	m := workloadmap.New(engine, pods, workloadmap.WithLogger(log), workloadmap.WithOnChange(func(uids []types.UID) { remap(uids) }))
	changed := make(chan struct{}, 1)
	engine.OnLoad(func(string) {
		select {
		case changed <- struct{}{}:
		default:
		}
	})
	if err := mgr.Add(allReplicas(func(ctx context.Context) error { return m.Start(ctx, clients, changed) })); err != nil {
		return nil, fmt.Errorf("add workload map: %w", err)
	}
	return m, nil
}

// allReplicas is a runnable every replica runs, leader or not.
type allReplicas func(ctx context.Context) error

func (f allReplicas) Start(ctx context.Context) error { return f(ctx) }
func (allReplicas) NeedLeaderElection() bool          { return false }

// addAdmitter adds the queue and gang admission loop to mgr, with the quota
// policy (the default bundle, overridden by the policy ConfigMaps of
// --policy-namespace).
func addAdmitter(ctx context.Context, mgr manager.Manager, cs kubernetes.Interface, ledger *gpu.Ledger, feed *ledgerfeed.Feed, f *extenderFlags, placement gpu.Placement, released *extender.ReleasedPods, models *locate.Locator) (*admission.Admitter, error) {
	engine, err := policy.NewEngine(ctx, policy.WithMetrics(policy.NewMetrics(metrics.Registry)))
	if err != nil {
		return nil, err
	}
	if f.implicitJobGangs {
		// The deprecated switch, as the Job rule's setting.
		if err := engine.SetConfig(ctx, policy.Config{Workloads: policy.WorkloadConfig{Jobs: policy.JobsAll}}); err != nil {
			return nil, err
		}
	}
	loader := policy.NewConfigMapLoader(mgr.GetCache(), mgr.GetClient(), engine, mgr.GetEventRecorder(admission.AdmitterName),
		f.policyNamespace, policy.DefaultBatchInterval, clock.RealClock{})
	if err := loader.Watch(ctx, mgr.GetCache()); err != nil {
		return nil, err
	}
	if err := mgr.Add(loader); err != nil {
		return nil, fmt.Errorf("add policy loader: %w", err)
	}
	opts := f.admitter
	opts.Placement = placement
	opts.Released = released
	// Conditions and statuses get a client (and a rate limiter) of their
	// own, so that pins and ungating never queue behind them.
	statusClient, err := client.New(rest.CopyConfig(mgr.GetConfig()), client.Options{Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper()})
	if err != nil {
		return nil, fmt.Errorf("create status client: %w", err)
	}
	opts.StatusClient = statusClient
	// The map sends the pods to ask about again to the admitter's cache;
	// adm is set before the manager starts anything.
	var adm *admission.Admitter
	mapper, err := addWorkloadMap(ctx, mgr, engine, func(uids []types.UID) {
		adm.Cache().Remap(uids)
		adm.Notify()
	})
	if err != nil {
		return nil, err
	}
	opts.Mapper = mapper
	claimsSynced := func() bool { return true }
	served, err := claims.ServesDRA(mgr.GetConfig())
	if err != nil {
		return nil, err
	}
	if served {
		claimCache := claims.NewCache(mgr.GetCache(), dra.GPUClasses(f.gpuDeviceClasses), dra.DefaultGPUDrivers)
		if err := claimCache.Watch(ctx, mgr.GetCache(), func(namespace string) {
			adm.Cache().RereadClaims(namespace)
			adm.Notify()
		}); err != nil {
			return nil, err
		}
		opts.Claims = claimCache.Demand
		opts.ClaimAllocator = claimCache
		claimsSynced = claimCache.Synced
	}
	if models != nil {
		opts.ModelsHeld = func(namespace string, names []string) map[string]float64 { return models.Held(ctx, namespace, names) }
		opts.Prefetch = (&prefetch.Requester{Reader: mgr.GetClient(), Client: mgr.GetClient(), Clock: clock.RealClock{}}).Request
	}
	synced := func() bool { return feed.Synced() && mapper.Synced() && claimsSynced() }
	adm = admission.NewAdmitter(ledger, mgr.GetClient(), cs, mgr.GetEventRecorder(admission.AdmitterName),
		admission.PolicyQuota{Engine: engine}, synced, opts, admission.NewAdmitterMetrics(metrics.Registry), nil)
	if err := adm.Watch(ctx, mgr.GetCache()); err != nil {
		return nil, err
	}
	if err := mgr.Add(adm); err != nil {
		return nil, fmt.Errorf("add admission loop: %w", err)
	}
	return adm, nil
}
