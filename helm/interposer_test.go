package helm_test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/partita-dev/partita/devcluster"
	"github.com/partita-dev/partita/helm"
	"github.com/partita-dev/partita/nodeagent/interposer"
)

// TestChartInterposer: the interposer DaemonSet runs wherever hami-core may
// run (agent.interposer.enabled null: isolation hami-core or empty, on real
// GPUs), installs the library of the image the values name into hostDir,
// and reads it from an image volume, or from an init container's copy
// without image volumes.
func TestChartInterposer(t *testing.T) {
	type want struct {
		Source, HostDir, Image string
		ImageVolume            bool
		InitCommand            []string
	}
	defaults := &want{
		Source:      "--source=/interposer-source/k8s-vgpu/lib/nvidia/libvgpu.so.v2.10.0",
		HostDir:     interposer.DefaultHostDir,
		Image:       "docker.io/projecthami/hami:v2.10.0",
		ImageVolume: true,
	}
	cases := map[string]struct {
		args []string
		want *want // nil: no interposer
	}{
		"per-node isolation": {want: defaults},
		"hami-core":          {args: []string{"--set", "agent.isolation=hami-core"}, want: defaults},
		"time-slicing":       {args: []string{"--set", "agent.isolation=time-slicing"}},
		"mps":                {args: []string{"--set", "agent.isolation=mps"}},
		"simulated":          {args: []string{"--set", "agent.simulate=8xH100-80GB"}},
		"disabled":           {args: []string{"--set", "agent.interposer.enabled=false"}},
		"no agent":           {args: []string{"--set", "agent.enabled=false", "--set", "agent.interposer.enabled=true"}},
		"forced on a simulated agent": {
			args: []string{"--set", "agent.simulate=8xH100-80GB", "--set", "agent.isolation=mps", "--set", "agent.interposer.enabled=true"},
			want: defaults,
		},
		"own image and host directory": {
			args: []string{"--set", "agent.interposer.image=registry.example/hami-core:1", "--set", "agent.interposer.libraryPath=/libvgpu.so",
				"--set", "agent.interposer.hostDir=/opt/partita/interposer"},
			want: &want{Source: "--source=/interposer-source/libvgpu.so", HostDir: "/opt/partita/interposer", Image: "registry.example/hami-core:1", ImageVolume: true},
		},
		"copied without image volumes": {
			args: []string{"--set", "agent.interposer.imageVolume=false"},
			want: &want{Source: "--source=/interposer-source/libvgpu.so", HostDir: interposer.DefaultHostDir, Image: defaults.Image,
				InitCommand: []string{"cp", "--", "/k8s-vgpu/lib/nvidia/libvgpu.so.v2.10.0", "/interposer-source/libvgpu.so"}},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var ds appsv1.DaemonSet
			if !find(t, render(t, tc.args...), "DaemonSet", "partita-interposer", &ds) {
				if tc.want != nil {
					t.Fatal("no interposer DaemonSet")
				}
				return
			}
			if tc.want == nil {
				t.Fatal("an interposer DaemonSet where hami-core cannot run")
			}
			spec := ds.Spec.Template.Spec
			got := want{}
			var c corev1.Container
			for _, cc := range spec.Containers {
				if cc.Name == "interposer" {
					c = cc
				}
			}
			for _, a := range c.Args {
				if strings.HasPrefix(a, "--source=") {
					got.Source = a
				}
			}
			for _, v := range spec.Volumes {
				switch {
				case v.Name == "host" && v.HostPath != nil:
					got.HostDir = v.HostPath.Path
					if !slices.Contains(c.Args, "--host-dir="+v.HostPath.Path) {
						t.Errorf("args %v lack --host-dir=%s", c.Args, v.HostPath.Path)
					}
				case v.Name == "source" && v.Image != nil:
					got.ImageVolume, got.Image = true, v.Image.Reference
				}
			}
			for _, ic := range spec.InitContainers {
				got.Image, got.InitCommand = ic.Image, ic.Command
			}
			if diff := cmp.Diff(*tc.want, got); diff != "" {
				t.Errorf("(-want,+got):\n%s", diff)
			}
			if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
				t.Error("the interposer gets an API token; it needs none")
			}
			if sc := c.SecurityContext; sc == nil || sc.Capabilities == nil || !cmp.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) ||
				len(sc.Capabilities.Add) > 0 || sc.Privileged != nil && *sc.Privileged {
				t.Errorf("security context %+v: want every capability dropped, none added", sc)
			}
		})
	}
}

// TestChartRefusesBadInterposerValues: the schema catches paths the
// template cannot use.
func TestChartRefusesBadInterposerValues(t *testing.T) {
	bin := helmBinary(t)
	for name, set := range map[string]string{
		"relative host directory":   "agent.interposer.hostDir=var/lib/x",
		"host directory with slash": "agent.interposer.hostDir=/var/lib/x/",
		"quote in host directory":   `agent.interposer.hostDir=/var/lib/x"y`,
		"relative library path":     "agent.interposer.libraryPath=libvgpu.so",
		"no image":                  "agent.interposer.image=",
		"unknown pull policy":       "agent.interposer.pullPolicy=Sometimes",
		"enabled as a string":       "agent.interposer.enabled=auto",
		"a typo in a key":           "agent.interposer.hostdir=/x",
	} {
		t.Run(name, func(t *testing.T) {
			cmd := exec.CommandContext(t.Context(), bin, "template", "partita", helm.ChartName, "--kube-version", devcluster.K8sVersion, "--set", set)
			out, err := cmd.CombinedOutput()
			if err == nil || !strings.Contains(string(out), "values don't meet the specifications of the schema") {
				t.Errorf("--set %s: err %v, want a schema error:\n%s", set, err, out)
			}
		})
	}
}
