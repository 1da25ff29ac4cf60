package workloadmap

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/admission/cycle"
	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/internal/envtestutil"
	. "github.com/partita-dev/partita/internal/partitatest"
	"github.com/partita-dev/partita/policy"
)

// jobSetCRD is enough of JobSet's CRD for the map: the kind, served, with
// its spec kept as it comes (the real CRD runs in the e2e tests).
func jobSetCRD() *apiextensionsv1.CustomResourceDefinition {
	preserve := true
	return &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "jobsets.jobset.x-k8s.io"},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: "jobset.x-k8s.io", Scope: apiextensionsv1.NamespaceScoped,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "jobsets", Singular: "jobset", Kind: "JobSet", ListKind: "JobSetList"},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
				Name: "v1alpha2", Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
					Type: "object", XPreserveUnknownFields: &preserve,
				}},
			}},
		},
	}
}

// createCRD creates crd and waits until it is served.
func createCRD(t *testing.T, cfg *rest.Config, crd *apiextensionsv1.CustomResourceDefinition) {
	t.Helper()
	cs, err := apiextensionsclient.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.ApiextensionsV1().CustomResourceDefinitions().Create(t.Context(), crd, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll(t, 30*time.Second, "CRD "+crd.Name+" established", func() bool {
		cur, err := cs.ApiextensionsV1().CustomResourceDefinitions().Get(t.Context(), crd.Name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		for _, c := range cur.Status.Conditions {
			if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
				return true
			}
		}
		return false
	})
}

// gpuTemplate is a pod template whose pods ask for one GPU.
func gpuTemplate() map[string]any {
	return map[string]any{
		"metadata": map[string]any{"labels": map[string]any{"app": "train"}},
		"spec": map[string]any{"restartPolicy": "Never", "containers": []any{map[string]any{
			"name": "main", "image": "trainer:latest", "command": []any{"python", "train.py", strings.Repeat("--flag ", 100)},
			"resources": map[string]any{"limits": map[string]any{"nvidia.com/gpu": "1"}},
		}}},
	}
}

func jobSet(ns, name string, replicas, parallelism int64) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
		"metadata": map[string]any{"namespace": ns, "name": name},
		"spec": map[string]any{"replicatedJobs": []any{map[string]any{
			"name": "workers", "replicas": replicas,
			"template": map[string]any{"spec": map[string]any{"parallelism": parallelism, "completions": parallelism, "template": gpuTemplate()}},
		}}},
	}}
}

// remapped records the pods the map asks to ask about again.
type remapped struct {
	lock sync.Mutex
	uids []types.UID
}

func (r *remapped) add(uids []types.UID) {
	r.lock.Lock()
	defer r.lock.Unlock()
	r.uids = append(r.uids, uids...)
}

func (r *remapped) reset() {
	r.lock.Lock()
	defer r.lock.Unlock()
	r.uids = nil
}

func (r *remapped) has(uid types.UID) bool {
	r.lock.Lock()
	defer r.lock.Unlock()
	return slices.Contains(r.uids, uid)
}

func startMap(t *testing.T, cfg *rest.Config, engine *policy.Engine, pods PodGetter) (*Mapper, *remapped) {
	t.Helper()
	clients, err := ClientsFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := &remapped{}
	m := New(engine, pods, WithOnChange(r.add))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = m.Start(ctx, clients, make(chan struct{}))
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	poll(t, 30*time.Second, "the map's first discovery", m.Synced)
	return m, r
}

