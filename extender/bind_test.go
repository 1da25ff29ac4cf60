package extender

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
	testingclock "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
	pt "github.com/partita-dev/partita/internal/partitatest"
)

func bindArgs(name, node string) *extenderv1.ExtenderBindingArgs {
	return &extenderv1.ExtenderBindingArgs{PodName: name, PodNamespace: "ns", PodUID: types.UID("uid-ns-" + name), Node: node}
}

// halfOn is the allocation of a 0.5 pod p on GPU i of node.
func halfOn(node string, i int32) *gpu.PodAllocation {
	return &gpu.PodAllocation{Namespace: "ns", Name: "p", UID: "uid-ns-p", Node: node, Containers: []gpu.ContainerAllocation{{
		Container: "main", DeviceUUIDs: []string{pt.DeviceUUID(node, i)}, DeviceIndexes: []int32{i},
		Milli: 500, MemoryMiB: pt.H100MiB / 2, SMPercent: 50}}}
}

func TestBind(t *testing.T) {
	nodes := []*v1alpha1.GPUNode{pt.H100Node("n1", 2).Obj(), pt.H100Node("n2", 2).Obj()}
	half := pt.FractionPod("p", "0.5", "500")
	onGPU0 := pt.Bound(pt.FractionPod("a", "0.5", "500"), "n1", 0)
	n1Full := []*corev1.Pod{pt.Bound(pt.WholePod("a", 1, "1000"), "n1", 0), pt.Bound(pt.WholePod("b", 1, "1000"), "n1", 1)}
	isConflict := func(err error) bool { return errors.As(err, new(*ConflictError)) }
	refused := func(reason string) func(error) bool {
		return func(err error) bool { return IsRefused(err) && strings.Contains(err.Error(), reason) }
	}
	cases := map[string]struct {
		pods      []*corev1.Pod  // in the API
		nodes     []*corev1.Node // in the API instead of the plain n1, n2, n3
		held      []*corev1.Pod  // in the ledger
		reserve   *gpu.PodAllocation
		args      *extenderv1.ExtenderBindingArgs
		notLeader bool
		bindErr   error
		applied   bool
		liveFails bool
		live      []*corev1.Pod // in the API server, when the cache (pods) lags
		released  []*corev1.Pod // released by the admission loop (ReleasedPods)
		notCached bool          // pods are in the API but not yet in the cache
		// wantReleased are the released pods kept after the bind.
		wantReleased int

		wantErr      func(error) bool
		wantBindings []map[string]string // annotations of each Binding
		wantHeld     *gpu.PodAllocation
		wantPending  int
	}{
		"a half gets a device, on the Binding": {
			pods: []*corev1.Pod{half.Obj()},
			args: bindArgs("p", "n1"),
			wantBindings: []map[string]string{{
				v1alpha1.AnnotationNode: "n1", v1alpha1.AnnotationDevicesPrefix + "main": pt.DeviceUUID("n1", 0),
				v1alpha1.AnnotationMemLimitPrefix + "main": "40960M", v1alpha1.AnnotationSMLimitPrefix + "main": "50"}},
			wantHeld:    halfOn("n1", 0),
			wantPending: 1,
		},
		"a half packs onto the partly used device": {
			pods:         []*corev1.Pod{half.Obj(), onGPU0},
			held:         []*corev1.Pod{onGPU0},
			args:         bindArgs("p", "n1"),
			wantBindings: []map[string]string{gpu.AllocationAnnotations(halfOn("n1", 0))},
			wantHeld:     halfOn("n1", 0),
			wantPending:  1,
		},
		"spread takes the empty device": {
			pods:         []*corev1.Pod{half.Clone().Placement("spread").Obj(), onGPU0},
			held:         []*corev1.Pod{onGPU0},
			args:         bindArgs("p", "n1"),
			wantBindings: []map[string]string{gpu.AllocationAnnotations(halfOn("n1", 1))},
			wantHeld:     halfOn("n1", 1),
			wantPending:  1,
		},
		"a retry of a bind that went through does nothing": {
			pods:     []*corev1.Pod{pt.Bound(half, "n1", 1)},
			held:     []*corev1.Pod{pt.Bound(half, "n1", 1)},
			args:     bindArgs("p", "n1"),
			wantHeld: halfOn("n1", 1),
		},
		"a pod bound to another node is an error": {
			pods:     []*corev1.Pod{pt.Bound(half, "n2", 0)},
			held:     []*corev1.Pod{pt.Bound(half, "n2", 0)},
			args:     bindArgs("p", "n1"),
			wantErr:  func(err error) bool { return err != nil && !isConflict(err) },
			wantHeld: halfOn("n2", 0),
		},
		"a pod bound without devices is an error": {
			pods:    []*corev1.Pod{half.Clone().Node("n1").Obj()},
			args:    bindArgs("p", "n1"),
			wantErr: func(err error) bool { return err != nil },
		},
		"a replica that is not the leader does not bind": {
			pods:      []*corev1.Pod{half.Obj()},
			args:      bindArgs("p", "n1"),
			notLeader: true,
			wantErr:   func(err error) bool { return errors.Is(err, ErrNotLeader) },
		},
		"no room left since filter is a conflict": {
			pods:    append([]*corev1.Pod{half.Obj()}, n1Full...),
			held:    n1Full,
			args:    bindArgs("p", "n1"),
			wantErr: func(err error) bool { return isConflict(err) && gpu.IsInsufficient(err) },
		},
		"GPUs reserved on another node are a conflict": {
			pods:     []*corev1.Pod{half.Obj()},
			reserve:  halfOn("n2", 1),
			args:     bindArgs("p", "n1"),
			wantErr:  isConflict,
			wantHeld: halfOn("n2", 1),
		},
		"a reservation on the node is used as it is": {
			pods:         []*corev1.Pod{half.Obj()},
			reserve:      halfOn("n1", 1),
			args:         bindArgs("p", "n1"),
			wantBindings: []map[string]string{gpu.AllocationAnnotations(halfOn("n1", 1))},
			wantHeld:     halfOn("n1", 1),
			wantPending:  1,
		},
		"a failed Binding rolls the ledger back": {
			pods:         []*corev1.Pod{half.Obj()},
			args:         bindArgs("p", "n1"),
			bindErr:      errors.New("admission webhook denied the request"),
			wantErr:      func(err error) bool { return err != nil },
			wantBindings: []map[string]string{gpu.AllocationAnnotations(halfOn("n1", 0))},
		},
		"a Binding whose answer was lost succeeded": {
			pods:         []*corev1.Pod{half.Obj()},
			args:         bindArgs("p", "n1"),
			bindErr:      errors.New("context deadline exceeded"),
			applied:      true,
			wantBindings: []map[string]string{gpu.AllocationAnnotations(halfOn("n1", 0))},
			wantHeld:     halfOn("n1", 0),
			wantPending:  1,
		},
		"a failed Binding with the pod unreadable keeps the devices": {
			pods:         []*corev1.Pod{half.Obj()},
			args:         bindArgs("p", "n1"),
			bindErr:      errors.New("context deadline exceeded"),
			liveFails:    true,
			wantErr:      func(err error) bool { return err != nil },
			wantBindings: []map[string]string{gpu.AllocationAnnotations(halfOn("n1", 0))},
			wantHeld:     halfOn("n1", 0),
			wantPending:  1,
		},
		"a pod created again under the same name is refused": {
			pods: []*corev1.Pod{half.Obj()},
			args: &extenderv1.ExtenderBindingArgs{PodName: "p", PodNamespace: "ns", PodUID: "old-uid", Node: "n1"},
			wantErr: func(err error) bool {
				return err != nil && !isConflict(err)
			},
		},
		// Whoever asks, bind binds only GPU pods, and only to a node they
		// may run on.
		"a pod without GPUs is refused": {
			pods:    []*corev1.Pod{pt.MakePod("p", "ns").Obj()},
			args:    bindArgs("p", "n1"),
			wantErr: refused("it requests no partita.dev/gpu-milli"),
		},
		"a pod without GPUs whose selector matches no node is refused": {
			pods:    []*corev1.Pod{pt.MakePod("p", "ns").NodeSelector("pool", "nowhere").Obj()},
			args:    bindArgs("p", "n1"),
			wantErr: refused("it requests no partita.dev/gpu-milli"),
		},
		"a gated pod is refused": {
			pods:    []*corev1.Pod{half.Clone().SchedulingGates(v1alpha1.SchedulingGateAdmission).Obj()},
			args:    bindArgs("p", "n1"),
			wantErr: refused("still held by the scheduling gates " + v1alpha1.SchedulingGateAdmission),
		},
		"a pod the cache still shows gated is read again and bound": {
			pods:         []*corev1.Pod{half.Clone().SchedulingGates(v1alpha1.SchedulingGateAdmission).Obj()},
			live:         []*corev1.Pod{half.Obj()},
			args:         bindArgs("p", "n1"),
			wantBindings: []map[string]string{gpu.AllocationAnnotations(halfOn("n1", 0))},
			wantHeld:     halfOn("n1", 0),
			wantPending:  1,
		},
		"a pod the cache still shows gated binds as the loop released it, without reading the API server": {
			pods:         []*corev1.Pod{half.Clone().SchedulingGates(v1alpha1.SchedulingGateAdmission).Obj()},
			released:     []*corev1.Pod{half.Obj()},
			liveFails:    true,
			args:         bindArgs("p", "n1"),
			wantBindings: []map[string]string{gpu.AllocationAnnotations(halfOn("n1", 0))},
			wantHeld:     halfOn("n1", 0),
			wantPending:  1,
		},
		"a pod the cache does not have yet binds as the loop released it": {
			pods:         []*corev1.Pod{half.Obj()},
			notCached:    true,
			released:     []*corev1.Pod{half.Obj()},
			liveFails:    true,
			args:         bindArgs("p", "n1"),
			wantBindings: []map[string]string{gpu.AllocationAnnotations(halfOn("n1", 0))},
			wantHeld:     halfOn("n1", 0),
			wantPending:  1,
		},
		"a released pod of another UID is not used": {
			pods:      []*corev1.Pod{half.Clone().SchedulingGates(v1alpha1.SchedulingGateAdmission).Obj()},
			released:  []*corev1.Pod{half.Clone().UID("uid-earlier").Obj()},
			liveFails: true,
			args:      bindArgs("p", "n1"),
			wantErr:   refused("still held by the scheduling gates " + v1alpha1.SchedulingGateAdmission),
		},
		"a released pod the cache shows ungated is forgotten": {
			pods:         []*corev1.Pod{half.Obj()},
			released:     []*corev1.Pod{half.Obj(), pt.FractionPod("other", "0.5", "500").Obj()},
			args:         bindArgs("p", "n1"),
			wantBindings: []map[string]string{gpu.AllocationAnnotations(halfOn("n1", 0))},
			wantHeld:     halfOn("n1", 0),
			wantPending:  1,
			wantReleased: 1,
		},
		"a pod gated in the cache and unreadable from the API server is refused": {
			pods:      []*corev1.Pod{half.Clone().SchedulingGates(v1alpha1.SchedulingGateAdmission).Obj()},
			liveFails: true,
			args:      bindArgs("p", "n1"),
			wantErr:   refused("still held by the scheduling gates " + v1alpha1.SchedulingGateAdmission),
		},
		"a node that does not exist is refused": {
			pods:    []*corev1.Pod{half.Obj()},
			args:    bindArgs("p", "n9"),
			wantErr: refused("there is no such node"),
		},
		"a node the selector does not match is refused": {
			pods:    []*corev1.Pod{half.Clone().NodeSelector(corev1.LabelHostname, "n2").Obj()},
			args:    bindArgs("p", "n1"),
			wantErr: refused("nodeSelector or required node affinity does not match"),
		},
		"a node the selector matches binds": {
			pods:         []*corev1.Pod{half.Clone().NodeSelector(corev1.LabelHostname, "n1").Obj()},
			args:         bindArgs("p", "n1"),
			wantBindings: []map[string]string{gpu.AllocationAnnotations(halfOn("n1", 0))},
			wantHeld:     halfOn("n1", 0),
			wantPending:  1,
		},
		"a node the required affinity excludes is refused": {
			pods: []*corev1.Pod{half.Clone().RequiredNodeAffinity(corev1.NodeSelectorRequirement{
				Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpNotIn, Values: []string{"n1"}}).Obj()},
			args:    bindArgs("p", "n1"),
			wantErr: refused("nodeSelector or required node affinity does not match"),
		},
		"a node pinned by the admission loop elsewhere is refused": {
			pods:    []*corev1.Pod{half.Clone().Annotation(v1alpha1.AnnotationNode, "n2").Obj()},
			args:    bindArgs("p", "n1"),
			wantErr: refused("it is pinned to node n2"),
		},
		"a tainted node is refused": {
			pods:    []*corev1.Pod{half.Obj()},
			nodes:   []*corev1.Node{pt.MakeNode("n1").Taint("dedicated", "team-b").Obj()},
			args:    bindArgs("p", "n1"),
			wantErr: refused("the node has the taint dedicated=team-b:NoSchedule that the pod does not tolerate"),
		},
		"a tainted node the pod tolerates binds": {
			pods:         []*corev1.Pod{half.Clone().Toleration("dedicated", "team-b").Obj()},
			nodes:        []*corev1.Node{pt.MakeNode("n1").Taint("dedicated", "team-b").Obj()},
			args:         bindArgs("p", "n1"),
			wantBindings: []map[string]string{gpu.AllocationAnnotations(halfOn("n1", 0))},
			wantHeld:     halfOn("n1", 0),
			wantPending:  1,
		},
		"a cordoned node is refused": {
			pods:    []*corev1.Pod{half.Obj()},
			nodes:   []*corev1.Node{pt.MakeNode("n1").Unschedulable().Obj()},
			args:    bindArgs("p", "n1"),
			wantErr: refused("the node is cordoned"),
		},
		"no node is a bad request": {
			args:    &extenderv1.ExtenderBindingArgs{PodName: "p", PodNamespace: "ns"},
			wantErr: IsRequestError,
		},
		"no pod name is a bad request": {
			args:    &extenderv1.ExtenderBindingArgs{Node: "n1"},
			wantErr: IsRequestError,
		},
		"an unknown pod is an error": {
			args:    bindArgs("ghost", "n1"),
			wantErr: func(err error) bool { return err != nil },
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			ctx := pt.Context(t)
			c := fakeClient(tc.pods...)
			if tc.nodes != nil {
				objs := []client.Object{}
				for _, p := range tc.pods {
					objs = append(objs, p)
				}
				for _, n := range tc.nodes {
					objs = append(objs, n)
				}
				c = fakeClientWith(objs...)
			}
			l := pt.Ledger(nodes, tc.held...)
			if tc.reserve != nil {
				if err := l.Assume(tc.reserve); err != nil {
					t.Fatal(err)
				}
			}
			binder := &fakeBinder{c: c, err: tc.bindErr, applied: tc.applied}
			opts := []Option{WithLeader(func() bool { return !tc.notLeader })}
			if tc.liveFails {
				opts = append(opts, WithLiveReader(failingReader{}))
			}
			if tc.live != nil {
				opts = append(opts, WithLiveReader(fakeClient(tc.live...)))
			}
			released := NewReleasedPods(testingclock.NewFakePassiveClock(time.Now()), time.Minute)
			for _, p := range tc.released {
				released.Put(p)
			}
			opts = append(opts, WithReleasedPods(released))
			var cache client.Reader = c
			if tc.notCached {
				cache = fakeClient()
			}
			e := New(l, cache, binder, opts...)
			err := e.Bind(ctx, tc.args)
			if got := len(released.pods); got != tc.wantReleased {
				t.Errorf("%d released pods kept after the bind, want %d", got, tc.wantReleased)
			}
			if tc.wantErr == nil && err != nil {
				t.Fatalf("Bind: %v", err)
			}
			if tc.wantErr != nil && !tc.wantErr(err) {
				t.Fatalf("Bind error = %v", err)
			}
			var gotAnns []map[string]string
			for _, b := range binder.bindings {
				if b.Target.Name != tc.args.Node || b.Name != tc.args.PodName || b.UID != tc.args.PodUID {
					t.Errorf("Binding %s/%s (UID %s) to %s, want pod %s (UID %s) to %s", b.Namespace, b.Name, b.UID, b.Target.Name, tc.args.PodName, tc.args.PodUID, tc.args.Node)
				}
				gotAnns = append(gotAnns, b.Annotations)
			}
			if diff := cmp.Diff(tc.wantBindings, gotAnns, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("Binding annotations (-want,+got):\n%s", diff)
			}
			var gotHeld *gpu.PodAllocation
			if a, ok := l.Allocation("uid-ns-p"); ok {
				gotHeld = a
			}
			if diff := cmp.Diff(tc.wantHeld, gotHeld); diff != "" {
				t.Errorf("ledger's allocation of p (-want,+got):\n%s", diff)
			}
			if got := len(e.pending); got != tc.wantPending {
				t.Errorf("pending binds = %d, want %d", got, tc.wantPending)
			}
			if errs := l.CheckInvariants(); len(errs) > 0 {
				t.Errorf("ledger invariants: %v", errs)
			}
		})
	}
}

