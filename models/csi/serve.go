package csi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// DefaultKubeletDir is the kubelet's --root-dir.
const DefaultKubeletDir = "/var/lib/kubelet"

// SocketPath is where the plugin serves CSI under the kubelet's directory.
func SocketPath(kubeletDir string) string {
	return filepath.Join(kubeletDir, "plugins", v1alpha1.ModelCSIDriver, "csi.sock")
}

// RegistrationPath is the socket the kubelet's plugin watcher finds. Its
// name is short: a unix socket's path has at most 107 bytes, and a
// kubelet's root directory may be long (the dev cluster's real node's is).
func RegistrationPath(kubeletDir string) string {
	return filepath.Join(kubeletDir, "plugins_registry", "partita-models.sock")
}

// Serve serves CSI on SocketPath and registers with the kubelet through
// RegistrationPath until ctx ends; it removes both sockets when it returns.
func Serve(ctx context.Context, srv *Server, kubeletDir string, log logr.Logger) error {
	csiSock := SocketPath(kubeletDir)
	csiL, err := listen(csiSock)
	if err != nil {
		return err
	}
	regSock := RegistrationPath(kubeletDir)
	regL, err := listen(regSock)
	if err != nil {
		_ = csiL.Close()
		return err
	}
	csiS := grpc.NewServer(grpc.UnaryInterceptor(logErrors(log)))
	csipb.RegisterIdentityServer(csiS, srv)
	csipb.RegisterNodeServer(csiS, srv)
	regS := grpc.NewServer()
	registerapi.RegisterRegistrationServer(regS, &registration{endpoint: csiSock, log: log})

	errs := make(chan error, 2)
	go func() { errs <- serveOn(csiS, csiL, csiSock) }()
	go func() { errs <- serveOn(regS, regL, regSock) }()
	log.Info("Serving the model cache's CSI node plugin", "socket", csiSock, "registration", regSock)
	select {
	case <-ctx.Done():
		err = nil
	case err = <-errs:
	}
	regS.Stop() // first: the kubelet deregisters a plugin whose socket goes
	csiS.GracefulStop()
	_ = os.Remove(regSock)
	_ = os.Remove(csiSock)
	return err
}

func listen(sock string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(sock), 0o750); err != nil {
		return nil, fmt.Errorf("make directory of %s: %w", sock, err)
	}
	// A socket left by an earlier process would refuse the listen.
	if err := os.Remove(sock); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove stale socket %s: %w", sock, err)
	}
	l, err := net.Listen("unix", sock)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", sock, err)
	}
	// Only root (the kubelet) may call it.
	if err := os.Chmod(sock, 0o600); err != nil {
		_ = l.Close()
		return nil, fmt.Errorf("restrict %s: %w", sock, err)
	}
	return l, nil
}

func serveOn(s *grpc.Server, l net.Listener, sock string) error {
	if err := s.Serve(l); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("serve %s: %w", sock, err)
	}
	return nil
}

// logErrors logs the calls that fail, at the level a person debugging a
// pod stuck in ContainerCreating would look.
func logErrors(log logr.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		if err != nil {
			log.V(1).Info("CSI call failed", "method", info.FullMethod, "error", err.Error())
		}
		return resp, err
	}
}

// registration answers the kubelet's plugin watcher.
type registration struct {
	registerapi.UnimplementedRegistrationServer
	endpoint string
	log      logr.Logger
}

func (r *registration) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{
		Type:              registerapi.CSIPlugin,
		Name:              v1alpha1.ModelCSIDriver,
		Endpoint:          r.endpoint,
		SupportedVersions: []string{"1.0.0"},
	}, nil
}

func (r *registration) NotifyRegistrationStatus(_ context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if st.PluginRegistered {
		r.log.Info("Registered with the kubelet")
	} else {
		r.log.Error(errors.New(st.Error), "The kubelet refused the registration")
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}
