package dra

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/go-logr/logr"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
	"github.com/partita-dev/partita/nodeagent/interposer"
)

// DefaultKubeletDir is the kubelet's default --root-dir, under which it
// finds plugins (plugins_registry) and they keep their sockets (plugins/).
const DefaultKubeletDir = "/var/lib/kubelet"

// PluginOptions configure the kubelet plugin.
type PluginOptions struct {
	// NodeName is the node the plugin serves.
	NodeName string
	// KubeletDir is the kubelet's root directory (DefaultKubeletDir).
	KubeletDir string
	// CDIDir is where the CDI specs go (DefaultCDIDir); the container
	// runtime must read CDI specs from it.
	CDIDir string
	// MPSDir is the agent's --mps-dir.
	MPSDir string
	// InterposerDir is the agent's --interposer-dir: hami-core slices get
	// the interposer from there when it is installed.
	InterposerDir string
}

// Plugin is Partita's DRA kubelet plugin on one real node: it registers with
// the kubelet, publishes the node's devices as its pool, and prepares each
// claim the kubelet hands it by writing the claim's CDI spec (cdi.go).
type Plugin struct {
	opts   PluginOptions
	helper *kubeletplugin.Helper
	log    logr.Logger

	lock sync.Mutex
	// devices and mode are the node's, as the agent last read them.
	devices []v1alpha1.GPUDevice
	mode    v1alpha1.IsolationMode
	// last is what was published.
	last []resourceapi.Device
}

var _ kubeletplugin.DRAPlugin = (*Plugin)(nil)

// StartPlugin registers the plugin with the node's kubelet and serves it
// until ctx ends or Stop. It publishes nothing until the first Publish.
func StartPlugin(ctx context.Context, client kubernetes.Interface, opts PluginOptions) (*Plugin, error) {
	if opts.NodeName == "" {
		return nil, errors.New("start the DRA kubelet plugin: no node name")
	}
	if opts.KubeletDir == "" {
		opts.KubeletDir = DefaultKubeletDir
	}
	if opts.CDIDir == "" {
		opts.CDIDir = DefaultCDIDir
	}
	p := &Plugin{opts: opts, log: logr.FromContextOrDiscard(ctx).WithName("dra-plugin")}
	registry := filepath.Join(opts.KubeletDir, "plugins_registry")
	data := filepath.Join(opts.KubeletDir, "plugins", DriverName)
	for _, d := range []string{registry, data, opts.CDIDir} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			return nil, fmt.Errorf("start the DRA kubelet plugin: %w", err)
		}
	}
	h, err := kubeletplugin.Start(klog.NewContext(ctx, p.log), p,
		kubeletplugin.DriverName(DriverName),
		kubeletplugin.NodeName(opts.NodeName),
		kubeletplugin.KubeClient(client),
		kubeletplugin.RegistrarDirectoryPath(registry),
		kubeletplugin.PluginDataDirectoryPath(data),
		kubeletplugin.HealthService(false),
	)
	if err != nil {
		return nil, fmt.Errorf("start the DRA kubelet plugin: %w", err)
	}
	p.helper = h
	p.log.Info("Started the DRA kubelet plugin", "driver", DriverName, "registry", registry, "socket", data, "cdiDir", opts.CDIDir)
	return p, nil
}

// Stop unregisters the plugin; its slices stay for the next agent.
func (p *Plugin) Stop() {
	if p.helper != nil {
		p.helper.Stop()
	}
}

// Publish records the node's devices and isolation mode (what Prepare reads)
// and publishes them as the node's pool.
func (p *Plugin) Publish(_ context.Context, node string, nd NodeDevices) error {
	if node != p.opts.NodeName {
		return fmt.Errorf("publish devices of %s: the kubelet plugin serves %s", node, p.opts.NodeName)
	}
	devices, mode := nd.Devices, nd.Mode
	res := Resources(node, nd)
	want := res.Pools[node].Slices[0].Devices
	p.lock.Lock()
	defer p.lock.Unlock()
	p.devices, p.mode = slices.Clone(devices), mode
	if p.last != nil && resourceslice.DevicesDeepEqual(p.last, want) {
		return nil
	}
	if err := p.helper.PublishResources(context.Background(), *res); err != nil {
		return fmt.Errorf("publish ResourceSlices: %w", err)
	}
	p.last = want
	return nil
}

