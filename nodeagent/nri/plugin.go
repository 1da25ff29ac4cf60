// Package nri is the agent's NRI plugin (github.com/containerd/nri): the
// container runtime (containerd 2, CRI-O) calls it when it creates a
// container, and it answers with the devices, limit env, mounts and cgroup
// limits of the container's allocation (package containeredit), which
// override whatever the pod spec says. It runs inside `partita agent`
// (--nri) and serves the agent's own node (docs/agent.md, "Container
// creation through NRI").
package nri

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
	"github.com/partita-dev/partita/nodeagent/containeredit"
)

// Registration: the runtime orders plugins by index, then name. The name is
// the one the webhook requires for GPU containers (webhook.NRIPluginName).
const (
	PluginName = "partita"
	PluginIdx  = "10"
)

// DefaultSocketPath is where containerd and CRI-O serve NRI by default.
const DefaultSocketPath = api.DefaultSocketPath

// PodGetter reads the pod of a sandbox: from the agent's cache, or from the
// API server when the cache does not have it yet.
type PodGetter interface {
	GetPod(ctx context.Context, namespace, name string, uid types.UID) (*corev1.Pod, error)
}

// NodeFacts are the node's facts as the agent's last sync read them; ok is
// false until it has read the node's GPUs.
type NodeFacts interface {
	ContainerFacts(node string) (containeredit.Node, *gpu.NodeInventory, bool)
}

// MPSLimits reads the memory limit per client that a device's MPS daemon
// last took (the agent).
type MPSLimits interface {
	MPSMemoryLimit(node, uuid string) (memMiB int64, ok bool)
}

// DefaultMPSWait is how long a new MPS client's container is held for its
// device's daemon to take a limit that covers its slice. Short: containerd
// creates one container at a time while it waits for its NRI plugins
// (every pod of the node, GPU or not, waits behind it), and the agent
// usually raised the limit when the pod was bound, long before.
const DefaultMPSWait = 500 * time.Millisecond

// Options configure a Plugin.
type Options struct {
	// NodeName is the node the agent serves.
	NodeName string
	// SocketPath is the runtime's NRI socket.
	SocketPath string
	// Pods reads pods; Facts the node's facts (both the agent).
	Pods  PodGetter
	Facts NodeFacts
	// Log is where the plugin logs.
	Log logr.Logger
	// Clock times reconnection; the real one when nil.
	Clock clock.Clock
	// RetryInterval is the wait between two connection attempts after the
	// runtime went away (a containerd restart); 2 s when zero.
	RetryInterval time.Duration
	// MPS, when set, holds the container of an MPS client until its
	// device's daemon took a limit that covers its slice (a client keeps
	// the limit it connected under), at most MPSWait (DefaultMPSWait when
	// zero); then, or at once when the daemon took no limit at all, the
	// creation fails and the kubelet retries.
	MPS     MPSLimits
	MPSWait time.Duration
}

// Plugin adjusts the containers of GPU pods at creation.
type Plugin struct {
	opts Options
}

var _ stub.CreateContainerInterface = (*Plugin)(nil)

