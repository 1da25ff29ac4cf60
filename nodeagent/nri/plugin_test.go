package nri

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	"github.com/go-logr/logr/testr"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
	"github.com/partita-dev/partita/nodeagent/containeredit"
)

type fakePods struct {
	pods map[string]*corev1.Pod
	err  error
}

func (f fakePods) GetPod(_ context.Context, namespace, name string, _ types.UID) (*corev1.Pod, error) {
	if f.err != nil {
		return nil, f.err
	}
	if p, ok := f.pods[namespace+"/"+name]; ok {
		return p, nil
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "pods"}, name)
}

type fakeFacts struct {
	node  containeredit.Node
	inv   *gpu.NodeInventory
	ready bool
}

func (f fakeFacts) ContainerFacts(string) (containeredit.Node, *gpu.NodeInventory, bool) {
	return f.node, f.inv, f.ready
}

func makePod(name string, annotations map[string]string, containers ...string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: name, UID: types.UID(name + "-uid"), Annotations: annotations},
		Spec:       corev1.PodSpec{NodeName: "gpu-1"},
	}
	for _, c := range containers {
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: c})
	}
	return p
}

func TestPluginCreateContainer(t *testing.T) {
	inv := &gpu.NodeInventory{Name: "gpu-1", Isolation: v1alpha1.IsolationMPS, Devices: []gpu.Device{
		{Index: 0, UUID: "GPU-a", MemoryMiB: 81920, Healthy: true},
		{Index: 1, UUID: "GPU-b", MemoryMiB: 81920, Healthy: true},
	}}
	node := containeredit.Node{Mode: v1alpha1.IsolationMPS, MPSDir: "/run/partita/mps"}
	slice := makePod("slice", map[string]string{
		v1alpha1.AnnotationGPUMemory:               "20Gi",
		v1alpha1.AnnotationNode:                    "gpu-1",
		v1alpha1.AnnotationDevicesPrefix + "main":  "GPU-b",
		v1alpha1.AnnotationMemLimitPrefix + "main": "20480M",
	}, "main", "sidecar")
	unbound := makePod("unbound", map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi"}, "main")
	plain := makePod("plain", nil, "web")
	pods := fakePods{pods: map[string]*corev1.Pod{"team-a/slice": slice, "team-a/unbound": unbound, "team-a/plain": plain}}

	sandbox := func(p string) *api.PodSandbox {
		return &api.PodSandbox{Namespace: "team-a", Name: p, Uid: p + "-uid"}
	}
	adjust := func(build func(a *api.ContainerAdjustment)) *api.ContainerAdjustment {
		a := &api.ContainerAdjustment{}
		build(a)
		return a
	}
	void := adjust(func(a *api.ContainerAdjustment) {
		a.AddEnv(containeredit.EnvVisibleDevices, containeredit.VisibleDevicesVoid)
	})
	cases := map[string]struct {
		pods    PodGetter
		facts   fakeFacts
		sandbox *api.PodSandbox
		ctr     *api.Container
		want    *api.ContainerAdjustment
		wantErr bool
	}{
		"slice container gets its device and limits over hostile env": {
			pods: pods, facts: fakeFacts{node: node, inv: inv, ready: true}, sandbox: sandbox("slice"),
			ctr: &api.Container{Name: "main", Env: []string{"NVIDIA_VISIBLE_DEVICES=GPU-a", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=80G"}},
			want: adjust(func(a *api.ContainerAdjustment) {
				a.AddEnv(containeredit.EnvVisibleDevices, "GPU-b")
				a.AddEnv(containeredit.EnvMPSPipeDirectory, containeredit.MPSPipeMountPath)
				a.AddEnv(containeredit.EnvMPSPinnedMemLimit, "20480M")
				a.AddMount(&api.Mount{Source: "/run/partita/mps/GPU-b/pipe", Destination: containeredit.MPSPipeMountPath, Type: "bind", Options: []string{"rbind", "rw", "nosuid", "nodev"}})
			}),
		},
		"the GPU pod's other container gets void": {
			pods: pods, facts: fakeFacts{node: node, inv: inv, ready: true}, sandbox: sandbox("slice"),
			ctr: &api.Container{Name: "sidecar"}, want: void,
		},
		"an init container of a GPU pod gets void before the facts are read": {
			pods: pods, sandbox: sandbox("slice"), ctr: &api.Container{Name: "init"}, want: void,
		},
		"a GPU container without an allocation fails safe to void": {
			pods: pods, facts: fakeFacts{node: node, inv: inv, ready: true}, sandbox: sandbox("unbound"),
			ctr: &api.Container{Name: "main", Env: []string{"NVIDIA_VISIBLE_DEVICES=all"}}, want: void,
		},
		"a GPU container before the agent read the node is refused": {
			pods: pods, sandbox: sandbox("slice"), ctr: &api.Container{Name: "main"}, wantErr: true,
		},
		"a pod without a GPU request is left alone": {
			pods: pods, facts: fakeFacts{node: node, inv: inv, ready: true}, sandbox: sandbox("plain"), ctr: &api.Container{Name: "web"},
		},
		"a sandbox without an API pod is left alone": {
			pods: pods, facts: fakeFacts{node: node, inv: inv, ready: true}, sandbox: sandbox("static"), ctr: &api.Container{Name: "c"},
		},
		"a sandbox whose pod has another UID is left alone": {
			pods: pods, facts: fakeFacts{node: node, inv: inv, ready: true},
			sandbox: &api.PodSandbox{Namespace: "team-a", Name: "slice", Uid: "old-uid"}, ctr: &api.Container{Name: "main"},
		},
		"an API error is refused, not guessed": {
			pods: fakePods{err: errors.New("connection refused")}, facts: fakeFacts{node: node, inv: inv, ready: true},
			sandbox: &api.PodSandbox{Namespace: "team-a", Name: "slice", Uid: "slice-uid", Annotations: slice.Annotations},
			ctr:     &api.Container{Name: "main"}, wantErr: true,
		},
		// An agent cut off from the API server never stops pods that
		// use no GPU.
		"an API error for a pod without Partita's keys leaves it alone": {
			pods: fakePods{err: errors.New("connection refused")}, facts: fakeFacts{node: node, inv: inv, ready: true},
			sandbox: &api.PodSandbox{Namespace: "team-a", Name: "plain", Uid: "plain-uid", Annotations: map[string]string{"kubernetes.io/config.source": "api"}},
			ctr:     &api.Container{Name: "web"},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			p, err := New(Options{NodeName: "gpu-1", Pods: tc.pods, Facts: tc.facts, Log: testr.New(t)})
			if err != nil {
				t.Fatal(err)
			}
			got, updates, err := p.CreateContainer(context.Background(), tc.sandbox, tc.ctr)
			if (err != nil) != tc.wantErr {
				t.Fatalf("CreateContainer() error = %v, want error %v", err, tc.wantErr)
			}
			if len(updates) > 0 {
				t.Errorf("CreateContainer() updated other containers: %v", updates)
			}
			if diff := cmp.Diff(tc.want, got, protocmp.Transform()); diff != "" {
				t.Errorf("CreateContainer() (-want +got):\n%s", diff)
			}
		})
	}
}

// TestPluginRegistersForCreateContainer: the NRI stub takes the plugin and
// subscribes it to container creation under Partita's name and index.
func TestPluginRegistersForCreateContainer(t *testing.T) {
	p, err := New(Options{NodeName: "gpu-1", Pods: fakePods{}, Facts: fakeFacts{}, Log: testr.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	c1, c2 := net.Pipe()
	defer func() { _ = c1.Close() }()
	defer func() { _ = c2.Close() }()
	if _, err := stub.New(p, stub.WithPluginName(PluginName), stub.WithPluginIdx(PluginIdx), stub.WithConnection(c1), stub.WithLogger(nriLogger{log: testr.New(t)})); err != nil {
		t.Fatalf("stub.New() error = %v", err)
	}
}

func TestPluginRunFailsWithoutSocket(t *testing.T) {
	p, err := New(Options{NodeName: "gpu-1", Pods: fakePods{}, Facts: fakeFacts{}, Log: testr.New(t), SocketPath: t.TempDir() + "/nri.sock"})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Run(context.Background()); err == nil {
		t.Fatal("Run() without a socket: want an error")
	}
	if SocketExists(t.TempDir() + "/nri.sock") {
		t.Error("SocketExists() on a missing path = true")
	}
}

// fakeMPS answers the limit of GPU-b's daemon from a function of the number
// of times it was asked.
type fakeMPS struct {
	asked *int
	limit func(asked int) (int64, bool)
}

func (f fakeMPS) MPSMemoryLimit(_, uuid string) (int64, bool) {
	if uuid != "GPU-b" {
		return 0, false
	}
	*f.asked++
	return f.limit(*f.asked)
}

// An MPS client keeps the limit it connected under: its container waits for
// its device's daemon to take a limit that covers its slice, or fails (the
// kubelet retries), rather than start held below its slice.
func TestPluginHoldsMPSClientsUntilTheirLimit(t *testing.T) {
	inv := &gpu.NodeInventory{Name: "gpu-1", Isolation: v1alpha1.IsolationMPS, Devices: []gpu.Device{
		{Index: 1, UUID: "GPU-b", MemoryMiB: 81920, Healthy: true},
	}}
	slice := makePod("slice", map[string]string{
		v1alpha1.AnnotationGPUMemory:               "20Gi",
		v1alpha1.AnnotationNode:                    "gpu-1",
		v1alpha1.AnnotationDevicesPrefix + "main":  "GPU-b",
		v1alpha1.AnnotationMemLimitPrefix + "main": "20480M",
	}, "main")
	pods := fakePods{pods: map[string]*corev1.Pod{"team-a/slice": slice}}
	sandbox := &api.PodSandbox{Namespace: "team-a", Name: "slice", Uid: "slice-uid"}
	cases := map[string]struct {
		mode    v1alpha1.IsolationMode
		limit   func(asked int) (int64, bool)
		wantErr string
		// wantAsked is how often the limit was read, 0 for any.
		wantAsked int
	}{
		"the daemon already allows the slice": {
			mode: v1alpha1.IsolationMPS, limit: func(int) (int64, bool) { return 40960, true }, wantAsked: 1,
		},
		"the daemon takes the slice's limit while the container waits": {
			mode: v1alpha1.IsolationMPS,
			limit: func(asked int) (int64, bool) {
				if asked < 4 {
					return 1, true
				}
				return 20480, true
			},
			wantAsked: 4,
		},
		"a daemon below the slice fails the creation": {
			mode: v1alpha1.IsolationMPS, limit: func(int) (int64, bool) { return 10240, true },
			wantErr: `adjust container "main": the MPS daemon of GPU GPU-b holds clients to 10240MiB, below the slice's 20480MiB, until the agent raises it; the kubelet retries`,
		},
		"no daemon yet fails the creation at once": {
			mode: v1alpha1.IsolationMPS, limit: func(int) (int64, bool) { return 0, false },
			wantErr:   `adjust container "main": the MPS daemon of GPU GPU-b has taken no memory limit yet (the slice needs 20480MiB; check the node's MPSReady condition); the kubelet retries`,
			wantAsked: 1,
		},
		"other modes do not wait": {
			mode: v1alpha1.IsolationHAMiCore, limit: func(int) (int64, bool) { return 0, false }, wantAsked: -1,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			asked := 0
			clk := testingclock.NewFakeClock(time.Now())
			facts := fakeFacts{node: containeredit.Node{Mode: tc.mode, MPSDir: "/run/partita/mps"}, inv: inv, ready: true}
			p, err := New(Options{NodeName: "gpu-1", Pods: pods, Facts: facts, MPS: fakeMPS{asked: &asked, limit: tc.limit}, Clock: clk, Log: testr.New(t)})
			if err != nil {
				t.Fatal(err)
			}
			// Time passes only while the plugin waits.
			done := make(chan struct{})
			go func() {
				for {
					select {
					case <-done:
						return
					default:
					}
					if clk.HasWaiters() {
						clk.Step(50 * time.Millisecond)
					}
					time.Sleep(time.Millisecond)
				}
			}()
			_, _, err = p.CreateContainer(context.Background(), sandbox, &api.Container{Name: "main"})
			close(done)
			gotErr := ""
			if err != nil {
				gotErr = err.Error()
			}
			if diff := cmp.Diff(tc.wantErr, gotErr); diff != "" {
				t.Errorf("CreateContainer() error (-want +got):\n%s", diff)
			}
			switch {
			case tc.wantAsked == -1 && asked != 0:
				t.Errorf("the limit was read %d times in mode %s", asked, tc.mode)
			case tc.wantAsked > 0 && asked != tc.wantAsked:
				t.Errorf("the limit was read %d times, want %d", asked, tc.wantAsked)
			case tc.wantAsked == 0 && asked < int(DefaultMPSWait/(50*time.Millisecond)):
				t.Errorf("gave up after %d reads, before the wait ran out", asked)
			}
		})
	}
}
