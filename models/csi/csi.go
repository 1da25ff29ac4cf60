// Package csi is the node's model cache as a CSI node plugin: the kubelet
// mounts a pod's inline volume of driver models.partita.dev (the webhook
// adds one per model the pod asks for) by calling NodePublishVolume, which
// returns only once the model's files are complete and verified in the
// node's cache, bind-mounted read-only at the volume's target. Until then
// the kubelet starts none of the pod's containers and shows the answer
// ("waiting for model NAME on NODE: 34% ...") in the pod's events.
//
// The plugin registers itself with the kubelet (plugins_registry), as the
// node-driver-registrar sidecar would, so that it needs no second image.
package csi

import (
	"context"
	"errors"

	"os"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/models/node"
)

// Volume context keys the kubelet sets (CSIDriver podInfoOnMount).
const (
	contextPodNamespace = "csi.storage.k8s.io/pod.namespace"
	contextPodName      = "csi.storage.k8s.io/pod.name"
	contextEphemeral    = "csi.storage.k8s.io/ephemeral"
)

// Publisher is what the plugin needs of the node's model service.
type Publisher interface {
	Publish(ctx context.Context, req node.PublishRequest) (string, error)
	Unpublish(volumeID string) error
}

// Server implements CSI's Identity and Node services.
type Server struct {
	csipb.UnimplementedIdentityServer
	csipb.UnimplementedNodeServer

	nodeName string
	version  string
	models   Publisher
	mounter  Mounter
	log      logr.Logger
}

// Mounter makes and removes the read-only binds.
type Mounter interface {
	BindReadOnly(source, target string) error
	Unmount(target string) error
	IsMountPoint(target string) (bool, error)
}

// NewServer returns the plugin of nodeName; mounter nil means the host's
// (system calls: the image has no mount program).
func NewServer(nodeName, version string, models Publisher, mounter Mounter, log logr.Logger) *Server {
	if mounter == nil {
		mounter = HostMounter{}
	}
	return &Server{nodeName: nodeName, version: version, models: models, mounter: mounter, log: log}
}

// GetPluginInfo names the driver.
func (s *Server) GetPluginInfo(context.Context, *csipb.GetPluginInfoRequest) (*csipb.GetPluginInfoResponse, error) {
	return &csipb.GetPluginInfoResponse{Name: v1alpha1.ModelCSIDriver, VendorVersion: s.version}, nil
}

// GetPluginCapabilities: a node plugin only, no controller service.
func (s *Server) GetPluginCapabilities(context.Context, *csipb.GetPluginCapabilitiesRequest) (*csipb.GetPluginCapabilitiesResponse, error) {
	return &csipb.GetPluginCapabilitiesResponse{}, nil
}

// Probe says the plugin is ready.
func (s *Server) Probe(context.Context, *csipb.ProbeRequest) (*csipb.ProbeResponse, error) {
	return &csipb.ProbeResponse{}, nil
}

// NodeGetInfo returns the node's name as its ID.
func (s *Server) NodeGetInfo(context.Context, *csipb.NodeGetInfoRequest) (*csipb.NodeGetInfoResponse, error) {
	return &csipb.NodeGetInfoResponse{NodeId: s.nodeName}, nil
}

// NodeGetCapabilities: no staging, no stats.
func (s *Server) NodeGetCapabilities(context.Context, *csipb.NodeGetCapabilitiesRequest) (*csipb.NodeGetCapabilitiesResponse, error) {
	return &csipb.NodeGetCapabilitiesResponse{}, nil
}

