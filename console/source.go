package console

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/go-logr/logr"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/dra"
	"github.com/partita-dev/partita/policy"
	"github.com/partita-dev/partita/report"
)

// DiscoverCoverage works out what the credentials behind authz may list
// and watch, for a Source that runs with them. In local mode they are the
// user's: a user who may list pods in some namespaces only gets informers
// for those. The namespaces to try are every namespace when the user may
// list them, else extra (the kubeconfig's namespace) and the namespaces the
// queues name.
//
// served says which of the APIs that a cluster may lack it serves: only
// those are tried.
func DiscoverCoverage(ctx context.Context, authz Authorizer, r client.Reader, partitaNamespace string, extra []string, served ServedAPIs) (Coverage, error) {
	var u UserInfo // SelfReviewer ignores it; SubjectReviewer is not used here
	can := func(group, res, ns string) (bool, error) {
		for _, verb := range []string{"list", "watch"} {
			ok, err := authz.Allowed(ctx, u, Attributes{Verb: verb, Group: group, Resource: res, Namespace: ns})
			if err != nil || !ok {
				return false, err
			}
		}
		return true, nil
	}
	var cov Coverage
	var err error
	for _, c := range []struct {
		group, res string
		dst        *bool
	}{
		{groupPartita, "gpunodes", &cov.GPUNodes},
		{"", "nodes", &cov.Nodes},
		{groupPartita, "queues", &cov.Queues},
	} {
		if *c.dst, err = can(c.group, c.res, ""); err != nil {
			return Coverage{}, err
		}
	}
	if cov.Policy, err = can("", "configmaps", partitaNamespace); err != nil {
		return Coverage{}, err
	}
	if served.DRA {
		if cov.DeviceClasses, err = can(resourceapi.GroupName, "deviceclasses", ""); err != nil {
			return Coverage{}, err
		}
	}
	if served.Topologies {
		if cov.Topologies, err = can(groupPartita, "topologies", ""); err != nil {
			return Coverage{}, err
		}
	}

	var candidates []string
	candidatesRead := false
	namespaced := []struct {
		group, res string
		dst        *NamespaceSet
	}{
		{"", "pods", &cov.Pods},
		{groupPartita, "podgroups", &cov.PodGroups},
		{batchv1.GroupName, "jobs", &cov.Jobs},
	}
	if served.Models {
		namespaced = append(namespaced, struct {
			group, res string
			dst        *NamespaceSet
		}{groupPartita, "models", &cov.Models})
	}
	if served.DRA {
		namespaced = append(namespaced, []struct {
			group, res string
			dst        *NamespaceSet
		}{
			{resourceapi.GroupName, "resourceclaims", &cov.ResourceClaims},
			{resourceapi.GroupName, "resourceclaimtemplates", &cov.ResourceClaimTemplates},
		}...)
	}
	for _, c := range namespaced {
		all, err := can(c.group, c.res, "")
		if err != nil {
			return Coverage{}, err
		}
		if all {
			*c.dst = AllNamespaces()
			continue
		}
		if !candidatesRead {
			if candidates, err = candidateNamespaces(ctx, can, r, cov.Queues, extra); err != nil {
				return Coverage{}, err
			}
			candidatesRead = true
		}
		set := Namespaces()
		for _, ns := range candidates {
			ok, err := can(c.group, c.res, ns)
			if err != nil {
				return Coverage{}, err
			}
			if ok {
				set.Names[ns] = true
			}
		}
		*c.dst = set
	}
	return cov, nil
}

// ServedAPIs says which APIs that a cluster may lack its API server
// serves (ServesAPIs).
type ServedAPIs struct {
	// DRA: resource.k8s.io/v1's claims, templates and DeviceClasses.
	DRA bool
	// Topologies: partita.dev's Topology, which Partita's CRDs of before
	// it lack.
	Topologies bool
	// Models: partita.dev's Model, likewise.
	Models bool
}