// Release is Publisher's: the plugin's node is never released while it runs.
func (p *Plugin) Release(context.Context, string) error { return nil }

// PrepareResourceClaims implements kubeletplugin.DRAPlugin.
func (p *Plugin) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	p.lock.Lock()
	devices, mode := p.devices, p.mode
	p.lock.Unlock()
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, c := range claims {
		res, err := p.prepare(c, devices, mode)
		if err != nil {
			var te *TenancyError
			if errors.As(err, &te) {
				p.log.Info("Refused a slice on an MPS GPU of another namespace; the kubelet retries", "claim", klog.KObj(c), "devices", te.Devices, "otherNamespaces", te.Others)
				out[c.UID] = kubeletplugin.PrepareResult{Err: err}
				continue
			}
			p.log.Error(err, "Could not prepare claim", "claim", klog.KObj(c))
			out[c.UID] = kubeletplugin.PrepareResult{Err: err}
			continue
		}
		p.log.V(2).Info("Prepared claim", "claim", klog.KObj(c), "devices", len(res.Devices))
		out[c.UID] = res
	}
	return out, nil
}

func (p *Plugin) prepare(c *resourceapi.ResourceClaim, devices []v1alpha1.GPUDevice, mode v1alpha1.IsolationMode) (kubeletplugin.PrepareResult, error) {
	var none kubeletplugin.PrepareResult
	if devices == nil {
		return none, errors.New("the agent has not read the node's GPUs yet; the kubelet will try again")
	}
	reqs, results, err := PreparedRequests(c, p.opts.NodeName, devices)
	if err != nil {
		return none, err
	}
	used, err := PreparedConsumption(p.opts.CDIDir, c.UID)
	if err != nil {
		return none, err
	}
	if err := checkRoom(used, reqs, devices); err != nil {
		return none, err
	}
	if mode == v1alpha1.IsolationMPS {
		if err := checkTenancy(c.Namespace, used, reqs); err != nil {
			return none, err
		}
		for _, r := range reqs {
			if len(r.Devices) == 1 && !r.Whole {
				// The mount needs the directory when the container starts;
				// the MPS daemon opens its pipe there when it runs.
				if err := os.MkdirAll(MPSPipeDir(p.opts.MPSDir, r.Devices[0].UUID), 0o755); err != nil {
					return none, fmt.Errorf("create the MPS pipe directory: %w", err)
				}
			}
		}
	}
	node := CDINode{Mode: mode, MPSDir: p.opts.MPSDir}
	if (mode == v1alpha1.IsolationHAMiCore || mode == v1alpha1.IsolationMPS) && p.opts.InterposerDir != "" {
		// mps too: a slice over several devices gets the interposer.
		if _, ok := interposer.Installed(p.opts.InterposerDir); ok {
			node.InterposerDir = p.opts.InterposerDir
		} else if mode == v1alpha1.IsolationHAMiCore {
			p.log.Info("hami-core slice on a node without the interposer installed: its memory is capped by the watchdog only", "claim", klog.KObj(c), "dir", p.opts.InterposerDir)
		}
	}
	if err := WriteCDISpec(p.opts.CDIDir, c.UID, CDISpec(c.UID, c.Namespace, reqs, node)); err != nil {
		return none, err
	}
	res := kubeletplugin.PrepareResult{}
	given := map[string]bool{}
	for _, r := range results {
		d := kubeletplugin.Device{Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device, ShareID: r.ShareID}
		// One CDI device per request carries all of its devices (one
		// NVIDIA_VISIBLE_DEVICES); it goes with the request's first.
		if !given[r.Request] {
			d.CDIDeviceIDs = []string{CDIDeviceID(c.UID, r.Request)}
			given[r.Request] = true
		}
		res.Devices = append(res.Devices, d)
	}
	return res, nil
}

