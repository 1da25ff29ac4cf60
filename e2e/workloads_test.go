package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/devcluster"
)

// The workload map's end-to-end tests (docs/workloads.md): real JobSet,
// LeaderWorkerSet and KubeRay controllers, built from their releases by
// `make cluster-bins` and run by `partita dev up --addons`, create their
// pods; the webhook gates them, the workload map groups them by the Rego
// rules, and the admission loop admits each workload whole. Each test adds
// simulated nodes of its own, so that its pods compete only with each
// other.

// needAddon skips a test whose controller is not built, except in CI,
// where `make cluster-bins` builds them all.
func needAddon(t *testing.T, name string) {
	t.Helper()
	if slices.Contains(addons, name) {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("addon %s is not built: CI runs 'make cluster-bins', which builds it", name)
	}
	t.Skipf("addon %s is not built: run 'make cluster-bins' (or ADDONS=%s bash e2e/clusterbins/build.sh)", name, name)
}

// apply creates the objects of a YAML manifest as the admin.
func apply(ctx context.Context, t *testing.T, manifest string) {
	t.Helper()
	cfg, err := cluster.RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	if err := devcluster.Apply(ctx, cfg, []byte(manifest)); err != nil {
		t.Fatalf("apply:\n%s\n%v", manifest, err)
	}
}

// workloadNodes adds n simulated nodes of gpus H100s each, labelled for the
// test alone, and returns the label.
func workloadNodes(ctx context.Context, t *testing.T, prefix string, n, gpus int) map[string]string {
	t.Helper()
	labels := map[string]string{"e2e.partita.dev/pool": prefix}
	for i := range n {
		addGPUNode(ctx, t, fmt.Sprintf("%s-%d", prefix, i), gpus, labels)
	}
	return labels
}

// podState sorts a namespace's pods (of a label selector) into those the
// admission loop let go (bound, or ungated and about to be) and those it
// holds, with a line each for failure messages.
func podState(ctx context.Context, t *testing.T, ns, selector string) (bound, waiting []corev1.Pod, seen string) {
	t.Helper()
	pods, err := clientset.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatalf("list pods: %v", err)
	}
	var lines []string
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil {
			continue
		}
		state := "gated"
		switch {
		case p.Spec.NodeName != "":
			bound = append(bound, p)
			state = "on " + p.Spec.NodeName + " " + string(p.Status.Phase)
		case !gated(&p):
			bound = append(bound, p)
			state = "admitted, not bound yet"
		default:
			waiting = append(waiting, p)
			if c := admissionCondition(&p); c != nil {
				state += ": " + c.Reason + ": " + c.Message
			}
		}
		lines = append(lines, p.Name+" "+state)
	}
	slices.Sort(lines)
	return bound, waiting, strings.Join(lines, "\n")
}

// holdsNone checks, for d, that no pod of the selector is bound, and
// returns the pods that wait.
func holdsNone(ctx context.Context, t *testing.T, ns, selector string, want int, d time.Duration) []corev1.Pod {
	t.Helper()
	var waiting []corev1.Pod
	poll(t, 2*time.Minute, fmt.Sprintf("%d pods of %s waiting", want, selector), func() (bool, string) {
		bound, w, seen := podState(ctx, t, ns, selector)
		if len(bound) > 0 {
			t.Fatalf("a pod of a workload too big for the free GPUs was bound:\n%s", seen)
		}
		waiting = w
		return len(w) == want, seen
	})
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if bound, _, seen := podState(ctx, t, ns, selector); len(bound) > 0 {
			t.Fatalf("a pod of a workload too big for the free GPUs was bound:\n%s", seen)
		}
		time.Sleep(500 * time.Millisecond)
	}
	return waiting
}

// waitMappedPodGroup waits for the PodGroup the admission loop keeps for a
// mapped workload to reach phase, and returns it.
func waitMappedPodGroup(ctx context.Context, t *testing.T, ns, name string, phases ...v1alpha1.PodGroupPhase) *v1alpha1.PodGroup {
	t.Helper()
	c := crClient(t)
	var pg v1alpha1.PodGroup
	poll(t, 2*time.Minute, fmt.Sprintf("PodGroup %s/%s in phase %v", ns, name, phases), func() (bool, string) {
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &pg); err != nil {
			return false, err.Error()
		}
		return slices.Contains(phases, pg.Status.Phase), fmt.Sprintf("phase %q, reason %q, spec %+v", pg.Status.Phase, pg.Status.Reason, pg.Spec)
	})
	return &pg
}

