package policy

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// AnnotationPolicyStatus on a policy ConfigMap says whether its policy is in
// force ("Loaded: policy <version>") or was refused ("Refused: <why>").
const AnnotationPolicyStatus = "partita.dev/policy-status"

// PolicyLabelValue is the value of v1alpha1.LabelPolicy that marks a
// ConfigMap as a Rego policy override.
const PolicyLabelValue = "rego"

// Event reasons on policy ConfigMaps.
const (
	ReasonPolicyLoaded  = "PolicyLoaded"
	ReasonPolicyRefused = "PolicyRefused"
)

// maxStatusLen bounds the status annotation and the event note.
const maxStatusLen = 1024

// Loader compiles and swaps policies (the Engine).
type Loader interface {
	Load(ctx context.Context, b Bundle, source string) (string, error)
	Check(ctx context.Context, b Bundle, source string) error
	Version() string
}

// ConfigMapLoader hot-reloads operator policies from ConfigMaps labelled
// partita.dev/policy=rego in Partita's namespace. Every key ending in .rego
// is a module laid over the default bundle (Bundle.Overlay): the same file
// name replaces a default module, an empty value removes it, a new name
// adds one. Every replica runs it.
type ConfigMapLoader struct {
	reader    client.Reader
	writer    client.Writer
	loader    Loader
	recorder  events.EventRecorder
	namespace string
	batch     *coalescer
	synced    atomic.Bool
	// lock serialises Reconcile.
	lock sync.Mutex
}

// NewConfigMapLoader returns a loader for policy ConfigMaps in namespace.
// reader is normally a cache that holds only those ConfigMaps.
func NewConfigMapLoader(reader client.Reader, writer client.Writer, loader Loader, recorder events.EventRecorder, namespace string, interval time.Duration, c clock.Clock) *ConfigMapLoader {
	return &ConfigMapLoader{
		reader: reader, writer: writer, loader: loader, recorder: recorder,
		namespace: namespace, batch: newCoalescer(interval, c),
	}
}

// Synced reports whether the ConfigMaps have been read at least once.
func (l *ConfigMapLoader) Synced() bool { return l.synced.Load() }

// NeedLeaderElection is false: every replica evaluates the policy.
func (l *ConfigMapLoader) NeedLeaderElection() bool { return false }

// Start reconciles once, then after each batch of ConfigMap changes, until
// ctx ends.
func (l *ConfigMapLoader) Start(ctx context.Context) error {
	ctx = logr.NewContext(ctx, logr.FromContextOrDiscard(ctx).WithName("policy-loader"))
	l.batch.run(ctx, "load policy ConfigMaps", l.Reconcile)
	return nil
}

// Watch registers on the cache's ConfigMap informer.
func (l *ConfigMapLoader) Watch(ctx context.Context, informers cache.Informers) error {
	inf, err := informers.GetInformer(ctx, &corev1.ConfigMap{})
	if err != nil {
		return fmt.Errorf("get ConfigMap informer: %w", err)
	}
	_, err = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { l.batch.trigger() },
		UpdateFunc: func(any, any) { l.batch.trigger() },
		DeleteFunc: func(any) { l.batch.trigger() },
	})
	if err != nil {
		return fmt.Errorf("watch ConfigMaps: %w", err)
	}
	return nil
}

