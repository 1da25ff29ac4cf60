package dra

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/devcluster"
	"github.com/partita-dev/partita/dra"
	"github.com/partita-dev/partita/gpu"
	"github.com/partita-dev/partita/internal/clientscheme"
	"github.com/partita-dev/partita/internal/partitatest"
	"github.com/partita-dev/partita/webhook"
)

// model is the simulated GPU model of the cluster.
var model = devcluster.GPUModels[devcluster.DefaultOptions().GPUModel]

// TestResourceSlicesPerNode: every simulated node's GPUs are a pool of
// gpu.partita.dev on that node, with consumable capacity, the same devices
// its GPUNode lists; the node offers no partita.dev/gpu-milli; the
// DeviceClass is there.
func TestResourceSlicesPerNode(t *testing.T) {
	ctx := testContext(t, time.Minute)
	c := crClient(t)
	if _, err := clientset.ResourceV1().DeviceClasses().Get(ctx, dra.DeviceClassName, metav1.GetOptions{}); err != nil {
		t.Fatalf("DeviceClass %s: %v", dra.DeviceClassName, err)
	}
	for i := range nodes {
		name := devcluster.NodeName(i)
		poll(t, 30*time.Second, "the ResourceSlice of "+name, func() (bool, string) {
			sl, err := clientset.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: fields.AndSelectors(
				fields.OneTermEqualSelector(resourceapi.ResourceSliceSelectorDriver, dra.DriverName),
				fields.OneTermEqualSelector(resourceapi.ResourceSliceSelectorNodeName, name)).String()})
			if err != nil {
				return false, err.Error()
			}
			if len(sl.Items) != 1 {
				return false, fmt.Sprintf("%d slices", len(sl.Items))
			}
			s := sl.Items[0]
			if s.Spec.Pool.Name != name || len(s.Spec.Devices) != gpusPerNode {
				return false, fmt.Sprintf("pool %q with %d devices", s.Spec.Pool.Name, len(s.Spec.Devices))
			}
			gn := &v1alpha1.GPUNode{}
			if err := c.Get(ctx, client.ObjectKey{Name: name}, gn); err != nil {
				return false, err.Error()
			}
			for j, d := range s.Spec.Devices {
				compute, memory := d.Capacity[dra.CapacityCompute], d.Capacity[dra.CapacityMemory]
				if d.AllowMultipleAllocations == nil || !*d.AllowMultipleAllocations || compute.Value.Value() != 1000 ||
					memory.Value.Cmp(*resource.NewQuantity(model.MemoryMiB<<20, resource.BinarySI)) != 0 || compute.RequestPolicy == nil {
					return false, fmt.Sprintf("device %s: %+v", d.Name, d)
				}
				if uuid := d.Attributes[dra.AttributeUUID].StringValue; j >= len(gn.Status.Devices) || uuid == nil || *uuid != gn.Status.Devices[j].UUID {
					return false, fmt.Sprintf("device %s UUID %v, GPUNode %v", d.Name, uuid, gn.Status.Devices)
				}
			}
			return true, ""
		})
		node, err := clientset.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if q, ok := node.Status.Capacity[v1alpha1.ResourceGPUMilli]; ok {
			t.Errorf("node %s offers %s %s beside its DRA devices", name, v1alpha1.ResourceGPUMilli, q.String())
		}
	}
}

// dialectPod is a 0.25 slice in one dialect, pinned to node.
func dialectPod(ns, name, dialect, node string) *corev1.Pod {
	p := basePod(ns, name, node)
	switch dialect {
	case "partita":
		p.Annotations = map[string]string{v1alpha1.AnnotationGPUFraction: "0.25"}
	case "runai":
		p.Annotations = map[string]string{gpu.AnnotationRunAIGPUFraction: "0.25"}
	case "hami":
		p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{
			gpu.ResourceNVIDIAGPU: resource.MustParse("1"), gpu.ResourceHAMiGPUMemPercentage: resource.MustParse("25"),
		}
	case "nvidia.com/gpu":
		p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{gpu.ResourceNVIDIAGPU: resource.MustParse("1")}
	}
	return p
}