// New returns a plugin; Run connects it.
func New(opts Options) (*Plugin, error) {
	switch {
	case opts.NodeName == "":
		return nil, errors.New("configure the NRI plugin: no node name")
	case opts.Pods == nil || opts.Facts == nil:
		return nil, errors.New("configure the NRI plugin: no pod or node source")
	}
	if opts.SocketPath == "" {
		opts.SocketPath = DefaultSocketPath
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.RetryInterval <= 0 {
		opts.RetryInterval = 2 * time.Second
	}
	if opts.MPSWait <= 0 {
		opts.MPSWait = DefaultMPSWait
	}
	return &Plugin{opts: opts}, nil
}

// SocketExists reports whether the runtime serves NRI at path.
func SocketExists(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode()&os.ModeSocket != 0
}

// Run serves the runtime until ctx ends. The first connection must work
// (the runtime serves NRI); after that, a lost connection (the runtime
// restarted) is retried until ctx ends.
func (p *Plugin) Run(ctx context.Context) error {
	log := p.opts.Log.WithValues("socket", p.opts.SocketPath)
	for first := true; ; first = false {
		// onClose runs only for a connection that was made.
		var connected atomic.Bool
		s, err := stub.New(p,
			stub.WithPluginName(PluginName), stub.WithPluginIdx(PluginIdx),
			stub.WithSocketPath(p.opts.SocketPath),
			stub.WithLogger(nriLogger{log: log}),
			stub.WithOnClose(func() { connected.Store(true) }),
		)
		if err != nil {
			return fmt.Errorf("create NRI plugin: %w", err)
		}
		err = s.Run(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if first && err != nil && !connected.Load() {
			return fmt.Errorf("connect to the runtime's NRI socket %s: %w", p.opts.SocketPath, err)
		}
		log.Info("Lost the runtime's NRI connection; reconnecting", "err", err)
		select {
		case <-ctx.Done():
			return nil
		case <-p.opts.Clock.After(p.opts.RetryInterval):
		}
	}
}

// CreateContainer answers the runtime's CreateContainer request.
func (p *Plugin) CreateContainer(ctx context.Context, sandbox *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	adj, err := p.Adjust(ctx, sandbox, ctr)
	if err != nil {
		p.opts.Log.Error(err, "Refused to create a container; the kubelet retries", "pod", klog.KRef(sandbox.GetNamespace(), sandbox.GetName()), "container", ctr.GetName())
	}
	return adj, nil, err
}

// Adjust is what the container gets: nil for a pod that asks Partita for
// no GPU (the webhook's void in its spec stands), else its devices and
// limits, or void. An error fails the creation, which the kubelet retries:
// the plugin never lets a GPU container start on a guess.
func (p *Plugin) Adjust(ctx context.Context, sandbox *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, error) {
	uid := types.UID(sandbox.GetUid())
	log := p.opts.Log.WithValues("pod", klog.KRef(sandbox.GetNamespace(), sandbox.GetName()), "container", ctr.GetName())
	pod, err := p.opts.Pods.GetPod(ctx, sandbox.GetNamespace(), sandbox.GetName(), uid)
	switch {
	case apierrors.IsNotFound(err) || (err == nil && pod.UID != uid):
		// A static pod (its mirror has another UID) or one already gone:
		// not a pod Partita placed.
		log.V(4).Info("No API pod for the sandbox; leaving the container alone")
		return nil, nil
	case err != nil && !mentionsPartita(sandbox):
		// The kubelet copies a pod's annotations onto its sandbox: one
		// with no Partita key neither asks for a GPU nor was bound to one,
		// so an API server the agent cannot reach never holds it up.
		log.V(2).Info("Could not read the pod; its sandbox names no Partita key, leaving the container alone", "err", err.Error())
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("adjust container %q: %w", ctr.GetName(), err)
	}
	req, errs := gpu.ParsePod(pod)
	if len(errs) == 0 && req == nil && !hasAllocation(pod) {
		return nil, nil
	}
	node, inv, ready := p.opts.Facts.ContainerFacts(p.opts.NodeName)
	var alloc *gpu.ContainerAllocation
	if req != nil && slices.ContainsFunc(req.Containers, func(c gpu.ContainerRequest) bool { return c.Name == ctr.GetName() }) {
		if !ready {
			return nil, fmt.Errorf("adjust container %q: the agent has not read the node's GPUs yet", ctr.GetName())
		}
		alloc = containerAllocation(log, pod, inv, ctr.GetName())
	}
	if !ready {
		node = containeredit.Node{}
	}
	if err := p.waitMPSLimit(ctx, node, alloc); err != nil {
		return nil, fmt.Errorf("adjust container %q: %w", ctr.GetName(), err)
	}
	adj := containeredit.Adjust(node, containeredit.Container{Env: ctr.GetEnv(), Alloc: alloc})
	if alloc != nil {
		log.V(2).Info("Set a container's devices", "devices", strings.Join(alloc.DeviceUUIDs, ","), "memoryMiB", alloc.MemoryMiB, "mode", node.Mode)
	} else {
		log.V(4).Info("Set a container's devices to void")
	}
	return adj, nil
}

// waitMPSLimit holds an MPS client's container until its device's daemon
// took a memory limit at least as large as the client's slice: a client
// keeps the limit it connects under, and the agent raises the device's
// limit when a larger slice is bound, which may come after the kubelet
// started creating the container. A wait that runs out fails the creation,
// which the kubelet retries, rather than starting a client held below its
// slice.
func (p *Plugin) waitMPSLimit(ctx context.Context, node containeredit.Node, a *gpu.ContainerAllocation) error {
	if p.opts.MPS == nil || node.Mode != v1alpha1.IsolationMPS || a == nil || a.Whole() || len(a.DeviceUUIDs) != 1 || a.MemoryMiB <= 0 {
		return nil
	}
	uuid, need := a.DeviceUUIDs[0], a.MemoryMiB
	deadline := p.opts.Clock.Now().Add(p.opts.MPSWait)
	for {
		got, ok := p.opts.MPS.MPSMemoryLimit(p.opts.NodeName, uuid)
		switch {
		case ok && got >= need:
			return nil
		case !ok:
			// No daemon that took a limit: nothing to wait for here, and
			// the node's other containers wait behind this one.
			return fmt.Errorf("the MPS daemon of GPU %s has taken no memory limit yet (the slice needs %dMiB; check the node's MPSReady condition); the kubelet retries", uuid, need)
		case !p.opts.Clock.Now().Before(deadline):
			return fmt.Errorf("the MPS daemon of GPU %s holds clients to %dMiB, below the slice's %dMiB, until the agent raises it; the kubelet retries", uuid, got, need)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-p.opts.Clock.After(50 * time.Millisecond):
		}
	}
}

// containerAllocation reads the container's allocation from the pod's
// annotations; nil (void) when they are missing or do not read, which
// kubelet's order (containers are created after bind) makes a bug worth a
// log line.
func containerAllocation(log logr.Logger, pod *corev1.Pod, inv *gpu.NodeInventory, name string) *gpu.ContainerAllocation {
	a, err := gpu.AllocationFromPod(pod, inv)
	if err != nil {
		log.Error(err, "GPU container has no readable allocation; giving it no device")
		return nil
	}
	for i := range a.Containers {
		if a.Containers[i].Container == name {
			return &a.Containers[i]
		}
	}
	log.Error(errors.New("no allocation for the container"), "GPU container has no allocation; giving it no device")
	return nil
}

// mentionsPartita reports whether a sandbox carries any of Partita's
// annotations (a GPU pod's canonical request, or the devices written at
// bind).
func mentionsPartita(sandbox *api.PodSandbox) bool {
	for k := range sandbox.GetAnnotations() {
		if strings.HasPrefix(k, v1alpha1.GroupVersion.Group+"/") {
			return true
		}
	}
	return false
}

// hasAllocation reports whether Partita bound devices to the pod.
func hasAllocation(p *corev1.Pod) bool {
	for k := range p.Annotations {
		if strings.HasPrefix(k, v1alpha1.AnnotationDevicesPrefix) {
			return true
		}
	}
	return false
}

// nriLogger sends the NRI library's log through logr.
type nriLogger struct{ log logr.Logger }

func (l nriLogger) Debugf(_ context.Context, format string, args ...any) {
	l.log.V(4).Info(fmt.Sprintf(format, args...))
}

func (l nriLogger) Infof(_ context.Context, format string, args ...any) {
	l.log.V(1).Info(fmt.Sprintf(format, args...))
}

func (l nriLogger) Warnf(_ context.Context, format string, args ...any) {
	l.log.Info(fmt.Sprintf(format, args...))
}

func (l nriLogger) Errorf(_ context.Context, format string, args ...any) {
	l.log.Error(fmt.Errorf(format, args...), "NRI")
}