// Reconcile loads the policy the ConfigMaps describe now. A policy that
// does not compile leaves the engine's policy as it was; either way each
// ConfigMap's status annotation says what happened, and an Event marks each
// change of it. The returned error is for API failures only.
func (l *ConfigMapLoader) Reconcile(ctx context.Context) error {
	l.lock.Lock()
	defer l.lock.Unlock()
	log := logr.FromContextOrDiscard(ctx)
	cms, err := l.list(ctx)
	if err != nil {
		return err
	}
	l.synced.Store(true)
	b, source, err := overlay(cms)
	var status, eventType, reason string
	if err == nil {
		var version string
		version, err = l.loader.Load(ctx, b, source)
		if err == nil {
			status = "Loaded: policy " + version
			eventType, reason = corev1.EventTypeNormal, ReasonPolicyLoaded
			log.V(1).Info("Loaded policy", "version", version, "source", source)
		}
	}
	if err != nil {
		status = fmt.Sprintf("Refused: %v; policy %s stays in force", err, l.loader.Version())
		eventType, reason = corev1.EventTypeWarning, ReasonPolicyRefused
		log.Error(err, "Refused policy", "source", source, "inForce", l.loader.Version())
	}
	status = truncate(status, maxStatusLen)
	var errs []error
	for i := range cms {
		cm := &cms[i]
		if cm.Annotations[AnnotationPolicyStatus] == status {
			continue
		}
		patch := client.MergeFrom(cm.DeepCopy())
		if cm.Annotations == nil {
			cm.Annotations = map[string]string{}
		}
		cm.Annotations[AnnotationPolicyStatus] = status
		if err := l.writer.Patch(ctx, cm, patch); err != nil {
			errs = append(errs, fmt.Errorf("annotate ConfigMap %s: %w", klog.KObj(cm), err))
			continue
		}
		if l.recorder != nil {
			l.recorder.Eventf(cm, nil, eventType, reason, "Load", "%s", status)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("write policy status: %v", errs)
	}
	return nil
}

// CheckConfigMap compiles the policy that would be in force if cm were
// created or updated as given, without loading it. The webhook refuses a
// policy ConfigMap for which it returns an error.
func (l *ConfigMapLoader) CheckConfigMap(ctx context.Context, cm *corev1.ConfigMap) error {
	cms, err := l.list(ctx)
	if err != nil {
		return err
	}
	cms = slices.DeleteFunc(cms, func(c corev1.ConfigMap) bool { return c.Name == cm.Name })
	if isPolicyConfigMap(cm) {
		cms = append(cms, *cm)
		slices.SortFunc(cms, func(a, b corev1.ConfigMap) int { return strings.Compare(a.Name, b.Name) })
	}
	b, source, err := overlay(cms)
	if err != nil {
		return err
	}
	return l.loader.Check(ctx, b, source)
}

// list returns the policy ConfigMaps in the namespace, sorted by name.
func (l *ConfigMapLoader) list(ctx context.Context) ([]corev1.ConfigMap, error) {
	var list corev1.ConfigMapList
	if err := l.reader.List(ctx, &list, client.InNamespace(l.namespace), client.MatchingLabels{v1alpha1.LabelPolicy: PolicyLabelValue}); err != nil {
		return nil, fmt.Errorf("list policy ConfigMaps in %s: %w", l.namespace, err)
	}
	out := list.Items
	slices.SortFunc(out, func(a, b corev1.ConfigMap) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

func isPolicyConfigMap(cm *corev1.ConfigMap) bool {
	return cm.Labels[v1alpha1.LabelPolicy] == PolicyLabelValue
}

// overlay lays the ConfigMaps' .rego keys over the default bundle. Two
// ConfigMaps may not both set the same file.
func overlay(cms []corev1.ConfigMap) (Bundle, string, error) {
	if len(cms) == 0 {
		return DefaultBundle(), SourceDefault, nil
	}
	files := map[string]string{}
	owner := map[string]types.NamespacedName{}
	names := make([]string, 0, len(cms))
	for _, cm := range cms {
		names = append(names, cm.Namespace+"/"+cm.Name)
		for _, key := range slices.Sorted(maps.Keys(cm.Data)) {
			if !strings.HasSuffix(key, ".rego") {
				continue
			}
			if prev, ok := owner[key]; ok {
				return nil, "", fmt.Errorf("ConfigMaps %s and %s/%s both set %s; a policy file may come from one ConfigMap only", prev, cm.Namespace, cm.Name, key)
			}
			owner[key] = types.NamespacedName{Namespace: cm.Namespace, Name: cm.Name}
			files[key] = cm.Data[key]
		}
	}
	return DefaultBundle().Overlay(files), "configmap:" + strings.Join(names, ","), nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}