func basePod(ns, name, node string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			Containers:   []corev1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10"}},
			NodeSelector: map[string]string{v1alpha1.LabelGPUNode: "true"},
			Tolerations:  []corev1.Toleration{{Key: "kwok.x-k8s.io/node", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
		},
	}
	if node != "" {
		p.Spec.NodeSelector[corev1.LabelHostname] = node
	}
	return p
}

// TestQuartersShareOneDevice: four 0.25 slices, in each dialect, share one
// device through their claims (250 of its 1000 compute each, counted from
// the claims' allocations); a fifth goes to the node's other device. Whole
// GPUs (nvidia.com/gpu) each hold a device alone.
func TestQuartersShareOneDevice(t *testing.T) {
	for i, dialect := range []string{"partita", "runai", "hami"} {
		t.Run(dialect, func(t *testing.T) {
			ctx := testContext(t, 3*time.Minute)
			ns := newNamespace(ctx, t)
			node := devcluster.NodeName(i)
			var pods []*corev1.Pod
			for j := range 5 {
				pods = append(pods, dialectPod(ns, fmt.Sprintf("q%d", j), dialect, node))
			}
			created := createPods(ctx, t, pods[:4])
			for _, p := range created {
				if _, ok := p.Spec.Containers[0].Resources.Limits[v1alpha1.ResourceGPUMilli]; ok || len(p.Spec.ResourceClaims) != 1 {
					t.Fatalf("pod %s was not given a claim in place of gpu-milli: %+v", p.Name, p.Spec)
				}
			}
			shares := waitHeld(ctx, t, ns, 4)
			per := dra.PerDevice(shares)
			if len(per) != 1 {
				t.Fatalf("the four quarters are on %d devices, want one: %v", len(per), per)
			}
			for id, milli := range per {
				if id.Pool != node || milli != 1000 {
					t.Errorf("device %v holds %d milli-GPUs, want 1000 on %s", id, milli, node)
				}
			}
			for _, s := range shares {
				if s.Milli != 250 || s.MemoryMiB != 250*model.MemoryMiB/1000 {
					t.Errorf("a quarter holds %d milli-GPUs and %dMi, want 250 and %dMi", s.Milli, s.MemoryMiB, 250*model.MemoryMiB/1000)
				}
			}
			createPods(ctx, t, pods[4:])
			fifth := waitHeld(ctx, t, ns, 5)
			if per := dra.PerDevice(fifth); len(per) != 2 {
				t.Errorf("the fifth quarter did not go to the other device: %v", per)
			}
		})
	}
	t.Run("nvidia.com/gpu", func(t *testing.T) {
		ctx := testContext(t, 3*time.Minute)
		ns := newNamespace(ctx, t)
		node := devcluster.NodeName(3)
		var pods []*corev1.Pod
		for j := range gpusPerNode + 1 {
			pods = append(pods, dialectPod(ns, fmt.Sprintf("w%d", j), "nvidia.com/gpu", node))
		}
		createPods(ctx, t, pods)
		shares := waitHeld(ctx, t, ns, gpusPerNode)
		for id, milli := range dra.PerDevice(shares) {
			if milli != 1000 {
				t.Errorf("whole GPU %v holds %d milli-GPUs, want 1000", id, milli)
			}
		}
		// The pods are created at once: whichever comes last to the
		// scheduler is the one that finds no free GPU.
		poll(t, time.Minute, "one pod unschedulable, the others on a GPU each", func() (bool, string) {
			l, err := clientset.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, err.Error()
			}
			bound, unschedulable := 0, 0
			var seen []string
			for i := range l.Items {
				p := &l.Items[i]
				c := scheduled(p)
				switch {
				case p.Spec.NodeName != "":
					bound++
				case c != nil && c.Reason == corev1.PodReasonUnschedulable:
					unschedulable++
				}
				seen = append(seen, fmt.Sprintf("%s on %q (%+v)", p.Name, p.Spec.NodeName, c))
			}
			return bound == gpusPerNode && unschedulable == 1, strings.Join(seen, "; ")
		})
	})
}