// TestJobSetStartsWhole: a JobSet of 6 GPU pods on 4 free GPUs starts no
// pod; once a node adds room it starts whole, and its PodGroup, owned by
// the JobSet, says so.
func TestJobSetStartsWhole(t *testing.T) {
	needAddon(t, "jobset")
	ctx := testContext(t, 6*time.Minute)
	ns := extNamespace(ctx, t, clientset)
	pool := workloadNodes(ctx, t, "js", 2, 2)
	apply(ctx, t, fmt.Sprintf(`apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata: {name: llama-ft, namespace: %s}
spec:
  replicatedJobs:
  - name: workers
    replicas: 3
    template:
      spec:
        parallelism: 2
        completions: 2
        backoffLimit: 0
        template:
          spec:
            restartPolicy: Never
            nodeSelector: {e2e.partita.dev/pool: %s}
            containers:
            - name: train
              image: registry.k8s.io/pause:3.10
              resources: {limits: {nvidia.com/gpu: "1"}}
`, ns, pool["e2e.partita.dev/pool"]))
	sel := "jobset.sigs.k8s.io/jobset-name=llama-ft"
	waiting := holdsNone(ctx, t, ns, sel, 6, 5*time.Second)
	poll(t, 30*time.Second, "the JobSet's pods named after it", func() (bool, string) {
		_, waiting, seen := podState(ctx, t, ns, sel)
		for _, p := range waiting {
			if kind, name, pg := v1alpha1.WorkloadOf(&p); kind != "JobSet" || name != "llama-ft" || pg != "jobset-llama-ft" {
				return false, fmt.Sprintf("pod %s: %v\n%s", p.Name, p.Annotations, seen)
			}
		}
		return true, ""
	})
	pg := waitMappedPodGroup(ctx, t, ns, "jobset-llama-ft", v1alpha1.PodGroupPending)
	if pg.Spec.MinMember != 6 || !strings.Contains(pg.Status.Reason, "gang needs 6 × 1 GPU; at most 4 fit now") {
		t.Errorf("PodGroup spec %+v, reason %q; want minMember 6 and a reason with the numbers", pg.Spec, pg.Status.Reason)
	}
	if len(pg.OwnerReferences) != 1 || pg.OwnerReferences[0].Kind != "JobSet" || pg.OwnerReferences[0].Name != "llama-ft" {
		t.Errorf("PodGroup owners %+v, want the JobSet", pg.OwnerReferences)
	}
	why, err := partita(ctx, "ctl", "why", "--kubeconfig", cluster.KubeconfigPath(), "-n", ns, waiting[0].Name)
	if err != nil || !strings.Contains(why, "JobSet "+ns+"/llama-ft (pod "+waiting[0].Name+") waits") {
		t.Errorf("kubectl partita why does not name the JobSet: %v\n%s", err, why)
	}

	// Room appears: the whole JobSet starts at once.
	addGPUNode(ctx, t, "js-2", 2, pool)
	poll(t, 2*time.Minute, "the JobSet's 6 pods bound", func() (bool, string) {
		bound, _, seen := podState(ctx, t, ns, sel)
		return len(bound) == 6, seen
	})
	waitMappedPodGroup(ctx, t, ns, "jobset-llama-ft", v1alpha1.PodGroupRunning)
}