// NodePublishVolume serves a model into a pod: it resolves the model in the
// pod's namespace (the kubelet's word, never the volume's), waits for its
// files and bind-mounts them read-only at the target.
func (s *Server) NodePublishVolume(ctx context.Context, req *csipb.NodePublishVolumeRequest) (*csipb.NodePublishVolumeResponse, error) {
	vc := req.GetVolumeContext()
	target := req.GetTargetPath()
	switch {
	case req.GetVolumeId() == "":
		return nil, status.Error(codes.InvalidArgument, "no volume ID")
	case target == "":
		return nil, status.Error(codes.InvalidArgument, "no target path")
	case req.GetVolumeCapability().GetMount() == nil:
		return nil, status.Error(codes.InvalidArgument, "models are served as a mounted directory, not a block device")
	case vc[contextEphemeral] != "true":
		return nil, status.Error(codes.InvalidArgument, "models are served as inline ephemeral volumes only (the webhook adds them for partita.dev/model)")
	case vc[contextPodNamespace] == "":
		return nil, status.Error(codes.InvalidArgument, "the kubelet did not say the pod's namespace: the CSIDriver "+v1alpha1.ModelCSIDriver+" needs podInfoOnMount: true")
	case vc[v1alpha1.ModelVolumeAttribute] == "":
		return nil, status.Error(codes.InvalidArgument, "the volume names no model (volumeAttributes."+v1alpha1.ModelVolumeAttribute+")")
	}
	log := s.log.WithValues("pod", vc[contextPodNamespace]+"/"+vc[contextPodName], "model", vc[v1alpha1.ModelVolumeAttribute], "volume", req.GetVolumeId())
	mounted, err := s.mounter.IsMountPoint(target)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "check target %s: %v", target, err)
	}
	dir, err := s.models.Publish(ctx, node.PublishRequest{
		VolumeID:  req.GetVolumeId(),
		Namespace: vc[contextPodNamespace],
		Model:     vc[v1alpha1.ModelVolumeAttribute],
		Secret:    secretBytes(req.GetSecrets()),
	})
	if err != nil {
		return nil, publishStatus(err)
	}
	if mounted {
		return &csipb.NodePublishVolumeResponse{}, nil
	}
	if err := os.MkdirAll(target, 0o750); err != nil {
		return nil, status.Errorf(codes.Internal, "make target %s: %v", target, err)
	}
	if err := s.mounter.BindReadOnly(dir, target); err != nil {
		return nil, status.Errorf(codes.Internal, "bind %s read-only at %s: %v", dir, target, err)
	}
	log.Info("Published model")
	return &csipb.NodePublishVolumeResponse{}, nil
}

// NodeUnpublishVolume unmounts the target and unpins the model.
func (s *Server) NodeUnpublishVolume(_ context.Context, req *csipb.NodeUnpublishVolumeRequest) (*csipb.NodeUnpublishVolumeResponse, error) {
	if req.GetVolumeId() == "" || req.GetTargetPath() == "" {
		return nil, status.Error(codes.InvalidArgument, "no volume ID or target path")
	}
	target := req.GetTargetPath()
	mounted, err := s.mounter.IsMountPoint(target)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "check target %s: %v", target, err)
	}
	if mounted {
		if err := s.mounter.Unmount(target); err != nil {
			return nil, status.Errorf(codes.Internal, "unmount %s: %v", target, err)
		}
	}
	if err := os.Remove(target); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, status.Errorf(codes.Internal, "remove %s: %v", target, err)
	}
	if err := s.models.Unpublish(req.GetVolumeId()); err != nil {
		return nil, status.Errorf(codes.Internal, "unpin volume %s: %v", req.GetVolumeId(), err)
	}
	return &csipb.NodeUnpublishVolumeResponse{}, nil
}

// publishStatus maps the service's errors to codes the kubelet retries on
// (all of them: a model may appear, a fetch may complete).
func publishStatus(err error) error {
	var still *node.StillFetchingError
	var nf *node.NotFoundError
	switch {
	case errors.As(err, &still):
		return status.Error(codes.Unavailable, still.Message)
	case errors.As(err, &nf):
		return status.Error(codes.NotFound, nf.Error())
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	return status.Error(codes.FailedPrecondition, err.Error())
}

func secretBytes(in map[string]string) map[string][]byte {
	if len(in) == 0 {
		return nil
	}
	out := make(map[string][]byte, len(in))
	for k, v := range in {
		out[k] = []byte(v)
	}
	return out
}