// TestSliceThatFitsNowhereWaits: a slice that fits no device waits, and
// `partita ctl why` says why with numbers. One that no device can ever
// hold (more memory than any GPU has) is held by the admission loop; one
// that fits no device now, because claims hold the devices of the only
// node it may use, is ungated, found unschedulable by kube-scheduler's
// DRA plugin, and why reads that reason and the room left from the
// ResourceClaims' allocations.
func TestSliceThatFitsNowhereWaits(t *testing.T) {
	t.Run("never", func(t *testing.T) {
		ctx := testContext(t, 2*time.Minute)
		ns := newNamespace(ctx, t)
		p := basePod(ns, "huge", "")
		p.Annotations = map[string]string{v1alpha1.AnnotationGPUMemory: "200Gi"}
		createPods(ctx, t, []*corev1.Pod{p})
		whySays(ctx, t, ns, "huge", "pod needs 204800MiB of GPU memory", "it can never fit")
	})
	t.Run("not now", func(t *testing.T) {
		ctx := testContext(t, 3*time.Minute)
		ns := newNamespace(ctx, t)
		node := devcluster.NodeName(0)
		var fill []*corev1.Pod
		for i := range gpusPerNode {
			p := basePod(ns, fmt.Sprintf("busy%d", i), node)
			p.Annotations = map[string]string{v1alpha1.AnnotationGPUFraction: "0.75"}
			fill = append(fill, p)
		}
		createPods(ctx, t, fill)
		waitHeld(ctx, t, ns, gpusPerNode)
		p := basePod(ns, "half", node)
		p.Annotations = map[string]string{v1alpha1.AnnotationGPUFraction: "0.5"}
		createPods(ctx, t, []*corev1.Pod{p})
		waitUnschedulable(ctx, t, ns, "half")
		whySays(ctx, t, ns, "half", "kube-scheduler's DRA plugin found no device for its claims", "cannot allocate all claims", "has 0.25 GPU")
	})
}

// whySays waits until `partita ctl why` on the pod says every want.
func whySays(ctx context.Context, t *testing.T, ns, pod string, want ...string) {
	t.Helper()
	var out string
	poll(t, time.Minute, "partita ctl why "+pod+" to say "+strings.Join(want, ", "), func() (bool, string) {
		var err error
		out, err = partita(ctx, "ctl", "why", pod, "-n", ns)
		if err != nil {
			return false, out
		}
		for _, w := range want {
			if !strings.Contains(out, w) {
				return false, out
			}
		}
		return true, ""
	})
	t.Logf("partita ctl why %s:\n%s", pod, out)
}

