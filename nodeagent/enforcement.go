package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"

	"github.com/containerd/nri/pkg/api"
	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
	"github.com/partita-dev/partita/nodeagent/containeredit"
	"github.com/partita-dev/partita/nodeagent/dmem"
	"github.com/partita-dev/partita/nodeagent/interposer"
)

// Defaults of EnforcementConfig.
const (
	DefaultCgroupRoot    = "/sys/fs/cgroup"
	DefaultInterposerDir = interposer.DefaultHostDir
	DefaultDevRoot       = "/dev"
)

// EnforcementConfig says how the node applies slices, for the GPUNode's
// status.enforcement and for the NRI plugin.
type EnforcementConfig struct {
	// ContainerPath is how the device env reaches containers: nri when the
	// agent serves as the runtime's NRI plugin; pod-spec by default (cdi
	// with the DRA backend).
	ContainerPath v1alpha1.ContainerPath
	// CgroupRoot is the host's cgroup v2 root, where dmem.capacity is.
	CgroupRoot string
	// InterposerDir is the host directory of the interposer library and
	// its ld.so.preload.
	InterposerDir string
	// DevRoot is the host's /dev, where the device nodes are.
	DevRoot string
}

func (c *EnforcementConfig) defaults(dra bool) {
	if c.ContainerPath == "" {
		c.ContainerPath = v1alpha1.ContainerPathPodSpec
		if dra {
			c.ContainerPath = v1alpha1.ContainerPathCDI
		}
	}
	if c.CgroupRoot == "" {
		c.CgroupRoot = DefaultCgroupRoot
	}
	if c.InterposerDir == "" {
		c.InterposerDir = DefaultInterposerDir
	}
	if c.DevRoot == "" {
		c.DevRoot = DefaultDevRoot
	}
}

// containerFacts is what the NRI plugin needs of a served node, as its last
// sync saw it.
type containerFacts struct {
	node containeredit.Node
	inv  *gpu.NodeInventory
	// mps reads the limits of the node's MPS daemons in mps mode.
	mps mpsLimits
}

// mpsLimits reads the memory limits a node's MPS daemons took: the
// agent's own daemons (mgr), or those the keeper records in stateFile.
// The zero value knows none.
type mpsLimits struct {
	mgr       *mpsManager
	stateFile string
	node      string
}

func (l mpsLimits) memLimit(uuid string) (int64, bool) {
	if l.mgr != nil {
		return l.mgr.memLimit(uuid)
	}
	if l.stateFile == "" {
		return 0, false
	}
	var rec mpsState
	if ok, err := readStateFile(l.stateFile, &rec); err != nil || !ok || (rec.Node != "" && rec.Node != l.node) {
		return 0, false
	}
	for _, d := range rec.Daemons {
		if d.UUID == uuid && d.MemLimitMiB > 0 {
			return d.MemLimitMiB, true
		}
	}
	return 0, false
}