// TestBindConcurrently binds 12 quarters at once on one node with two GPUs:
// exactly 8 get devices, no device holds more than 1000 milli, and the pods
// show exactly what the ledger holds.
func TestBindConcurrently(t *testing.T) {
	ctx := pt.Context(t)
	var pods []*corev1.Pod
	for i := range 12 {
		pods = append(pods, pt.FractionPod(fmt.Sprintf("q%02d", i), "0.25", "250").Obj())
	}
	c := fakeClient(pods...)
	l := pt.Ledger([]*v1alpha1.GPUNode{pt.H100Node("n1", 2).Obj()})
	e := New(l, c, &fakeBinder{c: c})
	var wg sync.WaitGroup
	errs := make([]error, len(pods))
	for i, p := range pods {
		wg.Go(func() { errs[i] = e.Bind(ctx, bindArgs(p.Name, "n1")) })
	}
	wg.Wait()
	ok, conflicts := 0, 0
	for _, err := range errs {
		switch {
		case err == nil:
			ok++
		case errors.As(err, new(*ConflictError)):
			conflicts++
		default:
			t.Errorf("Bind: %v", err)
		}
	}
	if ok != 8 || conflicts != 4 {
		t.Errorf("%d bound and %d conflicts, want 8 and 4", ok, conflicts)
	}
	// What the API objects say, rebuilt from scratch, must agree.
	var list corev1.PodList
	if err := c.List(ctx, &list); err != nil {
		t.Fatal(err)
	}
	rebuilt := gpu.BuildLedger([]v1alpha1.GPUNode{*pt.H100Node("n1", 2).Obj()}, list.Items)
	if errs := rebuilt.CheckInvariants(); len(errs) > 0 {
		t.Errorf("invariants of the pods as bound: %v", errs)
	}
	for _, d := range rebuilt.State().Nodes[0].Devices {
		if d.AllocatedMilli != 1000 || d.Allocations != 4 {
			t.Errorf("GPU %d holds %d milli in %d allocations, want 1000 in 4", d.Index, d.AllocatedMilli, d.Allocations)
		}
	}
}