// TestLeaderWorkerSetGroupsAreGangs: each group of a LeaderWorkerSet (a
// leader and its workers, made by the real LWS controller through a
// StatefulSet the leader pod owns) is a gang of its own: with room for one
// group, one starts whole and the other waits whole.
func TestLeaderWorkerSetGroupsAreGangs(t *testing.T) {
	needAddon(t, "lws")
	ctx := testContext(t, 6*time.Minute)
	ns := extNamespace(ctx, t, clientset)
	pool := workloadNodes(ctx, t, "lws", 1, 4)
	apply(ctx, t, fmt.Sprintf(`apiVersion: leaderworkerset.x-k8s.io/v1
kind: LeaderWorkerSet
metadata: {name: vllm, namespace: %s}
spec:
  replicas: 2
  leaderWorkerTemplate:
    size: 3
    workerTemplate:
      spec:
        nodeSelector: {e2e.partita.dev/pool: %s}
        containers:
        - name: vllm
          image: registry.k8s.io/pause:3.10
          resources: {limits: {nvidia.com/gpu: "1"}}
`, ns, pool["e2e.partita.dev/pool"]))
	sel := "leaderworkerset.sigs.k8s.io/name=vllm"
	groups := func(pods []corev1.Pod) map[string]int {
		out := map[string]int{}
		for _, p := range pods {
			out[p.Labels["leaderworkerset.sigs.k8s.io/group-index"]]++
		}
		return out
	}
	var first string
	poll(t, 3*time.Minute, "one LWS group of 3 bound, the other waiting whole", func() (bool, string) {
		bound, waiting, seen := podState(ctx, t, ns, sel)
		b, w := groups(bound), groups(waiting)
		for g, n := range b {
			if n != 3 {
				// The loop ungates a gang's members with one write each, in
				// parallel: a list between them sees part of a group go. A
				// group admitted in part stays so.
				time.Sleep(3 * time.Second)
				if again, _, seen := podState(ctx, t, ns, sel); groups(again)[g] != 3 {
					t.Fatalf("group %s is admitted in part (%d of 3):\n%s", g, groups(again)[g], seen)
				}
				return false, seen
			}
			first = g
		}
		return len(b) == 1 && len(w) == 1 && len(waiting) == 3, seen
	})
	other := map[string]string{"0": "1", "1": "0"}[first]
	waitMappedPodGroup(ctx, t, ns, "leaderworkerset-vllm-"+first, v1alpha1.PodGroupRunning)
	pg := waitMappedPodGroup(ctx, t, ns, "leaderworkerset-vllm-"+other, v1alpha1.PodGroupPending)
	if pg.Annotations[v1alpha1.AnnotationWorkload] != "LeaderWorkerSet/vllm group "+other {
		t.Errorf("PodGroup annotation %q, want the LWS group", pg.Annotations[v1alpha1.AnnotationWorkload])
	}
	// Room for the second group.
	addGPUNode(ctx, t, "lws-1", 4, pool)
	poll(t, 2*time.Minute, "both LWS groups bound", func() (bool, string) {
		bound, _, seen := podState(ctx, t, ns, sel)
		return len(bound) == 6, seen
	})
}

