package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/go-logr/logr"
	"github.com/open-policy-agent/cert-controller/pkg/rotator"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/partita-dev/partita/admission/claims"
	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/dra"
	"github.com/partita-dev/partita/gpu"
	"github.com/partita-dev/partita/internal/clientauth"
	"github.com/partita-dev/partita/internal/clientscheme"
	"github.com/partita-dev/partita/internal/gomemlimit"
	"github.com/partita-dev/partita/policy"
	"github.com/partita-dev/partita/webhook"
)

// defaultPartitaNamespace is where Partita runs when $POD_NAMESPACE is unset.
const defaultPartitaNamespace = "partita-system"

// webhookFlags are the flags of `partita webhook`.
type webhookFlags struct {
	gpuDeviceClasses []string
	gpuBackend       string
	kubeconfig       string
	addr             string
	namespace        string
	certDir          string
	certRotation     string
	secretName       string
	serviceName      string
	configName       string
	devRegister      bool
	admissionGate    bool
	models           bool
	preemptNever     bool
	schedulerName    string
	mpsDir           string
	extraDNSNames    []string
	isolationModes   string
	referenceMiB     int64
	maxGPUsPerPod    string
	minGPUFraction   string
	requireQueue     bool
	defaultQueue     string
	trustedUsers     []string
	trustedGroups    []string
	excluded         []string
	policies         bool
	maxRequestBytes  int64
	batchInterval    time.Duration
	qps              float32
	burst            int
	verbosity        int
	clientCert       clientCertFlags
	callerCAFile     string
	callerNames      []string
	anyCaller        bool
}

