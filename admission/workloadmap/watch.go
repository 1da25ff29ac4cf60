package workloadmap

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	toolscache "k8s.io/client-go/tools/cache"
)

// Clients are the API clients the map watches owners with.
type Clients struct {
	Discovery discovery.DiscoveryInterface
	Dynamic   dynamic.Interface
	Metadata  metadata.Interface
}

// ClientsFor makes the clients from a REST configuration.
func ClientsFor(cfg *rest.Config) (Clients, error) {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return Clients{}, fmt.Errorf("create discovery client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return Clients{}, fmt.Errorf("create dynamic client: %w", err)
	}
	md, err := metadata.NewForConfig(cfg)
	if err != nil {
		return Clients{}, fmt.Errorf("create metadata client: %w", err)
	}
	return Clients{Discovery: dc, Dynamic: dyn, Metadata: md}, nil
}

// watch is one kind's informer.
type watch struct {
	gk   schema.GroupKind
	gvr  schema.GroupVersionResource
	spec bool
	reg  toolscache.ResourceEventHandlerRegistration
	stop chan struct{}
}

func (w *watch) hasSynced() bool { return w.reg != nil && w.reg.HasSynced() }

func (w *watch) mode() string {
	if w.spec {
		return "with spec"
	}
	return "metadata only"
}

var crdResource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// Start discovers the kinds and runs their informers until ctx ends,
// discovering again when the policy's kinds change, when a CRD appears,
// changes or goes, and every minute. It implements the manager's Runnable;
// every replica runs it (NeedLeaderElection is false), so that a new
// leader's map is already warm.
func (m *Mapper) Start(ctx context.Context, c Clients, policyChanged <-chan struct{}) error {
	m.lock.Lock()
	m.ctx = ctx
	m.lock.Unlock()
	rm := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(c.Discovery))
	crds := make(chan struct{}, 1)
	m.watchCRDs(ctx, c, crds)
	ticker := time.NewTicker(rediscoverEvery)
	defer ticker.Stop()
	defer m.stopAll()
	again := false
	for {
		complete := m.rediscover(ctx, c, rm)
		if again {
			// New rules, or pods that waited for this pass: every pod is
			// asked again (rediscover did so only if the kinds changed).
			m.remapAll()
		}
		again = false
		var retry <-chan time.Time
		if !complete {
			// The API server could not say what it serves: ask again soon,
			// as the map answers nothing until it knows.
			retry = time.After(2 * time.Second)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-retry:
		case <-policyChanged:
			again = true
		case <-m.poke:
			again = true
			rm.Reset()
			continue
		case <-crds:
			// A burst of CRD changes (an operator installing its CRDs)
			// lands first.
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(time.Second):
			}
		case <-ticker.C:
		}
		drain(crds)
		drain(policyChanged)
		rm.Reset()
	}
}

func drain(ch <-chan struct{}) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}

// watchCRDs pokes crds on every CRD event, when the extender may watch CRDs
// (metadata only); otherwise the minute's rediscovery finds new kinds.
func (m *Mapper) watchCRDs(ctx context.Context, c Clients, crds chan<- struct{}) {
	if _, err := c.Metadata.Resource(crdResource).List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
		m.log.Info("Not watching CustomResourceDefinitions; new workload kinds are found within a minute instead",
			"err", err.Error(), "fix", "grant the extender list and watch on customresourcedefinitions.apiextensions.k8s.io")
		return
	}
	inf := metadatainformer.NewFilteredMetadataInformer(c.Metadata, crdResource, "", 0, toolscache.Indexers{}, nil).Informer()
	_ = inf.SetTransform(metadataTransform)
	poke := func(any) {
		select {
		case crds <- struct{}{}:
		default:
		}
	}
	_, _ = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: poke, UpdateFunc: func(_, o any) { poke(o) }, DeleteFunc: poke,
	})
	go inf.Run(ctx.Done())
}