// ServesAPIs asks the API server's discovery which of ServedAPIs it serves.
func ServesAPIs(cfg *rest.Config) (ServedAPIs, error) {
	var s ServedAPIs
	var err error
	if s.DRA, err = dra.Served(cfg, "resourceclaims", "resourceclaimtemplates", "deviceclasses"); err != nil {
		return ServedAPIs{}, fmt.Errorf("ask the API server whether it serves DRA: %w", err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return ServedAPIs{}, fmt.Errorf("create discovery client: %w", err)
	}
	list, err := dc.ServerResourcesForGroupVersion(v1alpha1.GroupVersion.String())
	switch {
	case apierrors.IsNotFound(err):
		// No Partita CRDs at all: Start says so when it watches GPUNodes.
	case err != nil:
		return ServedAPIs{}, fmt.Errorf("discover %s: %w", v1alpha1.GroupVersion, err)
	default:
		s.Topologies = slices.ContainsFunc(list.APIResources, func(r metav1.APIResource) bool { return r.Name == "topologies" })
		s.Models = slices.ContainsFunc(list.APIResources, func(r metav1.APIResource) bool { return r.Name == "models" })
	}
	return s, nil
}

func candidateNamespaces(ctx context.Context, can func(group, res, ns string) (bool, error), r client.Reader, queues bool, extra []string) ([]string, error) {
	set := map[string]bool{}
	for _, ns := range extra {
		if ns != "" {
			set[ns] = true
		}
	}
	listNS, err := can("", "namespaces", "")
	if err != nil {
		return nil, err
	}
	if listNS {
		var l corev1.NamespaceList
		if err := r.List(ctx, &l); err != nil {
			return nil, fmt.Errorf("list namespaces: %w", err)
		}
		for _, ns := range l.Items {
			set[ns.Name] = true
		}
	} else if queues {
		var l v1alpha1.QueueList
		if err := r.List(ctx, &l); err != nil && !apierrors.IsForbidden(err) {
			return nil, fmt.Errorf("list queues: %w", err)
		}
		for _, q := range l.Items {
			for _, ns := range q.Spec.Namespaces {
				set[ns] = true
			}
		}
	}
	out := make([]string, 0, len(set))
	for ns := range set {
		out = append(out, ns)
	}
	sort.Strings(out)
	return out, nil
}

// syncTimeout bounds the informers' first sync.
const syncTimeout = 2 * time.Minute

// SourceOptions configure a Source.
type SourceOptions struct {
	// Config are the credentials the informers run with.
	Config *rest.Config
	// Scheme knows Partita's types.
	Scheme *runtime.Scheme
	// Coverage is what to watch (DiscoverCoverage).
	Coverage Coverage
	// PartitaNamespace holds the policy ConfigMaps.
	PartitaNamespace string
	// Clock dates changes.
	Clock clock.PassiveClock
	// Log receives the informers' trouble.
	Log logr.Logger
}

// Source is the console's informers and the lists read from them. Each
// change marks the Source dirty; Changes wakes the snapshot builder.
type Source struct {
	opts    SourceOptions
	cache   cache.Cache
	changes chan struct{}

	lock sync.Mutex
	// changedAt is the first change not yet taken by Take, zero when none.
	changedAt time.Time
}

// NewSource makes the informers of opts.Coverage; Start runs them.
func NewSource(opts SourceOptions) (*Source, error) {
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	cov := opts.Coverage
	byObject := map[client.Object]cache.ByObject{}
	scoped := func(set NamespaceSet) map[string]cache.Config {
		if set.All {
			return nil
		}
		m := map[string]cache.Config{}
		for ns := range set.Names {
			m[ns] = cache.Config{}
		}
		return m
	}
	byObject[&corev1.Pod{}] = cache.ByObject{Namespaces: scoped(cov.Pods), Transform: slimPod}
	byObject[&v1alpha1.PodGroup{}] = cache.ByObject{Namespaces: scoped(cov.PodGroups)}
	byObject[&v1alpha1.Model{}] = cache.ByObject{Namespaces: scoped(cov.Models)}
	byObject[&batchv1.Job{}] = cache.ByObject{Namespaces: scoped(cov.Jobs), Transform: slimJob}
	byObject[&corev1.Node{}] = cache.ByObject{Transform: slimNode}
	byObject[&resourceapi.ResourceClaim{}] = cache.ByObject{Namespaces: scoped(cov.ResourceClaims)}
	byObject[&resourceapi.ResourceClaimTemplate{}] = cache.ByObject{Namespaces: scoped(cov.ResourceClaimTemplates)}
	byObject[&corev1.ConfigMap{}] = cache.ByObject{
		Namespaces: map[string]cache.Config{opts.PartitaNamespace: {}},
		Label:      labels.SelectorFromSet(labels.Set{v1alpha1.LabelPolicy: policy.PolicyLabelValue}),
		Transform:  slimConfigMap,
	}
	c, err := cache.New(opts.Config, cache.Options{
		Scheme: opts.Scheme, ByObject: byObject, DefaultTransform: cache.TransformStripManagedFields(),
		ReaderFailOnMissingInformer: true,
	})
	if err != nil {
		return nil, fmt.Errorf("create the console's informers: %w", err)
	}
	return &Source{opts: opts, cache: c, changes: make(chan struct{}, 1)}, nil
}

// watched are the objects the Source has informers for.
func (s *Source) watched() []client.Object {
	cov := s.opts.Coverage
	var out []client.Object
	add := func(ok bool, o client.Object) {
		if ok {
			out = append(out, o)
		}
	}
	add(cov.GPUNodes, &v1alpha1.GPUNode{})
	add(cov.Nodes, &corev1.Node{})
	add(cov.Queues, &v1alpha1.Queue{})
	add(cov.Topologies, &v1alpha1.Topology{})
	add(cov.Policy, &corev1.ConfigMap{})
	add(cov.Pods.All || len(cov.Pods.Names) > 0, &corev1.Pod{})
	add(cov.PodGroups.All || len(cov.PodGroups.Names) > 0, &v1alpha1.PodGroup{})
	add(cov.Jobs.All || len(cov.Jobs.Names) > 0, &batchv1.Job{})
	add(cov.Models.All || len(cov.Models.Names) > 0, &v1alpha1.Model{})
	add(cov.ResourceClaims.All || len(cov.ResourceClaims.Names) > 0, &resourceapi.ResourceClaim{})
	add(cov.ResourceClaimTemplates.All || len(cov.ResourceClaimTemplates.Names) > 0, &resourceapi.ResourceClaimTemplate{})
	add(cov.DeviceClasses, &resourceapi.DeviceClass{})
	return out
}

// Start runs the informers until ctx ends and returns once they have
// synced, or with the error that stops them.
func (s *Source) Start(ctx context.Context) error {
	for _, o := range s.watched() {
		inf, err := s.cache.GetInformer(ctx, o)
		if isNoMatch(err) {
			return fmt.Errorf("watch %T: %w", o, report.ErrNoCRDs)
		}
		if err != nil {
			return fmt.Errorf("watch %T: %w", o, err)
		}
		if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { s.mark() },
			UpdateFunc: func(any, any) { s.mark() },
			DeleteFunc: func(any) { s.mark() },
		}); err != nil {
			return fmt.Errorf("watch %T: %w", o, err)
		}
	}
	errs := make(chan error, 1)
	go func() { errs <- s.cache.Start(ctx) }()
	// An informer the API server keeps refusing retries for ever: give up
	// after a while and say so, rather than hang without a word.
	syncCtx, cancel := context.WithTimeout(ctx, syncTimeout)
	defer cancel()
	synced := make(chan bool, 1)
	go func() { synced <- s.cache.WaitForCacheSync(syncCtx) }()
	select {
	case err := <-errs:
		if err == nil {
			err = ctx.Err()
		}
		return fmt.Errorf("run the console's informers: %w", err)
	case ok := <-synced:
		if !ok {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("the console's informers did not sync within %s: the API server is slow or refuses a list or watch it allowed at first (run with --v=2 to see which)", syncTimeout)
		}
	}
	s.mark()
	return nil
}