// enforcement reads what caps slices on the node (the driver, dmem, the
// interposer) and keeps the facts the NRI plugin needs.
func (a *Agent) enforcement(ctx context.Context, st *nodeState, mode v1alpha1.IsolationMode, inv *gpu.NodeInventory) *v1alpha1.Enforcement {
	cfg := a.opts.Enforcement
	out := &v1alpha1.Enforcement{ContainerPath: cfg.ContainerPath}
	if interposerInstalled(cfg.InterposerDir) {
		out.Interposer = filepath.Join(cfg.InterposerDir, interposer.LibraryName)
	}
	var info DriverInfo
	var infoErr error
	if dr, ok := st.backend.(DriverReader); ok {
		info, infoErr = dr.DriverInfo(ctx)
	} else {
		infoErr = errors.New("the backend does not read the driver")
	}
	out.Dmem.DriverVersion = info.Version
	var support dmem.Support
	if infoErr != nil {
		support.Reason = fmt.Sprintf("cannot read the driver: %v", infoErr)
	} else {
		var capacity []byte
		var capErr error
		if dr, ok := st.backend.(DmemReader); ok {
			capacity, capErr = dr.DmemCapacity()
		} else {
			capacity, capErr = dmem.ReadCapacity(cfg.CgroupRoot)
		}
		devices := make([]dmem.Device, 0, len(info.Devices))
		if inv != nil {
			for _, d := range inv.Devices {
				devices = append(devices, dmem.Device{UUID: d.UUID, BusID: info.Devices[d.UUID].BusID})
			}
		}
		support = dmem.Detect(capacity, capErr, info.Version, devices)
	}
	out.Dmem.Available, out.Dmem.Reason = support.Available, truncate(support.Reason, 512)
	out.MemoryCap = containeredit.MemoryCap(mode, cfg.ContainerPath, support.Available, out.Interposer != "")
	if st.enforcementNote != out.Dmem.Reason {
		st.enforcementNote = out.Dmem.Reason
		logr.FromContextOrDiscard(ctx).Info("Read the node's memory enforcement", "containerPath", out.ContainerPath, "memoryCap", out.MemoryCap, "dmem", out.Dmem.Available, "reason", out.Dmem.Reason, "interposer", out.Interposer)
	}

	if inv != nil && cfg.ContainerPath == v1alpha1.ContainerPathNRI {
		facts := containerFacts{inv: inv, node: containeredit.Node{Mode: mode, MPSDir: a.opts.MPS.Dir}}
		if out.Interposer != "" {
			facts.node.InterposerDir = cfg.InterposerDir
		}
		if support.Available {
			facts.node.DmemRegions = support.Regions
		}
		facts.node.DeviceNodes, facts.node.ControlNodes = deviceNodes(cfg.DevRoot, info)
		if mode == v1alpha1.IsolationMPS {
			_, sim := st.backend.(*Simulated)
			switch {
			case a.opts.MPS.Keeper && !sim:
				facts.mps = mpsLimits{stateFile: filepath.Join(a.opts.MPS.StateDir, mpsStateFile), node: st.name}
			case st.mps != nil:
				facts.mps = mpsLimits{mgr: st.mps}
			}
		}
		a.lock.Lock()
		a.facts[st.name] = facts
		a.lock.Unlock()
	}
	return out
}

// interposerInstalled reports whether partita interposer has put a valid
// library and preload list in dir.
func interposerInstalled(dir string) bool {
	_, ok := interposer.Installed(dir)
	return ok
}

// deviceNodes reads the device nodes of the devices and the driver's
// control nodes under devRoot, those that exist.
func deviceNodes(devRoot string, info DriverInfo) (map[string]*api.LinuxDevice, []*api.LinuxDevice) {
	byUUID := map[string]*api.LinuxDevice{}
	for uuid, addr := range info.Devices {
		if addr.Minor < 0 {
			continue
		}
		name := "nvidia" + strconv.Itoa(int(addr.Minor))
		if d, err := charDevice(filepath.Join(devRoot, name), "/dev/"+name); err == nil {
			byUUID[uuid] = d
		}
	}
	var control []*api.LinuxDevice
	for _, name := range []string{"nvidiactl", "nvidia-uvm"} {
		if d, err := charDevice(filepath.Join(devRoot, name), "/dev/"+name); err == nil {
			control = append(control, d)
		}
	}
	return byUUID, control
}

// ContainerFacts returns what the NRI plugin needs to adjust a container on
// node: the node's facts and inventory as the last sync read them. ok is
// false until the agent has read the node's GPUs.
func (a *Agent) ContainerFacts(node string) (containeredit.Node, *gpu.NodeInventory, bool) {
	a.lock.Lock()
	defer a.lock.Unlock()
	f, ok := a.facts[node]
	return f.node, f.inv, ok
}

// MPSMemoryLimit is the memory limit per client that the MPS daemon of
// device uuid on node last took; ok is false while none is known (no
// daemon yet, or none that took a limit).
func (a *Agent) MPSMemoryLimit(node, uuid string) (memMiB int64, ok bool) {
	a.lock.Lock()
	f := a.facts[node]
	a.lock.Unlock()
	return f.mps.memLimit(uuid)
}

// GetPod returns a pod bound to a served node from the cache, or, when
// the cache does not have it with that UID (it was created a moment ago),
// from the API server.
func (a *Agent) GetPod(ctx context.Context, namespace, name string, uid types.UID) (*corev1.Pod, error) {
	key := client.ObjectKey{Namespace: namespace, Name: name}
	pod := &corev1.Pod{}
	err := a.cache.Get(ctx, key, pod)
	if err == nil && pod.UID == uid {
		return pod, nil
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("read pod %s from the cache: %w", key, err)
	}
	pod = &corev1.Pod{}
	if err := a.client.Get(ctx, key, pod); err != nil {
		return nil, fmt.Errorf("read pod %s: %w", key, err)
	}
	return pod, nil
}