// TestBurstNeverOverAllocates: a burst of slices of mixed shapes, more
// than the cluster holds, created at once: recomputed from the
// ResourceClaims' allocations alone, no device holds more than its compute
// and memory, every bound pod holds what it asked for on its own node, and
// what does not fit waits unschedulable.
func TestBurstNeverOverAllocates(t *testing.T) {
	ctx := testContext(t, 5*time.Minute)
	ns := newNamespace(ctx, t)
	shapes := []map[string]string{
		{v1alpha1.AnnotationGPUFraction: "0.5"},
		{v1alpha1.AnnotationGPUFraction: "0.25"},
		{v1alpha1.AnnotationGPUMemory: "20Gi"},
		{v1alpha1.AnnotationGPUFraction: "0.75"},
	}
	const n = 40 // about 16 GPUs asked of 8
	var pods []*corev1.Pod
	for i := range n {
		p := basePod(ns, fmt.Sprintf("b%02d", i), "")
		p.Annotations = shapes[i%len(shapes)]
		pods = append(pods, p)
	}
	createPods(ctx, t, pods)

	// Settled: every pod bound, or waiting (unschedulable, or held by the
	// admission loop), the same three polls in a row.
	var bound, waiting, same int
	last := ""
	poll(t, 3*time.Minute, "the burst to settle", func() (bool, string) {
		list, err := clientset.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		bound, waiting = 0, 0
		for _, p := range list.Items {
			c := scheduled(&p)
			switch {
			case p.Spec.NodeName != "":
				bound++
			case c != nil && c.Reason == corev1.PodReasonUnschedulable, len(p.Spec.SchedulingGates) > 0:
				waiting++
			}
		}
		now := fmt.Sprintf("%d bound, %d waiting of %d", bound, waiting, n)
		if now == last {
			same++
		} else {
			same = 0
		}
		last = now
		time.Sleep(time.Second)
		return bound+waiting == n && waiting > 0 && same >= 3, now
	})
	claims, err := clientset.ResourceV1().ResourceClaims(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	milli, mem := map[dra.DeviceID]int64{}, map[dra.DeviceID]int64{}
	for i := range claims.Items {
		for _, s := range dra.ClaimShares(&claims.Items[i], dra.GPUDrivers{dra.DriverName}, nil) {
			milli[s.ID()] += s.Milli
			mem[s.ID()] += s.MemoryMiB
		}
	}
	for id, m := range milli {
		if m > 1000 || mem[id] > model.MemoryMiB {
			t.Errorf("device %v holds %d milli-GPUs and %dMi, more than its 1000 and %dMi", id, m, mem[id], model.MemoryMiB)
		}
	}
	list, err := clientset.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	get := claimGetter(claims.Items)
	for _, p := range list.Items {
		if p.Spec.NodeName == "" {
			continue
		}
		shares := dra.PodShares(&p, get, dra.GPUDrivers{dra.DriverName}, nil)
		if len(shares) != 1 || shares[0].Pool != p.Spec.NodeName {
			t.Errorf("bound pod %s on %s holds %+v, want one device of its node", p.Name, p.Spec.NodeName, shares)
		}
	}
	t.Logf("%d pods bound, %d wait; %d devices hold slices", bound, waiting, len(milli))
}

// newNamespace makes a namespace for one test and, when it ends, deletes
// it and waits until its claims are gone (their devices free again).
func newNamespace(ctx context.Context, t *testing.T) string {
	t.Helper()
	ns, err := clientset.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "e2e-dra-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	// The API server refuses pods until the namespace's default
	// ServiceAccount exists.
	poll(t, 30*time.Second, "the default ServiceAccount of "+ns.Name, func() (bool, string) {
		_, err := clientset.CoreV1().ServiceAccounts(ns.Name).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, fmt.Sprint(err)
	})
	t.Cleanup(func() {
		ctx := context.WithoutCancel(ctx)
		_ = clientset.CoreV1().Pods(ns.Name).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}, metav1.ListOptions{})
		_ = clientset.CoreV1().Namespaces().Delete(ctx, ns.Name, metav1.DeleteOptions{})
		poll(t, 2*time.Minute, "the claims of "+ns.Name+" to go", func() (bool, string) {
			l, err := clientset.ResourceV1().ResourceClaims(ns.Name).List(ctx, metav1.ListOptions{})
			return err == nil && len(l.Items) == 0, fmt.Sprintf("%d claims left (%v)", len(l.Items), err)
		})
	})
	return ns.Name
}