// mark records a change and wakes the builder.
func (s *Source) mark() {
	s.lock.Lock()
	if s.changedAt.IsZero() {
		s.changedAt = s.opts.Clock.Now()
	}
	s.lock.Unlock()
	select {
	case s.changes <- struct{}{}:
	default:
	}
}

// Pending reports whether changes came since the last Take.
func (s *Source) Pending() bool {
	s.lock.Lock()
	defer s.lock.Unlock()
	return !s.changedAt.IsZero()
}

// Wake wakes the builder again when changes are pending (Changes).
func (s *Source) Wake() {
	if !s.Pending() {
		return
	}
	select {
	case s.changes <- struct{}{}:
	default:
	}
}

// Changes receives a value after changes; Take then says since when.
func (s *Source) Changes() <-chan struct{} { return s.changes }

// Take returns when the first change since the last Take arrived, and
// clears it.
func (s *Source) Take() time.Time {
	s.lock.Lock()
	defer s.lock.Unlock()
	t := s.changedAt
	s.changedAt = time.Time{}
	return t
}

// Untake puts back changes Take returned (at, when the first came) that
// were not built after all.
func (s *Source) Untake(at time.Time) {
	if at.IsZero() {
		return
	}
	s.lock.Lock()
	defer s.lock.Unlock()
	if s.changedAt.IsZero() || at.Before(s.changedAt) {
		s.changedAt = at
	}
}