func poll(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func noPods(string, string) (*corev1.Pod, bool) { return nil, false }

// TestMapFollowsOwnersAndKindsThatAppear runs the map on a real API server:
// a Job's pod is a single pod while nothing makes the Job a gang; once the
// JobSet CRD appears and the Job is owned by a JobSet, the pod is a member
// of the JobSet's gang, sized by the JobSet's spec; and a pod whose owner
// is not read yet waits for it.
func TestMapFollowsOwnersAndKindsThatAppear(t *testing.T) {
	cfg, c := envtestutil.Start(t)
	ctx := t.Context()
	engine, err := policy.NewEngine(ctx)
	if err != nil {
		t.Fatal(err)
	}
	m, r := startMap(t, cfg, engine, noPods)
	if !slices.ContainsFunc(m.Kinds(), func(k string) bool { return strings.HasPrefix(k, "Job.batch") }) {
		t.Fatalf("kinds %v lack Job.batch", m.Kinds())
	}
	if slices.ContainsFunc(m.Kinds(), func(k string) bool { return strings.HasPrefix(k, "JobSet") }) {
		t.Fatalf("kinds %v have JobSet before its CRD exists", m.Kinds())
	}

	ns := "team-a"
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	// A pod whose Job does not exist yet waits for it.
	early := MakePod("early-0", ns).GPUCount(1).OwnedBy("Job", "early").Obj()
	early.OwnerReferences[0].UID = "uid-early"
	if got := m.Map(early); !strings.Contains(got.Waiting, "waiting to read Job.batch team-a/early") {
		t.Errorf("a pod of an unread Job: got %+v, want it to wait for the Job", got)
	}

	// The JobSet CRD appears: the map watches JobSets within seconds.
	createCRD(t, cfg, jobSetCRD())
	poll(t, 30*time.Second, "the map to watch JobSets", func() bool {
		return slices.ContainsFunc(m.Kinds(), func(k string) bool { return strings.HasPrefix(k, "JobSet.jobset.x-k8s.io (v1alpha2, with spec)") })
	})

	js := jobSet(ns, "llama-ft", 2, 4)
	if err := c.Create(ctx, js); err != nil {
		t.Fatal(err)
	}
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "llama-ft-workers-0", OwnerReferences: []metav1.OwnerReference{{
			APIVersion: "jobset.x-k8s.io/v1alpha2", Kind: "JobSet", Name: "llama-ft", UID: js.GetUID(), Controller: ptr.To(true),
		}}},
		Spec: batchv1.JobSpec{Parallelism: ptr.To[int32](4), Completions: ptr.To[int32](4), CompletionMode: ptr.To(batchv1.IndexedCompletion),
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "main", Image: "x"}}}}},
	}
	if err := c.Create(ctx, job); err != nil {
		t.Fatal(err)
	}
	pod := MakePod("llama-ft-workers-0-0", ns).GPUCount(1).
		Label("jobset.sigs.k8s.io/replicatedjob-name", "workers").Label("jobset.sigs.k8s.io/job-index", "0").Obj()
	pod.OwnerReferences = []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: job.Name, UID: job.UID, Controller: ptr.To(true)}}
	want := cycle.Mapping{Gang: "jobset-llama-ft", MinMember: 8, Kind: "JobSet", Name: "llama-ft",
		Owner: cycle.Owner{APIVersion: "jobset.x-k8s.io/v1alpha2", Kind: "JobSet", Name: "llama-ft", UID: js.GetUID()}}
	var got cycle.Mapping
	poll(t, 10*time.Second, "the pod to map to its JobSet", func() bool {
		got = m.Map(pod)
		return got.Equal(want)
	})

	// The JobSet grows: the pod is asked about again, and its gang with it.
	if err := c.Get(ctx, client.ObjectKeyFromObject(js), js); err != nil {
		t.Fatal(err)
	}
	if err := unstructured.SetNestedSlice(js.Object, []any{map[string]any{
		"name": "workers", "replicas": int64(3),
		"template": map[string]any{"spec": map[string]any{"parallelism": int64(4), "completions": int64(4), "template": gpuTemplate()}},
	}}, "spec", "replicatedJobs"); err != nil {
		t.Fatal(err)
	}
	r.reset()
	if err := c.Update(ctx, js); err != nil {
		t.Fatal(err)
	}
	poll(t, 10*time.Second, "the pod to be asked about again", func() bool { return r.has(pod.UID) })
	want.MinMember = 12
	if got = m.Map(pod); !got.Equal(want) {
		t.Errorf("after the JobSet grew (-want +got):\n%s", cmp.Diff(want, got))
	}

	// The JobSet asks for a block, in KAI's key, and for each replica
	// within one rack: its pod is asked about again, and joins its
	// replica's sub-group.
	if err := c.Get(ctx, client.ObjectKeyFromObject(js), js); err != nil {
		t.Fatal(err)
	}
	js.SetAnnotations(map[string]string{
		v1alpha1.AnnotationKAITopologyRequired:      "example.com/block",
		v1alpha1.AnnotationSubGroupTopologyRequired: "example.com/rack",
	})
	r.reset()
	if err := c.Update(ctx, js); err != nil {
		t.Fatal(err)
	}
	poll(t, 10*time.Second, "the pod to be asked about again", func() bool { return r.has(pod.UID) })
	want.Topology = v1alpha1.TopologyRequest{Required: "example.com/block"}
	want.SubGroups = []v1alpha1.SubGroup{
		{Name: "workers-0", MinMember: 4, TopologyRequired: "example.com/rack"},
		{Name: "workers-1", MinMember: 4, TopologyRequired: "example.com/rack"},
		{Name: "workers-2", MinMember: 4, TopologyRequired: "example.com/rack"},
	}
	want.SubGroup = "workers-0"
	if got = m.Map(pod); !got.Equal(want) {
		t.Errorf("after the JobSet asked for a topology (-want +got):\n%s", cmp.Diff(want, got))
	}

	// A Job of its own: Indexed and parallel, a gang of its parallelism.
	solo := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "solo"},
		Spec: batchv1.JobSpec{Parallelism: ptr.To[int32](4), Completions: ptr.To[int32](4), CompletionMode: ptr.To(batchv1.IndexedCompletion),
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "main", Image: "x"}}}}},
	}
	if err := c.Create(ctx, solo); err != nil {
		t.Fatal(err)
	}
	soloPod := MakePod("solo-0", ns).GPUCount(1).Obj()
	soloPod.OwnerReferences = []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "solo", UID: solo.UID, Controller: ptr.To(true)}}
	poll(t, 10*time.Second, "the Job's pod to map to its Job", func() bool {
		got = m.Map(soloPod)
		return got.Gang == "job-solo" && got.MinMember == 4
	})
}