// checkRoom is the last line of defence against a device booked twice: the
// claims prepared on the node (used, without this one) and this claim's
// requests may together consume no more of a device than it has.
func checkRoom(used map[string]Consumption, reqs []PreparedRequest, devices []v1alpha1.GPUDevice) error {
	used = maps.Clone(used)
	for _, r := range reqs {
		for _, d := range r.Devices {
			u := used[d.Device]
			u.Milli += d.Milli
			u.MemoryMiB += d.MemoryMiB
			used[d.Device] = u
		}
	}
	var problems []string
	for _, name := range sortedKeys(used) {
		i := slices.IndexFunc(devices, func(g v1alpha1.GPUDevice) bool { return DeviceName(g.Index) == name })
		if i < 0 {
			continue
		}
		u := used[name]
		if u.Milli > gpu.MilliPerGPU || u.MemoryMiB > devices[i].MemoryMiB {
			problems = append(problems, fmt.Sprintf("%s would hold %d milli-GPUs and %dMi of %dMi", name, u.Milli, u.MemoryMiB, devices[i].MemoryMiB))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("refused to prepare a claim that overbooks a device: %s", strings.Join(problems, "; "))
	}
	return nil
}

// checkTenancy keeps an MPS device to one namespace: every client of a
// device's MPS daemon can command it (quit, set its limits), so a slice of
// namespace may not join a device whose prepared claims (used) belong to
// another. kube-scheduler's allocator does not know this rule (the ledger's
// placement does, for the extender backend), so this is where a DRA claim
// learns it: the kubelet retries, and the pod starts once the device is
// free of the other namespace.
func checkTenancy(namespace string, used map[string]Consumption, reqs []PreparedRequest) error {
	e := &TenancyError{Namespace: namespace}
	for _, r := range reqs {
		if r.Whole {
			continue
		}
		for _, d := range r.Devices {
			for _, other := range used[d.Device].Namespaces {
				if other == namespace {
					continue
				}
				if !slices.Contains(e.Devices, d.Device) {
					e.Devices = append(e.Devices, d.Device)
				}
				if !slices.Contains(e.Others, other) {
					e.Others = append(e.Others, other)
				}
			}
		}
	}
	if len(e.Devices) > 0 {
		return e
	}
	return nil
}

// TenancyError refuses a slice on an mps node's GPU that serves another
// namespace. Its message, which reaches the pod's events and so its
// tenant, does not name the other namespaces; the agent's log does
// (Others; "" for a claim an earlier agent prepared without recording it).
type TenancyError struct {
	Namespace string
	Devices   []string
	Others    []string
}

func (e *TenancyError) Error() string {
	verb := "serve"
	if len(e.Devices) == 1 {
		verb = "serves"
	}
	return fmt.Sprintf("refused to prepare a slice of namespace %s: %s already %s MPS clients of another namespace; in mps mode a GPU serves one namespace, because every client can command its MPS daemon (the kubelet retries; the pod starts when the GPU is free)",
		e.Namespace, strings.Join(e.Devices, ", "), verb)
}

// UnprepareResourceClaims implements kubeletplugin.DRAPlugin.
func (p *Plugin) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		out[c.UID] = RemoveCDISpec(p.opts.CDIDir, c.UID)
		p.log.V(2).Info("Unprepared claim", "claim", c.NamespacedName, "err", out[c.UID])
	}
	return out, nil
}

// HandleError implements kubeletplugin.DRAPlugin: publishing errors are
// logged and retried.
func (p *Plugin) HandleError(_ context.Context, err error, msg string) {
	p.log.Error(err, "DRA kubelet plugin error", "detail", msg)
}