// Lists reads every watched object from the informers. The objects are the
// informers' own (no copy): the snapshot treats them as read-only.
func (s *Source) Lists(ctx context.Context) (Lists, error) {
	l := Lists{Coverage: s.opts.Coverage}
	cov := s.opts.Coverage
	list := func(ok bool, o client.ObjectList) error {
		if !ok {
			return nil
		}
		if err := s.cache.List(ctx, o, client.UnsafeDisableDeepCopy); err != nil {
			return fmt.Errorf("read %T from the informers: %w", o, err)
		}
		return nil
	}
	var (
		gns  v1alpha1.GPUNodeList
		ns   corev1.NodeList
		qs   v1alpha1.QueueList
		ts   v1alpha1.TopologyList
		cms  corev1.ConfigMapList
		pods corev1.PodList
		pgs  v1alpha1.PodGroupList
		jobs batchv1.JobList
		mds  v1alpha1.ModelList
		rcs  resourceapi.ResourceClaimList
		rcts resourceapi.ResourceClaimTemplateList
		dcs  resourceapi.DeviceClassList
	)
	for _, x := range []struct {
		ok bool
		o  client.ObjectList
	}{
		{cov.GPUNodes, &gns}, {cov.Nodes, &ns}, {cov.Queues, &qs}, {cov.Topologies, &ts}, {cov.Policy, &cms},
		{cov.Pods.All || len(cov.Pods.Names) > 0, &pods},
		{cov.PodGroups.All || len(cov.PodGroups.Names) > 0, &pgs},
		{cov.Jobs.All || len(cov.Jobs.Names) > 0, &jobs},
		{cov.Models.All || len(cov.Models.Names) > 0, &mds},
		{cov.ResourceClaims.All || len(cov.ResourceClaims.Names) > 0, &rcs},
		{cov.ResourceClaimTemplates.All || len(cov.ResourceClaimTemplates.Names) > 0, &rcts},
		{cov.DeviceClasses, &dcs},
	} {
		if err := list(x.ok, x.o); err != nil {
			return Lists{}, err
		}
	}
	l.GPUNodes, l.Nodes, l.Queues, l.PolicyConfigMaps = gns.Items, ns.Items, qs.Items, cms.Items
	l.Topologies = ts.Items
	l.Pods, l.PodGroups, l.Jobs = pods.Items, pgs.Items, jobs.Items
	l.Models = mds.Items
	l.ResourceClaims, l.ResourceClaimTemplates, l.DeviceClasses = rcs.Items, rcts.Items, dcs.Items
	// Informer order is a map's: sort so that equal clusters give equal
	// snapshots.
	slices.SortFunc(l.Pods, func(a, b corev1.Pod) int { return compareNsName(a.Namespace, a.Name, b.Namespace, b.Name) })
	slices.SortFunc(l.GPUNodes, func(a, b v1alpha1.GPUNode) int { return compareNsName("", a.Name, "", b.Name) })
	return l, nil
}

func compareNsName(ans, an, bns, bn string) int {
	switch {
	case ans < bns:
		return -1
	case ans > bns:
		return 1
	case an < bn:
		return -1
	case an > bn:
		return 1
	}
	return 0
}

// lastApplied is kubectl's copy of the applied object: large, never read.
const lastApplied = "kubectl.kubernetes.io/last-applied-configuration"

// slimPod drops from a cached pod what no view reads: managed fields, the
// last-applied copy, volumes and most of the status. Kept: what
// gpu.ParsePod, the ledger and why read (annotations, labels, containers'
// resources, gates, node selection, tolerations, phase, conditions).
func slimPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	p.ManagedFields = nil
	delete(p.Annotations, lastApplied)
	p.Spec.Volumes = nil
	for i := range p.Spec.Containers {
		c := &p.Spec.Containers[i]
		c.Env, c.EnvFrom, c.VolumeMounts, c.LivenessProbe, c.ReadinessProbe, c.StartupProbe = nil, nil, nil, nil, nil, nil
	}
	p.Spec.InitContainers = slimContainers(p.Spec.InitContainers)
	p.Status.InitContainerStatuses = nil
	p.Status.EphemeralContainerStatuses = nil
	return p, nil
}

func slimContainers(cs []corev1.Container) []corev1.Container {
	for i := range cs {
		c := &cs[i]
		c.Env, c.EnvFrom, c.VolumeMounts, c.LivenessProbe, c.ReadinessProbe, c.StartupProbe = nil, nil, nil, nil, nil, nil
	}
	return cs
}

// slimNode keeps what the map (topology labels) and why (labels, taints,
// cordon) read.
func slimNode(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	n.ManagedFields = nil
	n.Annotations = nil
	n.Status = corev1.NodeStatus{}
	return n, nil
}

// slimJob keeps the Job's identity, suspend and counts, not its template.
func slimJob(obj any) (any, error) {
	j, ok := obj.(*batchv1.Job)
	if !ok {
		return obj, nil
	}
	j.ManagedFields = nil
	delete(j.Annotations, lastApplied)
	j.Spec.Template = corev1.PodTemplateSpec{}
	return j, nil
}

// slimConfigMap keeps a policy ConfigMap's status annotation, not its Rego.
func slimConfigMap(obj any) (any, error) {
	cm, ok := obj.(*corev1.ConfigMap)
	if !ok {
		return obj, nil
	}
	cm.ManagedFields = nil
	cm.Data, cm.BinaryData = nil, nil
	delete(cm.Annotations, lastApplied)
	return cm, nil
}

// isNoMatch reports a cluster without Partita's CRDs.
func isNoMatch(err error) bool { return meta.IsNoMatchError(err) }