// createPods creates pods, a few at a time, and returns them as stored.
func createPods(ctx context.Context, t *testing.T, pods []*corev1.Pod) []*corev1.Pod {
	t.Helper()
	out := make([]*corev1.Pod, len(pods))
	var wg sync.WaitGroup
	errs := make(chan error, len(pods))
	sem := make(chan struct{}, 8)
	for i, p := range pods {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			got, err := clientset.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
			if err != nil {
				errs <- fmt.Errorf("create pod %s: %w", p.Name, err)
				return
			}
			out[i] = got
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return out
}

// waitHeld waits until want pods of ns are bound with their claims
// allocated, and returns what they hold.
func waitHeld(ctx context.Context, t *testing.T, ns string, want int) []dra.Share {
	t.Helper()
	var shares []dra.Share
	poll(t, 2*time.Minute, fmt.Sprintf("%d pods of %s to hold their devices", want, ns), func() (bool, string) {
		pods, err := clientset.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		claims, err := clientset.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		get := claimGetter(claims.Items)
		shares = nil
		held := 0
		var states []string
		for _, p := range pods.Items {
			s := dra.PodShares(&p, get, dra.GPUDrivers{dra.DriverName}, nil)
			if p.Spec.NodeName != "" && len(s) > 0 {
				held++
				shares = append(shares, s...)
			}
			states = append(states, fmt.Sprintf("%s node=%q gates=%d held=%d", p.Name, p.Spec.NodeName, len(p.Spec.SchedulingGates), len(s)))
		}
		return held == want, strings.Join(states, "; ")
	})
	return shares
}

// waitUnschedulable waits until kube-scheduler calls the pod unschedulable.
func waitUnschedulable(ctx context.Context, t *testing.T, ns, name string) {
	t.Helper()
	poll(t, time.Minute, name+" to be unschedulable", func() (bool, string) {
		p, err := clientset.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		c := scheduled(p)
		return p.Spec.NodeName == "" && c != nil && c.Reason == corev1.PodReasonUnschedulable,
			fmt.Sprintf("node %q gates %v condition %+v", p.Spec.NodeName, p.Spec.SchedulingGates, c)
	})
}

func scheduled(p *corev1.Pod) *corev1.PodCondition {
	i := slices.IndexFunc(p.Status.Conditions, func(c corev1.PodCondition) bool { return c.Type == corev1.PodScheduled })
	if i < 0 {
		return nil
	}
	return &p.Status.Conditions[i]
}

func claimGetter(claims []resourceapi.ResourceClaim) dra.ClaimGetter {
	return func(ns, name string) (*resourceapi.ResourceClaim, bool) {
		for i := range claims {
			if claims[i].Namespace == ns && claims[i].Name == name {
				return &claims[i], true
			}
		}
		return nil, false
	}
}

// poll retries cond every 500ms until it holds or d passes, then fails
// with what it last saw.
func poll(t *testing.T, d time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	var last string
	for {
		ok, msg := cond()
		if ok {
			return
		}
		last = msg
		if time.Now().After(deadline) {
			t.Fatalf("waited %s for %s; last saw: %s", d, what, last)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func crClient(t *testing.T) client.Client {
	t.Helper()
	cfg, err := cluster.RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	scheme, err := clientscheme.New()
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestPodCannotSetItsDevices: a GPU pod that sets NVIDIA_VISIBLE_DEVICES
// itself is refused, as with the extender backend, and nothing is stored.
func TestPodCannotSetItsDevices(t *testing.T) {
	ctx := testContext(t, time.Minute)
	ns := newNamespace(ctx, t)
	p := basePod(ns, "all", "")
	p.Annotations = map[string]string{v1alpha1.AnnotationGPUFraction: "0.25"}
	p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"}}
	_, err := clientset.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
	if err == nil || !strings.Contains(err.Error(), `NVIDIA_VISIBLE_DEVICES="all" is set by Partita`) {
		t.Fatalf("err %v, want the webhook's refusal naming NVIDIA_VISIBLE_DEVICES", err)
	}
	if _, err := clientset.CoreV1().Pods(ns).Get(ctx, "all", metav1.GetOptions{}); err == nil {
		t.Error("the refused pod was stored")
	}
}

// TestForgedReviewCreatesNoClaimTemplate: with the dra backend the webhook
// creates a claim template in a pod's namespace when it answers the pod's
// review, under its own ServiceAccount. A review forged by anyone but the
// API server (no client certificate) gets no answer and creates nothing;
// the same review from the API server's certificate does create it.
func TestForgedReviewCreatesNoClaimTemplate(t *testing.T) {
	ctx := testContext(t, time.Minute)
	ns := newNamespace(ctx, t)
	p := basePod(ns, "forged", "")
	p.Annotations = map[string]string{v1alpha1.AnnotationGPUFraction: "0.25"}
	review, err := partitatest.CreateReview(p, "Pod", "mallory")
	if err != nil {
		t.Fatal(err)
	}
	templates := func() []string {
		t.Helper()
		list, err := clientset.ResourceV1().ResourceClaimTemplates(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, tmpl := range list.Items {
			names = append(names, tmpl.Name)
		}
		return names
	}
	status, body, err := cluster.WebhookCall(ctx, webhook.PathMutatePods, review, false)
	if err != nil {
		t.Fatal(err)
	}
	if status != http.StatusUnauthorized || partitatest.ReviewResponse(body) != nil {
		t.Errorf("a forged review answered %d %q, want 401 and no AdmissionReview", status, body)
	}
	if got := templates(); len(got) != 0 {
		t.Errorf("a forged review created claim templates %v in %s", got, ns)
	}
	status, body, err = cluster.WebhookCall(ctx, webhook.PathMutatePods, review, true)
	if err != nil {
		t.Fatal(err)
	}
	if resp := partitatest.ReviewResponse(body); status != http.StatusOK || resp == nil || !resp.Allowed {
		t.Fatalf("the API server's review answered %d %q, want an allowing AdmissionReview", status, body)
	}
	if got := templates(); len(got) == 0 {
		t.Errorf("the API server's review created no claim template in %s", ns)
	}
}