// WatchHealthStatus implements kubeletplugin.DRAPlugin; health goes into the
// device taints instead (devices.go), and the service is off.
func (p *Plugin) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

// PreparedRequests resolves a claim's allocation on node against the node's
// devices: its requests of Partita's driver with their devices, what each
// consumes and the compute limit its configuration asks for, and the
// allocation results they come from.
func PreparedRequests(c *resourceapi.ResourceClaim, node string, devices []v1alpha1.GPUDevice) ([]PreparedRequest, []resourceapi.DeviceRequestAllocationResult, error) {
	if c.Status.Allocation == nil {
		return nil, nil, fmt.Errorf("claim %s/%s is not allocated", c.Namespace, c.Name)
	}
	var reqs []PreparedRequest
	var results []resourceapi.DeviceRequestAllocationResult
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver != DriverName {
			continue
		}
		if r.Pool != node {
			return nil, nil, fmt.Errorf("claim %s/%s holds %s of pool %s, not of this node's pool %s", c.Namespace, c.Name, r.Device, r.Pool, node)
		}
		i := slices.IndexFunc(devices, func(d v1alpha1.GPUDevice) bool { return DeviceName(d.Index) == r.Device })
		if i < 0 {
			return nil, nil, fmt.Errorf("claim %s/%s holds %s, which this node does not have", c.Namespace, c.Name, r.Device)
		}
		dev := devices[i]
		pd := PreparedDevice{Device: r.Device, UUID: dev.UUID, Milli: gpu.MilliPerGPU, MemoryMiB: dev.MemoryMiB}
		if q, ok := r.ConsumedCapacity[CapacityCompute]; ok {
			pd.Milli = clampMilli(q.Value())
		}
		if q, ok := r.ConsumedCapacity[CapacityMemory]; ok {
			pd.MemoryMiB = min(dev.MemoryMiB, (q.Value()+(1<<20)-1)>>20)
		}
		j := slices.IndexFunc(reqs, func(p PreparedRequest) bool { return p.Request == r.Request })
		if j < 0 {
			sm, err := smLimit(c, r.Request)
			if err != nil {
				return nil, nil, err
			}
			reqs = append(reqs, PreparedRequest{Request: r.Request, Whole: true, SMLimitPercent: sm})
			j = len(reqs) - 1
		}
		reqs[j].Devices = append(reqs[j].Devices, pd)
		if pd.Milli < gpu.MilliPerGPU || pd.MemoryMiB < dev.MemoryMiB {
			reqs[j].Whole = false
		}
		results = append(results, r)
	}
	return reqs, results, nil
}

// smLimit reads the compute limit of request from the claim's allocated
// configuration (SliceConfig of Partita's driver).
func smLimit(c *resourceapi.ResourceClaim, request string) (int32, error) {
	base, _, _ := strings.Cut(request, "/")
	var out int32
	for _, cfg := range c.Status.Allocation.Devices.Config {
		if cfg.Opaque == nil || cfg.Opaque.Driver != DriverName {
			continue
		}
		if len(cfg.Requests) > 0 && !slices.Contains(cfg.Requests, base) && !slices.Contains(cfg.Requests, request) {
			continue
		}
		var sc SliceConfig
		if err := json.Unmarshal(cfg.Opaque.Parameters.Raw, &sc); err != nil {
			return 0, fmt.Errorf("claim %s/%s: read the configuration of %s: %w", c.Namespace, c.Name, DriverName, err)
		}
		if sc.Kind != SliceConfigKind || sc.SMLimitPercent < 0 || sc.SMLimitPercent > 100 {
			return 0, fmt.Errorf("claim %s/%s: the configuration of %s must be a %s with smLimitPercent from 0 to 100", c.Namespace, c.Name, DriverName, SliceConfigKind)
		}
		out = sc.SMLimitPercent
	}
	return out, nil
}