// TestMapCarriesTheRulesTopology: what a rule answers of the topology
// reaches the loop's Mapping, and an answer of the wrong shape keeps the
// pod waiting with a message that says what is wrong, never a panic.
func TestMapCarriesTheRulesTopology(t *testing.T) {
	cases := map[string]struct {
		rule string
		want cycle.Mapping
		// wantWaiting is part of the wait message, when the pod waits.
		wantWaiting string
	}{
		"topology and sub-groups": {
			rule: `{"name": "run-a", "minMember": 4, "topology": {"topology": "dc", "required": "example.com/block"},
				"subGroups": [{"name": "r0", "minMember": 2, "topologyRequired": "example.com/rack"}, {"name": "r1", "minMember": 2, "topologyPreferred": "kubernetes.io/hostname"}],
				"subGroup": "r1"}`,
			want: cycle.Mapping{
				Gang: "run-a", MinMember: 4, Kind: "Workload", Name: "run-a",
				Topology: v1alpha1.TopologyRequest{Topology: "dc", Required: "example.com/block"},
				SubGroups: []v1alpha1.SubGroup{
					{Name: "r0", MinMember: 2, TopologyRequired: "example.com/rack"},
					{Name: "r1", MinMember: 2, TopologyPreferred: "kubernetes.io/hostname"},
				},
				SubGroup: "r1",
			},
		},
		"sub-groups of the wrong shape": {
			rule:        `{"name": "run-a", "minMember": 4, "subGroups": [{"name": "r0", "min_member": 2}]}`,
			wantWaiting: `data.partita.workload.gang.subGroups[0] has "min_member"; it may set name, minMember, topologyRequired and topologyPreferred`,
		},
		"a sub-group the gang does not list": {
			rule:        `{"name": "run-a", "minMember": 4, "subGroups": [{"name": "r0", "minMember": 2}], "subGroup": "r9"}`,
			wantWaiting: `data.partita.workload.gang.subGroup "r9" is none of the gang's subGroups`,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			engine, err := policy.NewEngine(ctx)
			if err != nil {
				t.Fatal(err)
			}
			b := policy.DefaultBundle().Overlay(map[string]string{"custom.rego": "package partita.workload.custom\n\nrules contains " + tc.rule + "\n"})
			if _, err := engine.Load(ctx, b, "test"); err != nil {
				t.Fatal(err)
			}
			m := New(engine, noPods)
			m.discovered = true
			got := m.Map(MakePod("run-a-0", "team-a").GPUCount(1).Obj())
			if tc.wantWaiting != "" {
				if got.Gang != "" || !strings.HasPrefix(got.Waiting, "the workload policy (data.partita.workload) failed, so the pod waits") ||
					!strings.Contains(got.Waiting, tc.wantWaiting) {
					t.Errorf("Map = %+v, want it to wait with %q", got, tc.wantWaiting)
				}
				return
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Map (-want +got):\n%s", diff)
			}
		})
	}
}