// TestRayClusterGrowsElasticAndGivesBackFirst: a RayCluster of min 2 / max
// 6 GPU workers starts at its minimum, grows as room allows when its
// replicas are raised (as Ray's autoscaler does), and when another queue's
// gang needs room, the elastic workers are evicted first, one by one, and
// its minimum keeps running.
func TestRayClusterGrowsElasticAndGivesBackFirst(t *testing.T) {
	needAddon(t, "kuberay")
	ctx := testContext(t, 8*time.Minute)
	ns := extNamespace(ctx, t, clientset)
	pool := workloadNodes(ctx, t, "ray", 1, 4)
	poolName := pool["e2e.partita.dev/pool"]
	raycluster := func(replicas int) string {
		return fmt.Sprintf(`apiVersion: ray.io/v1
kind: RayCluster
metadata: {name: rc, namespace: %s}
spec:
  rayVersion: "2.9.0"
  headGroupSpec:
    rayStartParams: {}
    template:
      spec:
        nodeSelector: {e2e.partita.dev/pool: %s}
        containers:
        - {name: ray-head, image: registry.k8s.io/pause:3.10}
  workerGroupSpecs:
  - groupName: gpu
    replicas: %d
    minReplicas: 2
    maxReplicas: 6
    rayStartParams: {}
    template:
      spec:
        nodeSelector: {e2e.partita.dev/pool: %s}
        containers:
        - name: ray-worker
          image: registry.k8s.io/pause:3.10
          resources: {limits: {nvidia.com/gpu: "1"}}
`, ns, poolName, replicas, poolName)
	}
	workers := "ray.io/cluster=rc,ray.io/node-type=worker"
	apply(ctx, t, raycluster(2))
	poll(t, 2*time.Minute, "the RayCluster's 2 minimum workers bound", func() (bool, string) {
		bound, waiting, seen := podState(ctx, t, ns, workers)
		return len(bound) == 2 && len(waiting) == 0, seen
	})
	pg := waitMappedPodGroup(ctx, t, ns, "raycluster-rc", v1alpha1.PodGroupRunning)
	if pg.Spec.MinMember != 2 {
		t.Errorf("PodGroup minMember %d, want 2 (the head asks for no GPU)", pg.Spec.MinMember)
	}

	// The autoscaler asks for 6: 2 more fit, 2 wait as elastic members.
	apply(ctx, t, raycluster(6))
	poll(t, 2*time.Minute, "the RayCluster grown to 4 workers, 2 elastic ones waiting", func() (bool, string) {
		bound, waiting, seen := podState(ctx, t, ns, workers)
		return len(bound) == 4 && len(waiting) == 2, seen
	})
	_, waiting, _ := podState(ctx, t, ns, workers)
	waitEvent(ctx, t, ns, waiting[0].Name, v1alpha1.ReasonWaitingForCapacity, "elastic member(s) beyond it wait for room that no workload's minimum wants")
	before, _, _ := podState(ctx, t, ns, workers)
	started := map[string]bool{}
	for _, p := range before {
		started[p.Name] = true
	}

	// Another queue's gang of 2 needs the room: two elastic workers go,
	// the minimum stays.
	nsB := extNamespace(ctx, t, clientset)
	ensureGPUPriorityClass(ctx, t, clientset)
	createQueue(ctx, t, gpuQueue(nsB, nsB, "2", "-1", 1))
	gang := gangPods(nsB, "b", 2, pool)
	for _, p := range gang {
		p.Labels[v1alpha1.LabelQueue] = nsB
	}
	if err := crClient(t).Create(ctx, &v1alpha1.PodGroup{ObjectMeta: metav1.ObjectMeta{Name: "b", Namespace: nsB}, Spec: v1alpha1.PodGroupSpec{MinMember: 2, Queue: nsB}}); err != nil {
		t.Fatal(err)
	}
	createPods(ctx, t, clientset, gang, 2)
	poll(t, 2*time.Minute, "the other queue's gang bound", func() (bool, string) {
		bound, _, seen := podState(ctx, t, nsB, "")
		return len(bound) == 2, seen
	})
	evs, err := clientset.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "reason=" + v1alpha1.ReasonPreempted})
	if err != nil {
		t.Fatal(err)
	}
	evicted := map[string]bool{}
	for _, e := range evs.Items {
		if !strings.Contains(e.Message, "elastic member of RayCluster "+ns+"/rc, beyond its minimum of 2") {
			t.Errorf("eviction of %s says %q, want it named an elastic member", e.InvolvedObject.Name, e.Message)
		}
		evicted[e.InvolvedObject.Name] = true
	}
	if len(evicted) != 2 {
		t.Errorf("evicted %v, want 2 elastic workers", evicted)
	}
	bound, _, seen := podState(ctx, t, ns, workers)
	survivors := 0
	for _, p := range bound {
		if started[p.Name] {
			survivors++
		}
	}
	if survivors < 2 {
		t.Errorf("only %d of the RayCluster's first workers still run; its minimum of 2 must:\n%s", survivors, seen)
	}
	if head, _, seen := podState(ctx, t, ns, "ray.io/cluster=rc,ray.io/node-type=head"); len(head) != 1 {
		t.Errorf("the Ray head is not running:\n%s", seen)
	}
}

// workloadRuleConfigMap is an operator's rule: pods labelled
// e2e.partita.dev/run are one gang per run, of the size the label
// e2e.partita.dev/size says.
const workloadRuleConfigMap = `apiVersion: v1
kind: ConfigMap
metadata:
  name: e2e-workload-rule
  namespace: partita-system
  labels: {partita.dev/policy: rego}
data:
  workload_runs.rego: |
    package partita.workload.custom

    rules contains g if {
      run := input.pod.labels["e2e.partita.dev/run"]
      g := {"name": sprintf("run-%s", [run]), "minMember": to_number(input.pod.labels["e2e.partita.dev/size"]),
            "kind": "Run", "ownerName": run}
    }
`