func newWebhookCommand() *cobra.Command {
	ns := os.Getenv("POD_NAMESPACE")
	if ns == "" {
		ns = defaultPartitaNamespace
	}
	f := &webhookFlags{namespace: ns}
	cmd := &cobra.Command{
		Use:   "webhook",
		Short: "Serve the admission webhooks: canonicalise GPU pods, refuse bad or spoofed ones, apply the Rego policy",
		Long: `Serve Partita's mutating and validating admission webhooks over TLS
(/mutate-pods, /validate-pods, /validate-policies, /validate-podgroups) with
/healthz, /readyz and /metrics. Every pod in a namespace Partita manages is
rewritten into canonical form, given a queue, checked, and asked about by the
Rego policy (data.partita.admission), and so is every PodGroup's queue;
operators override the policy with ConfigMaps labelled partita.dev/policy=rego
in Partita's namespace, reloaded within seconds.

Certificates: --cert-rotation=self rotates them with cert-controller (a Secret
mounted at --cert-dir, CA injected into both webhook configurations);
--cert-rotation=none serves files someone else renews (cert-manager). Either
way a renewed certificate is served without a restart. --dev-register, for a
webhook outside the cluster (partita dev up), generates certificates in
--cert-dir and registers both configurations with url https://<addr>.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runWebhook(cmd, f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig file; empty means $KUBECONFIG, ~/.kube/config or the in-cluster config")
	fl.StringVar(&f.addr, "addr", ":9443", "address to serve the webhooks (HTTPS) on")
	fl.StringVar(&f.namespace, "namespace", f.namespace, "Partita's namespace (default $POD_NAMESPACE, else "+defaultPartitaNamespace+"): never blocked by the pod webhooks, and home of the policy ConfigMaps")
	fl.StringVar(&f.certDir, "cert-dir", "/tmp/k8s-webhook-server/serving-certs", "directory with tls.crt and tls.key (and ca.crt)")
	fl.StringVar(&f.certRotation, "cert-rotation", "self", "self: cert-controller rotates the certificate in the Secret --secret-name mounted at --cert-dir; none: serve the files as they are (cert-manager)")
	fl.StringVar(&f.secretName, "secret-name", "partita-webhook-cert", "Secret that holds the certificate (--cert-rotation=self)")
	fl.StringSliceVar(&f.extraDNSNames, "cert-extra-dns-names", nil, "more DNS names for the rotated certificate (--cert-rotation=self), e.g. the extender's Service, which serves the same certificate")
	fl.StringVar(&f.serviceName, "service-name", "partita-webhook", "Service in front of the webhook; the certificate names <service>.<namespace>.svc")
	fl.StringVar(&f.configName, "configuration-name", webhook.DefaultConfigurationName, "name of the Mutating- and ValidatingWebhookConfiguration")
	fl.BoolVar(&f.devRegister, "dev-register", false, "run outside the cluster: generate certificates in --cert-dir and register both webhook configurations with url https://<addr> (partita dev up)")
	fl.BoolVar(&f.models, "models", true, "the cluster runs the node's model cache (chart modelCache.enabled): pods that ask for models (partita.dev/model) get their volumes; false refuses them")
	fl.BoolVar(&f.admissionGate, "admission-gate", true, "add the scheduling gate "+v1alpha1.SchedulingGateAdmission+" to GPU pods for the queue and gang admission loop")
	fl.BoolVar(&f.preemptNever, "preemption-never", false, "write preemptionPolicy: Never into GPU pods; the API server refuses it unless the pod's PriorityClass says Never too (see docs/operations.md)")
	fl.StringVar(&f.mpsDir, "mps-dir", webhook.DefaultMPSDir, "the agent's --mps-dir on the nodes: GPU containers of one-device slices mount it and find their device's MPS daemon there (when any GPUNode runs mps)")
	fl.StringVar(&f.schedulerName, "scheduler-name", "", "write this spec.schedulerName into GPU pods (Partita's own kube-scheduler, e.g. partita); empty leaves the pod's choice, for a default scheduler configured with the extender")
	fl.StringVar(&f.isolationModes, "isolation-modes", "auto", "isolation modes whose env GPU containers get: auto (those of the cluster's GPUNodes) or a list of time-slicing, mps, hami-core")
	fl.Int64Var(&f.referenceMiB, "reference-gpu-memory-mib", 0, "device memory (MiB) against which memory requests are counted in partita.dev/gpu-milli while no GPUNode is known")
	fl.StringVar(&f.maxGPUsPerPod, "max-gpus-per-pod", "", "policy: the most GPUs one pod may ask for (a number, fractions allowed); empty for no ceiling")
	fl.StringVar(&f.minGPUFraction, "min-gpu-fraction", "", "policy: the smallest share of a GPU a container may ask for, e.g. 0.1; empty for none")
	fl.BoolVar(&f.requireQueue, "require-queue", false, "policy: refuse GPU pods that name no queue when their namespace has no default queue (instead of sending them to --default-queue)")
	fl.StringVar(&f.defaultQueue, "default-queue", v1alpha1.DefaultQueueName, "the queue of GPU pods that name none, whose PodGroup names none and whose namespace has no default (ignored with --require-queue); the Queue must exist, or such pods are refused")
	fl.StringSliceVar(&f.trustedUsers, "trusted-users", nil, "users that may write system annotations and device env, e.g. system:serviceaccount:<namespace>:partita-extender (besides --trusted-groups)")
	fl.StringSliceVar(&f.trustedGroups, "trusted-groups", nil, "groups that may write system annotations and device env (default, when neither flag is set: system:serviceaccounts:<namespace>)")
	fl.StringSliceVar(&f.excluded, "exclude-namespaces", webhook.DefaultExcludedNamespaces(), "namespaces the pod webhooks and admission policies skip besides kube-system and --namespace (with --dev-register)")
	fl.BoolVar(&f.policies, "admission-policies", true, "with --dev-register: also install the ValidatingAdmissionPolicy and MutatingAdmissionPolicy (Kubernetes 1.36 or later) and call the webhooks only for pods that ask for GPUs or carry Partita's keys; false makes the webhooks see every pod, as on older clusters")
	fl.Int64Var(&f.maxRequestBytes, "max-request-bytes", webhook.DefaultMaxRequestBytes, "largest AdmissionReview body accepted; larger ones get 413")
	fl.DurationVar(&f.batchInterval, "batch-interval", policy.DefaultBatchInterval, "how long queue, namespace and policy changes gather before the policy sees them")
	fl.Float32Var(&f.qps, "kube-api-qps", 20, "the most API requests per second, sustained")
	fl.IntVar(&f.burst, "kube-api-burst", 40, "the most API requests in a burst")
	fl.StringVar(&f.gpuBackend, "gpu-backend", string(dra.BackendExtender), "how GPU pods are placed: extender (write partita.dev/gpu-milli and the device env for the scheduler extender) or dra (give each GPU container a ResourceClaim on "+dra.DriverName+" devices from a claim template the webhook creates in the pod's namespace, for kube-scheduler's DRA plugin)")
	fl.StringSliceVar(&f.gpuDeviceClasses, "gpu-device-classes", dra.DefaultGPUClasses, "DeviceClasses whose devices are GPUs: a pod that asks for them through ResourceClaims only is given a queue and the admission gate like any GPU pod (its claims are read live)")
	fl.IntVarP(&f.verbosity, "v", "v", 0, "log verbosity (2 logs every admission decision, 3 the access log)")
	fl.StringVar(&f.callerCAFile, "client-ca-file", "", "CA bundle that the API server's client certificate (its admission configuration's kubeconfig) must be signed by; only callers with such a certificate get an AdmissionReview answered (re-read when it changes). Required unless --allow-unauthenticated-callers")
	fl.StringSliceVar(&f.callerNames, "client-allowed-names", []string{webhook.DefaultClientName}, "common names of the API server's client certificates accepted; empty accepts any certificate the --client-ca-file CA signed")
	fl.BoolVar(&f.anyCaller, "allow-unauthenticated-callers", false, "answer AdmissionReviews from any caller that reaches the port (for API servers that cannot present a client certificate, e.g. some managed clusters): anyone who reaches it can make the webhook compile Rego and, with --gpu-backend dra, create claim templates; restrict the port with a NetworkPolicy")
	f.clientCert.register(fl)
	return cmd
}

// callerAuth reads the CA of the API server's client certificate; nil
// (with --allow-unauthenticated-callers only) serves any caller.
func (f *webhookFlags) callerAuth(log logr.Logger) (*clientauth.CAs, error) {
	switch {
	case f.anyCaller && f.callerCAFile != "":
		return nil, errors.New("--allow-unauthenticated-callers and --client-ca-file: give one; with the CA the webhook answers the API server only")
	case f.anyCaller:
		log.Info("WARNING: answering AdmissionReviews from any caller (--allow-unauthenticated-callers); anyone who reaches the port can make the webhook compile Rego and, with the dra backend, create claim templates")
		return nil, nil
	case f.callerCAFile == "":
		return nil, errors.New("the webhook answers only the API server: set --client-ca-file to the CA of the client certificate its admission configuration presents (the chart and partita dev up do; docs/install.md says how), or --allow-unauthenticated-callers where the API server cannot present one")
	}
	cas, err := clientauth.NewCAs(f.callerCAFile, clock.RealClock{})
	if err != nil {
		return nil, fmt.Errorf("--client-ca-file: %w", err)
	}
	return cas, nil
}

// policyConfig reads the policy flags.
func (f *webhookFlags) policyConfig() (policy.Config, error) {
	c := policy.Config{RequireQueue: f.requireQueue}
	if f.maxGPUsPerPod != "" {
		q, err := resource.ParseQuantity(f.maxGPUsPerPod)
		if err != nil || q.Sign() <= 0 {
			return c, fmt.Errorf("--max-gpus-per-pod %q: want a positive number of GPUs", f.maxGPUsPerPod)
		}
		c.MaxGPUMilliPerPod = q.MilliValue()
	}
	if f.minGPUFraction != "" {
		q, err := resource.ParseQuantity(f.minGPUFraction)
		if err != nil || q.Sign() <= 0 || q.MilliValue() > gpu.MilliPerGPU {
			return c, fmt.Errorf("--min-gpu-fraction %q: want a fraction in (0, 1]", f.minGPUFraction)
		}
		c.MinGPUMilli = q.MilliValue()
	}
	return c, nil
}

// trusted is who may write system annotations and device env. Without
// either flag it is every service account of Partita's namespace; naming
// users or groups replaces that default, so the chart and the dev cluster
// can trust the extender's service account alone.
func (f *webhookFlags) trusted() webhook.Identities {
	if len(f.trustedUsers) == 0 && len(f.trustedGroups) == 0 {
		return webhook.DefaultIdentities(f.namespace)
	}
	return webhook.Identities{Users: f.trustedUsers, Groups: f.trustedGroups}
}

func (f *webhookFlags) modes() ([]v1alpha1.IsolationMode, error) {
	if f.isolationModes == "auto" || f.isolationModes == "" {
		return nil, nil
	}
	var out []v1alpha1.IsolationMode
	for _, m := range strings.Split(f.isolationModes, ",") {
		switch mode := v1alpha1.IsolationMode(strings.TrimSpace(m)); mode {
		case v1alpha1.IsolationTimeSlicing, v1alpha1.IsolationMPS, v1alpha1.IsolationHAMiCore:
			out = append(out, mode)
		default:
			return nil, fmt.Errorf("--isolation-modes: unknown mode %q; want auto or a list of time-slicing, mps, hami-core", m)
		}
	}
	return out, nil
}

func runWebhook(cmd *cobra.Command, f *webhookFlags) error {
	log := textlogger.NewLogger(textlogger.NewConfig(textlogger.Verbosity(f.verbosity), textlogger.Output(cmd.ErrOrStderr())))
	// A container with a memory limit: the garbage collector works harder near it.
	_, _ = gomemlimit.Set(log, "")
	klog.SetLogger(log)
	ctrllog.SetLogger(log)
	gin.SetMode(gin.ReleaseMode)
	ctx := logr.NewContext(cmd.Context(), log)

	switch f.certRotation {
	case "self", "none":
	default:
		return fmt.Errorf("--cert-rotation %q: want self or none", f.certRotation)
	}
	polConf, err := f.policyConfig()
	if err != nil {
		return err
	}
	defaultQueue := f.defaultQueue
	switch {
	case f.requireQueue:
		defaultQueue = ""
	case defaultQueue == "":
		return errors.New("--default-queue is empty: name the queue of GPU pods that name none, or refuse them with --require-queue")
	}
	pinned, err := f.modes()
	if err != nil {
		return err
	}
	callerCAs, err := f.callerAuth(log)
	if err != nil {
		return err
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = f.kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return fmt.Errorf("load kubeconfig: %w", err)
	}
	cfg.QPS, cfg.Burst = f.qps, f.burst
	unscoped := rest.CopyConfig(cfg)
	if f.certRotation == "self" && !f.devRegister {
		// cert-controller would list every Secret of the namespace; its
		// RBAC names the certificate Secret only.
		cfg.Wrap(webhook.ScopeSecretReads(f.namespace, f.secretName))
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("create client: %w", err)
	}
	scheme, err := clientscheme.New()
	if err != nil {
		return err
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	engine, err := policy.NewEngine(ctx, policy.WithMetrics(policy.NewMetrics(reg)))
	if err != nil {
		return err
	}
	if err := engine.SetConfig(ctx, polConf); err != nil {
		return err
	}

	// Only the policy ConfigMaps of Partita's namespace are cached.
	policySelector := labels.SelectorFromSet(labels.Set{v1alpha1.LabelPolicy: policy.PolicyLabelValue})
	byObject := map[client.Object]cache.ByObject{
		&corev1.ConfigMap{}: {Namespaces: map[string]cache.Config{f.namespace: {}}, Label: policySelector},
	}
	backend, err := dra.ParseBackend(f.gpuBackend)
	if err != nil {
		return fmt.Errorf("--gpu-backend: %w", err)
	}
	if backend == dra.BackendDRA {
		// Only Partita's claim templates are cached.
		byObject[&resourceapi.ResourceClaimTemplate{}] = cache.ByObject{Label: labels.SelectorFromSet(labels.Set{dra.LabelManagedBy: dra.ManagedByPartita})}
	}
	mgr, err := manager.New(cfg, manager.Options{
		Scheme:                 scheme,
		Logger:                 log,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache:                  cache.Options{ByObject: byObject},
	})
	if err != nil {
		return fmt.Errorf("create manager: %w", err)
	}
	var templates webhook.TemplateStore
	if backend == dra.BackendDRA {
		templates = webhook.ClientTemplates{Client: mgr.GetClient(), Live: mgr.GetAPIReader()}
	}
	view := webhook.NewGPUNodeView(f.referenceMiB, pinned)
	refs := webhook.NewReferences(mgr.GetCache(), mgr.GetAPIReader())
	stateSync := policy.NewStateSync(mgr.GetCache(), engine, policy.WithBatchInterval(f.batchInterval),
		policy.WithLiveReader(mgr.GetAPIReader(), f.batchInterval))
	// A denial is decided again on queues and namespaces read from the API
	// server: a Queue applied with the pods naming it must not be missed.
	decisions := policy.NewFreshDenials(engine, stateSync, clock.RealClock{})
	loader := policy.NewConfigMapLoader(mgr.GetCache(), mgr.GetClient(), engine, mgr.GetEventRecorder("partita-webhook"),
		f.namespace, f.batchInterval, clock.RealClock{})
	for _, w := range []interface {
		Watch(context.Context, cache.Informers) error
	}{view, stateSync, loader, refs} {
		if err := w.Watch(ctx, mgr.GetCache()); err != nil {
			return err
		}
	}
	if err := mgr.Add(stateSync); err != nil {
		return fmt.Errorf("add policy state sync: %w", err)
	}
	if err := mgr.Add(loader); err != nil {
		return fmt.Errorf("add policy loader: %w", err)
	}

	l, err := net.Listen("tcp", f.addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", f.addr, err)
	}
	var caBundle []byte
	certsReady := make(chan struct{})
	switch {
	case f.devRegister:
		host, _, err := net.SplitHostPort(l.Addr().String())
		if err != nil {
			return fmt.Errorf("read listen address: %w", err)
		}
		o := webhook.DevCertificateOptions{Dir: f.certDir, DNSNames: []string{"localhost"}, Now: time.Now()}
		if ip := net.ParseIP(host); ip != nil && !ip.IsUnspecified() {
			o.IPs = []net.IP{ip}
		} else {
			o.IPs = []net.IP{net.IPv4(127, 0, 0, 1)}
		}
		if caBundle, err = webhook.EnsureDevCertificates(o); err != nil {
			return err
		}
		close(certsReady)
	case f.certRotation == "self":
		// cert-controller keeps the Secret current and injects the CA into
		// both configurations; the kubelet syncs the Secret into --cert-dir.
		err := rotator.AddRotator(mgr, &rotator.CertRotator{
			SecretKey:            types.NamespacedName{Namespace: f.namespace, Name: f.secretName},
			CertDir:              f.certDir,
			CAName:               "partita-ca",
			CAOrganization:       "partita",
			DNSName:              fmt.Sprintf("%s.%s.svc", f.serviceName, f.namespace),
			ExtraDNSNames:        append([]string{fmt.Sprintf("%s.%s.svc.cluster.local", f.serviceName, f.namespace)}, f.extraDNSNames...),
			IsReady:              certsReady,
			EnableReadinessCheck: true,
			Webhooks: []rotator.WebhookInfo{
				{Name: f.configName, Type: rotator.Mutating},
				{Name: f.configName, Type: rotator.Validating},
			},
		})
		if err != nil {
			return fmt.Errorf("set up certificate rotation: %w", err)
		}
		if f.clientCert.secretName != "" {
			if err := addClientCertRotator(mgr, unscoped, f.namespace, &f.clientCert); err != nil {
				return err
			}
		}
	default:
		close(certsReady)
	}

	podOpts := []webhook.PodOption{
		webhook.WithAdmissionGate(f.admissionGate), webhook.WithPreemptionNever(f.preemptNever),
		webhook.WithSchedulerName(f.schedulerName), webhook.WithMPSDir(f.mpsDir), webhook.WithTrusted(f.trusted()),
		webhook.WithReferences(refs), webhook.WithDefaultQueue(defaultQueue), webhook.WithGPUBackend(backend, templates),
		webhook.WithModels(f.models),
	}
	served, err := claims.ServesDRA(cfg)
	if err != nil {
		return err
	}
	if served {
		// Pods with claims are few next to the others: their claims,
		// templates and DeviceClasses are read live, with nothing cached.
		claimCache := claims.NewCache(mgr.GetAPIReader(), dra.GPUClasses(f.gpuDeviceClasses), dra.DefaultGPUDrivers)
		podOpts = append(podOpts, webhook.WithClaims(claimCache.Demand))
	}
	pods := webhook.NewPodAdmission(decisions, view, podOpts...)
	var registered atomic.Bool
	ready := func() error {
		switch {
		case !stateSync.Synced():
			return errors.New("the policy has not seen the cluster state yet")
		case !loader.Synced():
			return errors.New("the policy ConfigMaps have not been read yet")
		case !refs.Synced():
			return errors.New("the PodGroups, PriorityClasses and Topologies have not been read yet")
		case f.devRegister && !registered.Load():
			return errors.New("the webhook configurations are not registered yet")
		}
		return nil
	}
	srv := webhook.NewServer(log.WithName("http"), pods,
		webhook.WithMetrics(webhook.NewMetrics(reg), promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg})),
		webhook.WithReady(ready),
		webhook.WithMaxRequestBytes(f.maxRequestBytes),
		webhook.WithCallerCheck(webhook.CallerCheck(f.callerNames), callerCAs != nil),
		webhook.WithPolicyAdmission(webhook.NewPolicyAdmission(loader, f.namespace)),
		webhook.WithPodGroupAdmission(webhook.NewPodGroupAdmission(decisions, refs)))

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return mgr.Start(gctx) })
	g.Go(func() error {
		select {
		case <-certsReady:
		case <-gctx.Done():
			return nil
		}
		cw, err := webhook.WatchCertificates(gctx, f.certDir)
		if err != nil {
			return err
		}
		return webhook.ServeTLS(gctx, l, srv.Handler(), cw.GetCertificate, callerCAs, log.WithName("tls"))
	})
	if f.devRegister {
		g.Go(func() error {
			// Register once the policy knows the cluster, so that the first
			// pods are judged against real queues.
			if err := wait.PollUntilContextCancel(gctx, 100*time.Millisecond, true, func(context.Context) (bool, error) {
				return stateSync.Synced() && loader.Synced() && refs.Synced(), nil
			}); err != nil {
				return nil //nolint:nilerr // the context ended: shutting down
			}
			err := webhook.Register(gctx, cs, webhook.ConfigurationOptions{
				Name: f.configName, Namespace: f.namespace, ExcludedNamespaces: f.excluded,
				URL: "https://" + l.Addr().String(), CABundle: caBundle,
				Policies: f.policies, MPSDir: f.mpsDir, AdmissionGate: f.admissionGate, Trusted: f.trusted(),
				SideEffects: webhook.MutatingSideEffects(backend == dra.BackendDRA),
			})
			if err != nil {
				return err
			}
			if err := webhook.WaitForRegistration(gctx, cs, registrationProbeNamespace, 30*time.Second); err != nil {
				return err
			}
			if f.policies {
				if err := webhook.WaitForPolicies(gctx, cs, registrationProbeNamespace, 30*time.Second); err != nil {
					return err
				}
			}
			registered.Store(true)
			log.Info("Registered the webhook configurations", "name", f.configName, "url", "https://"+l.Addr().String())
			return nil
		})
	}
	return g.Wait()
}

// registrationProbeNamespace is where the registration probe is sent: a
// namespace the pod webhooks always select.
const registrationProbeNamespace = "default"
