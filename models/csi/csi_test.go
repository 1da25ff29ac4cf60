package csi

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr/testr"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/models/node"
)

// fakeMounter records binds by target.
type fakeMounter struct{ mounts map[string]string }

func (f *fakeMounter) BindReadOnly(source, target string) error {
	if f.mounts == nil {
		f.mounts = map[string]string{}
	}
	f.mounts[target] = source
	return nil
}

func (f *fakeMounter) Unmount(target string) error {
	delete(f.mounts, target)
	return nil
}

func (f *fakeMounter) IsMountPoint(target string) (bool, error) {
	_, ok := f.mounts[target]
	return ok, nil
}

type fakeModels struct {
	dir         string
	err         error
	got         []node.PublishRequest
	unpublished []string
}

func (f *fakeModels) Publish(_ context.Context, req node.PublishRequest) (string, error) {
	f.got = append(f.got, req)
	return f.dir, f.err
}

func (f *fakeModels) Unpublish(id string) error {
	f.unpublished = append(f.unpublished, id)
	return nil
}

func publishRequest(target string, vc map[string]string) *csipb.NodePublishVolumeRequest {
	ctx := map[string]string{
		contextEphemeral: "true", contextPodNamespace: "team-a", contextPodName: "p",
		v1alpha1.ModelVolumeAttribute: "llama",
	}
	for k, v := range vc {
		if v == "" {
			delete(ctx, k)
		} else {
			ctx[k] = v
		}
	}
	return &csipb.NodePublishVolumeRequest{
		VolumeId: "csi-123", TargetPath: target, Readonly: true,
		VolumeCapability: &csipb.VolumeCapability{AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{}}},
		VolumeContext:    ctx,
		Secrets:          map[string]string{v1alpha1.ModelSecretAccessKeyID: "k"},
	}
}

func TestNodePublishVolume(t *testing.T) {
	cases := map[string]struct {
		vc         map[string]string
		publishErr error
		wantCode   codes.Code
		wantMsg    string
		wantMounts bool
	}{
		"mounts the model read-only": {wantMounts: true},
		"not ephemeral":              {vc: map[string]string{contextEphemeral: ""}, wantCode: codes.InvalidArgument, wantMsg: "inline ephemeral"},
		"no pod namespace":           {vc: map[string]string{contextPodNamespace: ""}, wantCode: codes.InvalidArgument, wantMsg: "podInfoOnMount"},
		"no model":                   {vc: map[string]string{v1alpha1.ModelVolumeAttribute: ""}, wantCode: codes.InvalidArgument, wantMsg: "names no model"},
		"still fetching":             {publishErr: &node.StillFetchingError{Message: "waiting for model llama on n1: 34%"}, wantCode: codes.Unavailable, wantMsg: "34%"},
		"model of no namespace":      {publishErr: &node.NotFoundError{Namespace: "team-a", Model: "llama"}, wantCode: codes.NotFound, wantMsg: `no Model "llama"`},
		"fetch failed":               {publishErr: errors.New("access denied"), wantCode: codes.FailedPrecondition, wantMsg: "access denied"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			target := filepath.Join(t.TempDir(), "mount")
			fm := &fakeMounter{}
			models := &fakeModels{dir: "/cache/entries/m-1", err: tc.publishErr}
			s := NewServer("n1", "test", models, fm, testr.New(t))
			_, err := s.NodePublishVolume(t.Context(), publishRequest(target, tc.vc))
			if got := status.Code(err); got != tc.wantCode {
				t.Fatalf("code = %v (%v), want %v", got, err, tc.wantCode)
			}
			if tc.wantMsg != "" && !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("error %q does not contain %q", err, tc.wantMsg)
			}
			var want map[string]string
			if tc.wantMounts {
				want = map[string]string{target: "/cache/entries/m-1"}
			}
			if diff := cmp.Diff(want, fm.mounts, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("mounts (-want,+got):\n%s", diff)
			}
			if tc.wantCode == codes.OK {
				want := []node.PublishRequest{{VolumeID: "csi-123", Namespace: "team-a", Model: "llama", Secret: map[string][]byte{v1alpha1.ModelSecretAccessKeyID: []byte("k")}}}
				if diff := cmp.Diff(want, models.got); diff != "" {
					t.Errorf("publish requests (-want,+got):\n%s", diff)
				}
				// The kubelet retries a publish it did not see answered: the
				// same mount is not made twice.
				if _, err := s.NodePublishVolume(t.Context(), publishRequest(target, tc.vc)); err != nil {
					t.Fatal(err)
				}
				if len(fm.mounts) != 1 {
					t.Errorf("%d mounts after a retried publish, want 1", len(fm.mounts))
				}
				if _, err := s.NodeUnpublishVolume(t.Context(), &csipb.NodeUnpublishVolumeRequest{VolumeId: "csi-123", TargetPath: target}); err != nil {
					t.Fatal(err)
				}
				if len(fm.mounts) != 0 || len(models.unpublished) != 1 {
					t.Errorf("after unpublish: mounts %v, unpublished %v", fm.mounts, models.unpublished)
				}
			}
		})
	}
}

// TestServeRegistersWithTheKubelet calls the plugin as the kubelet does:
// the registration socket names the CSI socket, which answers as the driver.
func TestServeRegistersWithTheKubelet(t *testing.T) {
	dir, err := shortTempDir(t)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- Serve(ctx, NewServer("n1", "v-test", &fakeModels{}, &fakeMounter{}, testr.New(t)), dir, testr.New(t))
	}()
	reg := dial(t, RegistrationPath(dir))
	var info *registerapi.PluginInfo
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err = registerapi.NewRegistrationClient(reg).GetInfo(t.Context(), &registerapi.InfoRequest{})
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("GetInfo: %v", err)
	}
	want := &registerapi.PluginInfo{Type: registerapi.CSIPlugin, Name: v1alpha1.ModelCSIDriver, Endpoint: SocketPath(dir), SupportedVersions: []string{"1.0.0"}}
	if info.Type != want.Type || info.Name != want.Name || info.Endpoint != want.Endpoint || !cmp.Equal(info.SupportedVersions, want.SupportedVersions) {
		t.Errorf("GetInfo = %v, want %v", info, want)
	}
	pi, err := csipb.NewIdentityClient(dial(t, info.Endpoint)).GetPluginInfo(t.Context(), &csipb.GetPluginInfoRequest{})
	if err != nil || pi.Name != v1alpha1.ModelCSIDriver || pi.VendorVersion != "v-test" {
		t.Errorf("GetPluginInfo = %v, %v", pi, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Serve() = %v", err)
	}
}

func dial(t *testing.T, sock string) *grpc.ClientConn {
	t.Helper()
	c, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}