// TestWorkloadRuleChangeRegroupsTheNextWorkload: a rule added in a policy
// ConfigMap groups the next workload's pods within seconds of being
// loaded; before it, the same pods are single pods.
func TestWorkloadRuleChangeRegroupsTheNextWorkload(t *testing.T) {
	ctx := testContext(t, 5*time.Minute)
	ns := extNamespace(ctx, t, clientset)
	ensureGPUPriorityClass(ctx, t, clientset)
	pool := workloadNodes(ctx, t, "rule", 1, 1)
	runPods := func(run string) []*corev1.Pod {
		var out []*corev1.Pod
		for i := range 2 {
			p := extGPUPod(ns, fmt.Sprintf("%s-%d", run, i), 1000, 1, pool)
			p.Labels["e2e.partita.dev/run"] = run
			p.Labels["e2e.partita.dev/size"] = "2"
			out = append(out, p)
		}
		return out
	}
	// Without the rule: two single pods, one fits.
	createPods(ctx, t, clientset, runPods("before"), 2)
	poll(t, time.Minute, "one of the single pods bound", func() (bool, string) {
		bound, _, seen := podState(ctx, t, ns, "e2e.partita.dev/run=before")
		return len(bound) == 1, seen
	})
	deletePods(ctx, t, ns)

	cms := clientset.CoreV1().ConfigMaps(devcluster.PartitaNamespace)
	t.Cleanup(func() {
		_ = cms.Delete(context.WithoutCancel(ctx), "e2e-workload-rule", metav1.DeleteOptions{})
	})
	apply(ctx, t, workloadRuleConfigMap)
	var loaded time.Time
	poll(t, time.Minute, "the rule loaded", func() (bool, string) {
		cm, err := cms.Get(ctx, "e2e-workload-rule", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		status := cm.Annotations["partita.dev/policy-status"]
		loaded = time.Now()
		return strings.HasPrefix(status, "Loaded"), status
	})
	// The next workload: a gang of 2 that does not fit 1 GPU, named after
	// the rule's run.
	createPods(ctx, t, clientset, runPods("after"), 2)
	poll(t, 30*time.Second, "the next workload grouped by the new rule", func() (bool, string) {
		_, waiting, seen := podState(ctx, t, ns, "e2e.partita.dev/run=after")
		for _, p := range waiting {
			c := admissionCondition(&p)
			if c == nil || !strings.Contains(c.Message, "gang needs 2 × 1 GPU") {
				return false, seen
			}
		}
		return len(waiting) == 2, seen
	})
	t.Logf("regrouped %s after the ConfigMap was loaded", time.Since(loaded).Round(100*time.Millisecond))
	waitMappedPodGroup(ctx, t, ns, "run-after", v1alpha1.PodGroupPending)

	// The rule goes: the default map again.
	if err := cms.Delete(ctx, "e2e-workload-rule", metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	poll(t, time.Minute, "the pods single again, one bound", func() (bool, string) {
		bound, _, seen := podState(ctx, t, ns, "e2e.partita.dev/run=after")
		return len(bound) == 1, seen
	})
}

// TestNativeWorkloadAPI runs a cluster of its own with Kubernetes 1.37's
// GenericWorkload (beta) and WorkloadWithJob (alpha): the Job controller
// makes a Workload and a PodGroup (scheduling.k8s.io) for a Job whose
// spec.scheduling asks for a gang, and its pods name that PodGroup; the
// workload map takes the gang's minCount. Too big for the free GPUs, the
// Job starts no pod; once room appears it starts whole.
func TestNativeWorkloadAPI(t *testing.T) {
	ctx := testContext(t, 8*time.Minute)
	name := clusterName + "-wl"
	if os.Getenv("PARTITA_E2E_KEEP") == "" {
		t.Cleanup(func() { _, _ = partita(context.WithoutCancel(ctx), "dev", "down", "--name", name) })
	}
	out, err := partita(ctx, "dev", "up", "--name", name, "--nodes", "1", "--gpus-per-node", "4",
		"--feature-gates", "GenericWorkload=true,WorkloadWithJob=true", "--runtime-config", "scheduling.k8s.io/v1beta1=true")
	if err != nil {
		t.Fatalf("dev up with the Workload API: %v\n%s", err, out)
	}
	opts := devcluster.DefaultOptions()
	opts.Name = name
	wl, err := devcluster.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := wl.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := wl.RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	ns := extNamespace(ctx, t, cs)
	ensureGPUPriorityClass(ctx, t, cs)
	// A pod holds 2 of the 4 GPUs.
	blocker := extGPUPod(ns, "blocker", 1000, 2, nil)
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, blocker, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll(t, 2*time.Minute, "the blocker bound", func() (bool, string) {
		p, err := cs.CoreV1().Pods(ns).Get(ctx, "blocker", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return p.Spec.NodeName != "", fmt.Sprint(p.Status.Conditions)
	})
	job := func(name string, parallelism int) string {
		return fmt.Sprintf(`apiVersion: batch/v1
kind: Job
metadata: {name: %s, namespace: %s}
spec:
  parallelism: %d
  completions: %d
  scheduling:
    schedulingPolicy:
      gang: {}
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: train
        image: registry.k8s.io/pause:3.10
        resources: {limits: {nvidia.com/gpu: "1"}}
`, name, ns, parallelism, parallelism)
	}
	if err := devcluster.Apply(ctx, cfg, []byte(job("train", 3))); err != nil {
		t.Fatal(err)
	}
	state := func() (bound, waiting int, seen string) {
		pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "batch.kubernetes.io/job-name=train"})
		if err != nil {
			return 0, 0, err.Error()
		}
		var lines []string
		for _, p := range pods.Items {
			sg := ""
			if p.Spec.SchedulingGroup != nil && p.Spec.SchedulingGroup.PodGroupName != nil {
				sg = *p.Spec.SchedulingGroup.PodGroupName
			}
			msg := ""
			if c := admissionCondition(&p); c != nil {
				msg = c.Message
			}
			if p.Spec.NodeName != "" {
				bound++
			} else {
				waiting++
			}
			lines = append(lines, fmt.Sprintf("%s node=%q schedulingGroup=%q %s", p.Name, p.Spec.NodeName, sg, msg))
		}
		return bound, waiting, strings.Join(lines, "\n")
	}
	poll(t, 2*time.Minute, "the native gang of 3 waiting whole on 2 free GPUs", func() (bool, string) {
		bound, waiting, seen := state()
		if bound > 0 {
			t.Fatalf("a pod of a native gang too big for the free GPUs was bound:\n%s", seen)
		}
		return waiting == 3 && strings.Contains(seen, "gang needs 3 × 1 GPU; at most 2 fit now") && strings.Contains(seen, `schedulingGroup="train-`), seen
	})
	c, err := client.New(cfg, client.Options{Scheme: crClient(t).Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	var pgs v1alpha1.PodGroupList
	if err := c.List(ctx, &pgs, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	if len(pgs.Items) != 1 || pgs.Items[0].Spec.MinMember != 3 || pgs.Items[0].Labels[v1alpha1.LabelWorkloadKind] != "Workload" {
		t.Errorf("Partita's PodGroups %+v, want one for the Workload, of minMember 3", pgs.Items)
	}
	// Room appears: the blocker goes.
	if err := cs.CoreV1().Pods(ns).Delete(ctx, "blocker", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	poll(t, 3*time.Minute, "the native gang started whole", func() (bool, string) {
		pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "batch.kubernetes.io/job-name=train"})
		if err != nil {
			return false, err.Error()
		}
		started := 0
		for _, p := range pods.Items {
			if p.Spec.NodeName != "" || p.Status.Phase == corev1.PodSucceeded {
				started++
			}
		}
		_, _, seen := state()
		return started == 3, seen
	})
}

// TestPyTorchJobStartsWhole: a Kubeflow PyTorchJob (the real CRD of the
// training-operator's release) of a master and 3 workers on 3 free GPUs
// starts no pod, and starts whole once a node adds room. The
// training-operator itself does not run here (it expects its certificate
// Secret mounted by a kubelet), so the test creates the pods it would:
// owned by the PyTorchJob, with its labels. The CRD appears after the
// extender started: the workload map watches it within seconds.
func TestPyTorchJobStartsWhole(t *testing.T) {
	ctx := testContext(t, 6*time.Minute)
	crdFile := filepath.Join(devcluster.CacheDir(), "bin", "addons", "crds", "training-operator-v1.8.1", "kubeflow.org_pytorchjobs.yaml")
	crd, err := os.ReadFile(crdFile)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("the PyTorchJob CRD: %v (make cluster-bins fetches it)", err)
		}
		t.Skipf("the PyTorchJob CRD is not fetched: %v; run 'make cluster-bins'", err)
	}
	apply(ctx, t, string(crd))
	t.Cleanup(func() {
		cfg, err := cluster.RESTConfig()
		if err != nil {
			return
		}
		c, err := client.New(cfg, client.Options{})
		if err != nil {
			return
		}
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(schema.GroupVersionKind{Group: "apiextensions.k8s.io", Version: "v1", Kind: "CustomResourceDefinition"})
		u.SetName("pytorchjobs.kubeflow.org")
		_ = c.Delete(context.WithoutCancel(ctx), u)
	})
	ns := extNamespace(ctx, t, clientset)
	ensureGPUPriorityClass(ctx, t, clientset)
	pool := workloadNodes(ctx, t, "pt", 1, 3)
	replica := func(n int) string {
		return fmt.Sprintf(`replicas: %d
      restartPolicy: OnFailure
      template:
        spec:
          containers:
          - name: pytorch
            image: registry.k8s.io/pause:3.10
            resources: {limits: {nvidia.com/gpu: "1"}}`, n)
	}
	manifest := fmt.Sprintf(`apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {name: pt, namespace: %s}
spec:
  pytorchReplicaSpecs:
    Master:
      %s
    Worker:
      %s
`, ns, replica(1), replica(3))
	// The CRD may take a moment to be served after it is applied.
	poll(t, time.Minute, "the PyTorchJob created", func() (bool, string) {
		cfg, err := cluster.RESTConfig()
		if err != nil {
			return false, err.Error()
		}
		err = devcluster.Apply(ctx, cfg, []byte(manifest))
		return err == nil, fmt.Sprint(err)
	})
	c := crClient(t)
	job := &unstructured.Unstructured{}
	job.SetGroupVersionKind(schema.GroupVersionKind{Group: "kubeflow.org", Version: "v1", Kind: "PyTorchJob"})
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "pt"}, job); err != nil {
		t.Fatal(err)
	}
	// The pods the training-operator would make.
	var pods []*corev1.Pod
	for i, role := range []string{"master", "worker", "worker", "worker"} {
		idx := i
		if role == "worker" {
			idx = i - 1
		}
		p := extGPUPod(ns, fmt.Sprintf("pt-%s-%d", role, idx), 1000, 1, pool)
		p.Labels["training.kubeflow.org/job-name"] = "pt"
		p.Labels["training.kubeflow.org/replica-type"] = role
		p.Labels["training.kubeflow.org/replica-index"] = fmt.Sprint(idx)
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "kubeflow.org/v1", Kind: "PyTorchJob", Name: "pt", UID: job.GetUID(), Controller: ptr.To(true)}}
		pods = append(pods, p)
	}
	createPods(ctx, t, clientset, pods, 4)
	sel := "training.kubeflow.org/job-name=pt"
	holdsNone(ctx, t, ns, sel, 4, 5*time.Second)
	pg := waitMappedPodGroup(ctx, t, ns, "pytorchjob-pt", v1alpha1.PodGroupPending)
	if pg.Spec.MinMember != 4 || !strings.Contains(pg.Status.Reason, "gang needs 4 × 1 GPU; at most 3 fit now") {
		t.Errorf("PodGroup spec %+v, reason %q; want minMember 4 and the numbers", pg.Spec, pg.Status.Reason)
	}
	addGPUNode(ctx, t, "pt-1", 1, pool)
	poll(t, 2*time.Minute, "the PyTorchJob's 4 pods bound", func() (bool, string) {
		bound, _, seen := podState(ctx, t, ns, sel)
		return len(bound) == 4, seen
	})
}