func TestExpire(t *testing.T) {
	half := pt.FractionPod("p", "0.5", "500")
	cases := map[string]struct {
		// inCache is the pod as the informer shows it at expiry.
		inCache  *corev1.Pod
		inAPI    *corev1.Pod
		advance  time.Duration
		wantHeld bool
		wantLeft int
	}{
		"a pod that shows its devices is done": {
			inCache: pt.Bound(half, "n1", 0), inAPI: pt.Bound(half, "n1", 0),
			wantHeld: true,
		},
		"an unbound pod keeps its devices until the TTL": {
			inCache: half.Obj(), inAPI: half.Obj(), advance: 30 * time.Second,
			wantHeld: true, wantLeft: 1,
		},
		"an unbound pod loses its devices after the TTL": {
			inCache: half.Obj(), inAPI: half.Obj(), advance: 61 * time.Second,
		},
		"a pod the informer lags behind is left to the informer": {
			inCache: half.Obj(), inAPI: pt.Bound(half, "n1", 0), advance: 61 * time.Second,
			wantHeld: true,
		},
		"a deleted pod loses its devices after the TTL": {
			advance: 61 * time.Second,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			ctx := pt.Context(t)
			clk := testingclock.NewFakeClock(time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC))
			var cached, api []*corev1.Pod
			if tc.inCache != nil {
				cached = append(cached, tc.inCache)
			}
			if tc.inAPI != nil {
				api = append(api, tc.inAPI)
			}
			l := pt.Ledger([]*v1alpha1.GPUNode{pt.H100Node("n1", 2).Obj()})
			e := New(l, fakeClient(cached...), &fakeBinder{}, WithLiveReader(fakeClient(api...)), WithClock(clk))
			a := halfOn("n1", 0)
			if err := l.Assume(a); err != nil {
				t.Fatal(err)
			}
			e.track(client.ObjectKey{Namespace: "ns", Name: "p"}, a)
			clk.Step(tc.advance)
			e.expire(ctx)
			if _, held := l.Allocation(a.UID); held != tc.wantHeld {
				t.Errorf("ledger holds p: %v, want %v", held, tc.wantHeld)
			}
			if got := len(e.pending); got != tc.wantLeft {
				t.Errorf("pending binds = %d, want %d", got, tc.wantLeft)
			}
		})
	}
}

// TestStartExpires runs the expiry loop on a fake clock.
func TestStartExpires(t *testing.T) {
	ctx, cancel := context.WithCancel(pt.Context(t))
	clk := testingclock.NewFakeClock(time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC))
	c := fakeClient(pt.FractionPod("p", "0.5", "500").Obj())
	l := pt.Ledger([]*v1alpha1.GPUNode{pt.H100Node("n1", 2).Obj()})
	e := New(l, c, &fakeBinder{}, WithClock(clk), WithAssumeTTL(10*time.Second))
	a := halfOn("n1", 0)
	if err := l.Assume(a); err != nil {
		t.Fatal(err)
	}
	e.track(client.ObjectKey{Namespace: "ns", Name: "p"}, a)
	done := make(chan error)
	go func() { done <- e.Start(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, held := l.Allocation(a.UID); !held {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the expired assignment was not dropped")
		}
		if clk.HasWaiters() {
			clk.Step(3 * time.Second)
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Start: %v", err)
	}
}