// TestPodsOfAKindWhoseCRDIsNewWait: a pod owned by an object of a kind the
// rules name waits while that kind's CRD is too new for the map to watch,
// rather than start alone; a pod owned by a kind that truly is not served
// is grouped without it once a discovery pass has said so.
func TestPodsOfAKindWhoseCRDIsNewWait(t *testing.T) {
	cfg, _ := envtestutil.Start(t)
	ctx := t.Context()
	engine, err := policy.NewEngine(ctx)
	if err != nil {
		t.Fatal(err)
	}
	m, r := startMap(t, cfg, engine, noPods)
	// A pod owned by a RayCluster, whose CRD this cluster does not have:
	// it waits for a pass, then is a single pod.
	pod := MakePod("rc-worker", "default").GPUCount(1).Obj()
	pod.OwnerReferences = []metav1.OwnerReference{{APIVersion: "ray.io/v1", Kind: "RayCluster", Name: "rc", UID: "uid-rc", Controller: ptr.To(true)}}
	if got := m.Map(pod); !strings.Contains(got.Waiting, "waiting for the extender to watch RayCluster.ray.io") {
		t.Fatalf("a pod of a kind not watched yet: %+v, want it to wait", got)
	}
	poll(t, 10*time.Second, "the pod asked about again after a discovery pass", func() bool { return r.has(pod.UID) })
	if got := m.Map(pod); !got.Equal(cycle.Mapping{}) {
		t.Errorf("a pod of a kind the API server does not serve: %+v, want a single pod", got)
	}
}

// TestMapLeavesOutKindsItMayNotList: without RBAC for a kind, the map
// watches the others and groups pods without it.
func TestMapLeavesOutKindsItMayNotList(t *testing.T) {
	cfg, c := envtestutil.Start(t)
	ctx := t.Context()
	createCRD(t, cfg, jobSetCRD())
	// The extender's user may read everything but JobSets.
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "reader"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{"batch", "apps", "apiextensions.k8s.io"}, Resources: []string{"*"}, Verbs: []string{"get", "list", "watch"}},
		},
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "reader"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "reader"},
		Subjects:   []rbacv1.Subject{{Kind: "User", Name: "extender"}},
	}
	for _, o := range []client.Object{role, binding} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	user := rest.CopyConfig(cfg)
	user.Impersonate.UserName = "extender"
	engine, err := policy.NewEngine(ctx)
	if err != nil {
		t.Fatal(err)
	}
	m, _ := startMap(t, user, engine, noPods)
	kinds := m.Kinds()
	if slices.ContainsFunc(kinds, func(k string) bool { return strings.HasPrefix(k, "JobSet") }) {
		t.Errorf("kinds %v have JobSet, which the extender may not list", kinds)
	}
	if !slices.ContainsFunc(kinds, func(k string) bool { return strings.HasPrefix(k, "Job.batch") }) {
		t.Errorf("kinds %v lack Job.batch, which the extender may list", kinds)
	}
}

