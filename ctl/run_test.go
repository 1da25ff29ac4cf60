package ctl

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/report"

	pt "github.com/partita-dev/partita/internal/partitatest"
)

func fakeClient(t *testing.T, objs ...client.Object) client.WithWatch {
	t.Helper()
	s, err := Scheme()
	if err != nil {
		t.Fatal(err)
	}
	return fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).Build()
}

// now is the clock of the why reports these tests print.
var now = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func TestRunWhyJSON(t *testing.T) {
	c := fakeClient(t,
		pt.MakeGPUNode("n1").Devices(1, "H100", 81920).Obj(),
		pt.MakePod("p", "team-a").GPUFraction("0.5").SchedulingGates("example.com/hold").Obj(),
	)
	var b bytes.Buffer
	if err := RunWhy(context.Background(), c, &b, "team-a", "p", OutputJSON, now); err != nil {
		t.Fatal(err)
	}
	want := `{
  "namespace": "team-a",
  "pod": "p",
  "waiting": true,
  "summary": "pod team-a/p waits: held by scheduling gates that are not Partita's: example.com/hold (whoever added them must remove them)",
  "findings": [
    {
      "check": "request",
      "status": "ok",
      "message": "asks for 0.5 of a GPU (container main)",
      "numbers": {
        "gpus": 0.5
      }
    },
    {
      "check": "gates",
      "status": "blocking",
      "message": "held by scheduling gates that are not Partita's: example.com/hold (whoever added them must remove them)"
    },
    {
      "check": "gang",
      "status": "ok",
      "message": "not in a gang: it is admitted on its own"
    },
    {
      "check": "queue",
      "status": "info",
      "message": "names no queue (label partita.dev/queue), and neither does its PodGroup"
    },
    {
      "check": "events",
      "status": "info",
      "message": "no events from partita-admitter or kube-scheduler about the pod"
    },
    {
      "check": "fit",
      "status": "ok",
      "message": "a device has room now: it fits 1 of 1 candidate nodes, e.g. n1, GPU 0 (0.5)",
      "numbers": {
        "candidates": 1,
        "fitting": 1,
        "gpuNodes": 1
      }
    }
  ]
}
`
	if diff := cmp.Diff(want, b.String()); diff != "" {
		t.Errorf("why -o json (-want,+got):\n%s", diff)
	}
}

func TestRunErrors(t *testing.T) {
	noCRDs := interceptor.Funcs{List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
		return &meta.NoKindMatchError{GroupKind: schema.GroupKind{Group: "partita.dev", Kind: "GPUNode"}, SearchedVersions: []string{"v1alpha1"}}
	}}
	s, err := Scheme()
	if err != nil {
		t.Fatal(err)
	}
	bare := fake.NewClientBuilder().WithScheme(s).WithInterceptorFuncs(noCRDs).Build()
	cases := map[string]struct {
		run  func(client.Reader) error
		want error
	}{
		"nodes without CRDs":  {run: func(r client.Reader) error { return RunNodes(context.Background(), r, &bytes.Buffer{}, OutputTable) }, want: report.ErrNoCRDs},
		"queues without CRDs": {run: func(r client.Reader) error { return RunQueues(context.Background(), r, &bytes.Buffer{}, OutputTable) }, want: report.ErrNoCRDs},
		"why without CRDs": {run: func(r client.Reader) error {
			return RunWhy(context.Background(), r, &bytes.Buffer{}, "ns", "p", OutputTable, now)
		}, want: report.ErrNoCRDs},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if err := tc.run(bare); !errors.Is(err, tc.want) {
				t.Errorf("err = %v, want %v", err, tc.want)
			}
		})
	}
	if _, err := ParseOutput("yaml"); err == nil {
		t.Error("ParseOutput(yaml) did not fail")
	}
}

func TestRunNodesByTopology(t *testing.T) {
	gn := pt.MakeGPUNode("n1").Devices(1, "H100", 81920).Obj()
	node := pt.MakeNode("n1").Label("example.com/rack", "r1").Obj()
	racks := pt.MakeTopology("racks", "example.com/rack").Obj()
	zones := pt.MakeTopology("zones", "topology.kubernetes.io/zone").Obj()
	s, err := Scheme()
	if err != nil {
		t.Fatal(err)
	}
	// An API server with Partita's CRDs from before Topology.
	oldCRDs := fake.NewClientBuilder().WithScheme(s).WithObjects(gn, node).WithInterceptorFuncs(interceptor.Funcs{
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			if _, ok := list.(*v1alpha1.TopologyList); ok {
				return &meta.NoKindMatchError{GroupKind: schema.GroupKind{Group: "partita.dev", Kind: "Topology"}, SearchedVersions: []string{"v1alpha1"}}
			}
			return c.List(ctx, list, opts...)
		},
	}).Build()
	cases := map[string]struct {
		client   client.Reader
		topology string
		wantErr  error
		want     string
	}{
		"grouped": {
			client: fakeClient(t, gn, node, racks, zones), topology: "racks",
			want: `NODE  DEVICE  MODEL  HEALTH   USED  FREE      SLICES
n1    0       H100   Healthy  0     1 / 80Gi

TOPOLOGY racks       NODES  GPUS  HEALTHY  USED  FREE  LARGEST FREE  PODS  ISOLATION
example.com/rack=r1  1      1     1        0     1     1             0
  n1                        1     1        0     1     1             0     time-slicing
TOTAL (1 node)       1      1     1        0     1     1             0
`,
		},
		"a Topology that is not there": {
			client: fakeClient(t, gn, node, racks, zones), topology: "blocks", wantErr: report.ErrTopologyNotFound,
			want: `read Topology "blocks": topology not found; the cluster has racks, zones (kubectl get topologies)`,
		},
		"CRDs from before Topology": {
			client: oldCRDs, topology: "racks",
			want: `list Topologies: the cluster does not serve topologies.partita.dev: Partita's CRDs predate Topology (apply crds/ or upgrade the chart): no matches for kind "Topology" in version "partita.dev/v1alpha1"`,
		},
		"without --topology the Topologies are not read": {
			client: oldCRDs,
			want: `NODE  DEVICE  MODEL  HEALTH   USED  FREE      SLICES
n1    0       H100   Healthy  0     1 / 80Gi

NODE            GPUS  HEALTHY  USED  FREE  LARGEST FREE  PODS  ISOLATION
n1              1     1        0     1     1             0     time-slicing
TOTAL (1 node)  1     1        0     1     1             0
`,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var b bytes.Buffer
			err := RunNodesByTopology(context.Background(), tc.client, &b, OutputTable, tc.topology)
			got := b.String()
			if err != nil {
				got = err.Error()
			}
			if tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Errorf("err = %v, want %v", err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("nodes --topology %q (-want,+got):\n%s", tc.topology, diff)
			}
		})
	}
}