// rediscover starts an informer for each kind the policy names that the API
// server serves and the extender may list, and stops those no longer
// wanted. Pods are asked about again when the set changed. It reports
// whether discovery answered for every kind; until a first pass does, the
// map answers nothing (pods wait), so that no pod starts alone for want of
// an owner informer.
func (m *Mapper) rediscover(ctx context.Context, c Clients, rm meta.RESTMapper) bool {
	began := time.Now()
	want := map[schema.GroupKind]*watch{}
	complete := true
	unserved := map[schema.GroupKind]time.Time{}
	for _, k := range m.decider.WorkloadKinds() {
		gk := schema.GroupKind{Group: k.Group, Kind: k.Kind}
		mapping, err := rm.RESTMapping(gk)
		if err != nil {
			if meta.IsNoMatchError(err) {
				unserved[gk] = began
			} else {
				m.log.Info("Could not look up a workload kind; trying again", "kind", gk.String(), "err", err.Error())
				complete = false
				if w := m.watchOf(gk); w != nil {
					// Keep what runs: discovery failed, not the kind.
					want[gk] = w
				}
			}
			continue
		}
		if mapping.Scope.Name() != meta.RESTScopeNameNamespace {
			m.log.Info("Not watching a cluster-scoped kind: a pod's owners are in its namespace", "kind", gk.String())
			continue
		}
		want[gk] = &watch{gk: gk, gvr: mapping.Resource, spec: k.Spec}
	}
	var started []*watch
	var stopped []schema.GroupKind
	m.lock.Lock()
	for gk, w := range m.watched {
		if nw := want[gk]; nw == nil || nw.gvr != w.gvr || nw.spec != w.spec {
			close(w.stop)
			delete(m.watched, gk)
			stopped = append(stopped, gk)
		}
	}
	m.lock.Unlock()
	for _, gk := range stopped {
		m.dropKind(gk)
	}
	for gk, w := range want {
		m.lock.Lock()
		_, running := m.watched[gk]
		m.lock.Unlock()
		if running {
			continue
		}
		if err := m.probe(ctx, c, w); err != nil {
			m.lock.Lock()
			was := m.denied[gk]
			m.denied[gk] = true
			m.lock.Unlock()
			if !was {
				m.log.Info("Not watching a workload kind the extender may not list: its pods are grouped without it",
					"kind", gk.String(), "err", err.Error(), "fix", fmt.Sprintf("grant the extender get, list and watch on %s.%s", w.gvr.Resource, w.gvr.Group))
			}
			continue
		}
		m.lock.Lock()
		delete(m.denied, gk)
		m.lock.Unlock()
		m.run(c, w)
		started = append(started, w)
	}
	for _, w := range started {
		toolscache.WaitForCacheSync(ctx.Done(), w.reg.HasSynced)
		m.log.Info("Watching a workload kind", "kind", w.gk.String(), "version", w.gvr.Version, "keeps", w.mode())
	}
	m.lock.Lock()
	first := !m.discovered && complete
	m.discovered = m.discovered || complete
	m.unserved = unserved
	m.lock.Unlock()
	if first || len(started) > 0 || len(stopped) > 0 {
		m.remapAll()
	}
	return complete
}

// watchOf is the running watch of gk, nil when none.
func (m *Mapper) watchOf(gk schema.GroupKind) *watch {
	m.lock.Lock()
	defer m.lock.Unlock()
	return m.watched[gk]
}

// probe lists one object, so that a kind the extender may not list is left
// out with a clear log line rather than an informer that retries forever.
func (m *Mapper) probe(ctx context.Context, c Clients, w *watch) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var err error
	if w.spec {
		_, err = c.Dynamic.Resource(w.gvr).List(ctx, metav1.ListOptions{Limit: 1})
	} else {
		_, err = c.Metadata.Resource(w.gvr).List(ctx, metav1.ListOptions{Limit: 1})
	}
	if apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) {
		return err
	}
	if err != nil {
		return fmt.Errorf("list %s: %w", w.gvr.Resource, err)
	}
	return nil
}

// run starts w's informer.
func (m *Mapper) run(c Clients, w *watch) {
	var inf toolscache.SharedIndexInformer
	if w.spec {
		inf = dynamicinformer.NewFilteredDynamicInformer(c.Dynamic, w.gvr, metav1.NamespaceAll, 0, toolscache.Indexers{}, nil).Informer()
		_ = inf.SetTransform(pruneTransform)
	} else {
		inf = metadatainformer.NewFilteredMetadataInformer(c.Metadata, w.gvr, metav1.NamespaceAll, 0, toolscache.Indexers{}, nil).Informer()
		_ = inf.SetTransform(metadataTransform)
	}
	apiVersion := w.gvr.GroupVersion().String()
	upsert := func(obj any) {
		key, n := m.nodeOf(w, apiVersion, obj)
		if n != nil {
			m.objectChanged(key, n)
		}
	}
	reg, _ := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    upsert,
		UpdateFunc: func(_, o any) { upsert(o) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if key, n := m.nodeOf(w, apiVersion, obj); n != nil {
				m.objectChanged(key, nil)
			}
		},
	})
	w.reg, w.stop = reg, make(chan struct{})
	m.lock.Lock()
	m.watched[w.gk] = w
	m.lock.Unlock()
	go inf.Run(w.stop)
}

// nodeOf reads an informer's object.
func (m *Mapper) nodeOf(w *watch, apiVersion string, obj any) (objKey, *node) {
	var mo metav1.Object
	var spec map[string]any
	switch o := obj.(type) {
	case *unstructured.Unstructured:
		mo = o
		spec, _ = o.Object["spec"].(map[string]any)
		apiVersion = o.GetAPIVersion()
	case *metav1.PartialObjectMetadata:
		mo = o
	default:
		return objKey{}, nil
	}
	key := objKey{group: w.gk.Group, kind: w.gk.Kind, namespace: mo.GetNamespace(), name: mo.GetName()}
	n := &node{apiVersion: apiVersion, uid: mo.GetUID(), m: policyMap(apiVersion, w.gk.Kind, mo, spec)}
	if c := metav1.GetControllerOfNoCopy(mo); c != nil {
		cc := *c
		n.controller = &cc
	}
	return key, n
}

// dropKind forgets the objects of a kind no longer watched; rediscover
// then asks about every pod again.
func (m *Mapper) dropKind(gk schema.GroupKind) {
	m.lock.Lock()
	defer m.lock.Unlock()
	for key := range m.objects {
		if key.group == gk.Group && key.kind == gk.Kind {
			delete(m.objects, key)
		}
	}
}

func (m *Mapper) stopAll() {
	m.lock.Lock()
	defer m.lock.Unlock()
	for gk, w := range m.watched {
		close(w.stop)
		delete(m.watched, gk)
	}
}