// TestPodsInTheChain: a LeaderWorkerSet's worker pods are owned by a
// StatefulSet that the group's leader pod owns; the map follows the pod.
func TestPodsInTheChain(t *testing.T) {
	cfg, c := envtestutil.Start(t)
	ctx := t.Context()
	leader := MakePod("vllm-0", "default").GPUCount(1).Obj()
	engine, err := policy.NewEngine(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pods := func(ns, name string) (*corev1.Pod, bool) {
		if ns == leader.Namespace && name == leader.Name {
			return leader, true
		}
		return nil, false
	}
	m, _ := startMap(t, cfg, engine, pods)
	sts := &unstructured.Unstructured{}
	sts.SetGroupVersionKind(schema.GroupVersionKind{Group: "apps", Version: "v1", Kind: "StatefulSet"})
	leaderSts := map[string]any{
		"apiVersion": "apps/v1", "kind": "StatefulSet",
		"metadata": map[string]any{"namespace": "default", "name": "vllm-0", "ownerReferences": []any{map[string]any{
			"apiVersion": "v1", "kind": "Pod", "name": "vllm-0", "uid": string(leader.UID), "controller": true,
		}}},
		"spec": map[string]any{
			"selector": map[string]any{"matchLabels": map[string]any{"app": "vllm"}},
			"template": map[string]any{"metadata": map[string]any{"labels": map[string]any{"app": "vllm"}},
				"spec": map[string]any{"containers": []any{map[string]any{"name": "main", "image": "x"}}}},
		},
	}
	sts.Object = leaderSts
	if err := c.Create(ctx, sts); err != nil {
		t.Fatal(err)
	}
	worker := MakePod("vllm-0-1", "default").GPUCount(1).Label("leaderworkerset.sigs.k8s.io/group-index", "0").Obj()
	worker.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "StatefulSet", Name: "vllm-0", UID: sts.GetUID(), Controller: ptr.To(true)}}
	// No LeaderWorkerSet CRD: the chain ends at the leader pod, which owns
	// nothing the rules know, so the worker is a single pod, and says
	// nothing of waiting.
	poll(t, 10*time.Second, "the worker to map", func() bool {
		got := m.Map(worker)
		return got.Waiting == "" && got.Gang == ""
	})
	in, deps, waiting := m.resolveLocked(worker)
	if waiting != "" {
		t.Fatalf("worker waits: %s", waiting)
	}
	var kinds []string
	for _, o := range in.Chain {
		kinds = append(kinds, fmt.Sprint(o.Map()["kind"], "/", o.Map()["name"]))
	}
	if diff := cmp.Diff([]string{"StatefulSet/vllm-0", "Pod/vllm-0"}, kinds); diff != "" {
		t.Errorf("chain (-want +got):\n%s", diff)
	}
	if len(deps) != 1 {
		t.Errorf("deps %v, want the StatefulSet", deps)
	}
}

// resolveLocked is resolve with the lock taken, for tests.
func (m *Mapper) resolveLocked(pod *corev1.Pod) (*policy.WorkloadInput, []objKey, string) {
	m.lock.Lock()
	defer m.lock.Unlock()
	return m.resolve(pod, time.Now())
}

func TestPruneKeepsWhatTheRulesRead(t *testing.T) {
	rc := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "ray.io/v1", "kind": "RayCluster",
		"metadata": map[string]any{"namespace": "ns", "name": "rc", "uid": "u1", "resourceVersion": "7",
			"labels":        map[string]any{"team": "a"},
			"annotations":   map[string]any{corev1.LastAppliedConfigAnnotation: "{...}", "note": "kept"},
			"managedFields": []any{map[string]any{"manager": "kubectl"}}},
		"spec": map[string]any{
			"rayVersion":    "2.9.0",
			"headGroupSpec": map[string]any{"rayStartParams": map[string]any{}, "template": map[string]any{"spec": map[string]any{"containers": []any{map[string]any{"name": "head", "image": "ray"}}}}},
			"workerGroupSpecs": []any{map[string]any{"groupName": "gpu", "minReplicas": int64(2), "maxReplicas": int64(6), "replicas": int64(2),
				"template": gpuTemplate()}},
		},
		"status": map[string]any{"state": "ready"},
	}}
	out, err := pruneTransform(rc)
	if err != nil {
		t.Fatal(err)
	}
	got := out.(*unstructured.Unstructured).Object
	want := map[string]any{
		"apiVersion": "ray.io/v1", "kind": "RayCluster",
		"metadata": map[string]any{"namespace": "ns", "name": "rc", "uid": "u1", "resourceVersion": "7",
			"labels": map[string]any{"team": "a"}, "annotations": map[string]any{"note": "kept"}},
		"spec": map[string]any{
			"rayVersion": "2.9.0",
			"headGroupSpec": map[string]any{"rayStartParams": map[string]any{}, "template": map[string]any{
				"metadata": map[string]any{}, "gpu": false,
				"spec": map[string]any{"containers": []any{map[string]any{"name": "head"}}, "initContainers": []any{}},
			}},
			"workerGroupSpecs": []any{map[string]any{"groupName": "gpu", "minReplicas": int64(2), "maxReplicas": int64(6), "replicas": int64(2),
				"template": map[string]any{
					"metadata": map[string]any{"labels": map[string]any{"app": "train"}}, "gpu": true,
					"spec": map[string]any{"initContainers": []any{}, "containers": []any{map[string]any{"name": "main",
						"resources": map[string]any{"limits": map[string]any{"nvidia.com/gpu": "1"}}}}},
				}}},
		},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("pruned (-want +got):\n%s", diff)
	}
}
