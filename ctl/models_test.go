package ctl

import (
	"bytes"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/internal/envtestutil"
	pt "github.com/partita-dev/partita/internal/partitatest"
)

func TestModelsTable(t *testing.T) {
	llama := &v1alpha1.Model{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "llama"},
		Spec: v1alpha1.ModelSpec{Source: v1alpha1.ModelSource{URI: "s3://models/llama-3-8b"}},
		Status: v1alpha1.ModelStatus{Phase: v1alpha1.ModelReady, Size: 16 << 30,
			Conditions: []metav1.Condition{{Type: v1alpha1.ModelConditionReady, Status: metav1.ConditionTrue, Reason: "Ready", Message: "held on 1 node(s): n1"}},
			Nodes: []v1alpha1.ModelNodeStatus{
				{Name: "n2", Phase: v1alpha1.ModelFetching, Bytes: 4 << 30, Total: 16 << 30, Message: "waiting for model llama on n2: 25% (4.3 GB of 17.2 GB) at 1.1 GB/s"},
				{Name: "n1", Phase: v1alpha1.ModelReady, Bytes: 16 << 30, Total: 16 << 30, Message: "fetched 17.2 GB in 14.0s"},
			}}}
	gemma := &v1alpha1.Model{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "gemma"},
		Spec: v1alpha1.ModelSpec{Source: v1alpha1.ModelSource{URI: "file:///models/gemma"}}}
	pods := []*corev1.Pod{
		pt.MakePod("serve-0", "team-a").Annotation(v1alpha1.AnnotationModel, "llama").Phase(corev1.PodRunning).Obj(),
		pt.MakePod("serve-1", "team-a").Annotation(v1alpha1.AnnotationModel, "llama, gemma").Phase(corev1.PodPending).Obj(),
	}
	b := fake.NewClientBuilder().WithScheme(envtestutil.Scheme()).WithObjects(llama, gemma)
	for _, p := range pods {
		b = b.WithObjects(p)
	}
	c := b.Build()
	cases := map[string]struct {
		name string
		want string
	}{
		"every model": {want: `NAMESPACE  MODEL  PHASE    SIZE  NODES READY  FETCHING  FAILED  PODS RUNNING  WAITING  SOURCE
team-a     gemma  Pending  -     0            0         0       0             1        file:///models/gemma
team-a     llama  Ready    16Gi  1            1         0       1             1        s3://models/llama-3-8b
`},
		"one model, node by node": {name: "llama", want: `NAMESPACE  MODEL  PHASE  SIZE  NODES READY  FETCHING  FAILED  PODS RUNNING  WAITING  SOURCE
team-a     llama  Ready  16Gi  1            1         0       1             1        s3://models/llama-3-8b

team-a/llama: held on 1 node(s): n1
NODE  PHASE     HELD                 MESSAGE
n1    Ready     16Gi of 16Gi (100%)  fetched 17.2 GB in 14.0s
n2    Fetching  4Gi of 16Gi (25%)    waiting for model llama on n2: 25% (4.3 GB of 17.2 GB) at 1.1 GB/s
pods running: serve-0
pods pending: serve-1
`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var out bytes.Buffer
			if err := RunModels(t.Context(), c, &out, "team-a", tc.name, OutputTable); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, out.String()); diff != "" {
				t.Errorf("output (-want,+got):\n%s", diff)
			}
		})
	}
	if err := RunModels(t.Context(), c, &bytes.Buffer{}, "team-a", "nope", OutputTable); err == nil || err.Error() != `no Model "nope" in namespace "team-a"` {
		t.Errorf("an unknown model: %v", err)
	}
}

func TestBytesOf(t *testing.T) {
	for name, tc := range map[string]struct {
		n    int64
		want string
	}{
		"none":               {0, "-"},
		"bytes":              {1000, "1000"},
		"whole GiB":          {16 << 30, "16Gi"},
		"a model's odd size": {268_437_915, "256.0Mi"},
		"just under a unit":  {1023 << 10, "1023Ki"},
		"a huge one":         {3 << 60, "3Ei"},
	} {
		t.Run(name, func(t *testing.T) {
			if got := bytesOf(tc.n); got != tc.want {
				t.Errorf("bytesOf(%d) = %q, want %q", tc.n, got, tc.want)
			}
		})
	}
}
