package policy

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	testingclock "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/partita-dev/partita/api/v1alpha1"
)

const testNamespace = "partita-system"

func policyConfigMap(name string, data map[string]string) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNamespace,
			Labels: map[string]string{v1alpha1.LabelPolicy: PolicyLabelValue}},
		Data: data,
	}
}

const siteRule = "package partita.admission\ndeny contains \"site rule\" if input.request.gpuMilli > 100\n"

func newFakeClient(t testing.TB, funcs interceptor.Funcs, objs ...client.Object) client.WithWatch {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	return fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).WithInterceptorFuncs(funcs).Build()
}

// TestConfigMapLoaderReconcile loads the ConfigMaps, and on a broken policy
// keeps the last good one; both outcomes are written to each ConfigMap's
// status annotation and announced by an Event.
func TestConfigMapLoaderReconcile(t *testing.T) {
	cases := map[string]struct {
		configMaps []*corev1.ConfigMap
		// before loads this policy first, to show which one stays.
		before     Bundle
		wantDeny   []string
		wantStatus string
		wantEvents []string
	}{
		"no ConfigMap: the default bundle": {
			before:   Bundle{"x.rego": "package partita.admission\ndeny contains \"old\" if true"},
			wantDeny: nil,
		},
		"a site rule over the default": {
			configMaps: []*corev1.ConfigMap{policyConfigMap("site", map[string]string{"site.rego": siteRule, "README": "not Rego"})},
			wantDeny:   []string{"site rule"},
			wantStatus: "Loaded: policy ",
			wantEvents: []string{"Normal PolicyLoaded Loaded: policy "},
		},
		"a broken policy keeps the last good one": {
			configMaps: []*corev1.ConfigMap{policyConfigMap("site", map[string]string{"site.rego": "package partita.admission\ndeny contains x if {"})},
			before:     DefaultBundle().Overlay(map[string]string{"site.rego": siteRule}),
			wantDeny:   []string{"site rule"},
			wantStatus: "Refused: compile policy configmap:partita-system/site: ",
			wantEvents: []string{"Warning PolicyRefused Refused: compile policy configmap:partita-system/site: "},
		},
		"two ConfigMaps may not set the same file": {
			configMaps: []*corev1.ConfigMap{
				policyConfigMap("a", map[string]string{"site.rego": siteRule}),
				policyConfigMap("b", map[string]string{"site.rego": siteRule}),
			},
			wantStatus: "Refused: ConfigMaps partita-system/a and partita-system/b both set site.rego",
			wantEvents: []string{
				"Warning PolicyRefused Refused: ConfigMaps partita-system/a and partita-system/b both set site.rego",
				"Warning PolicyRefused Refused: ConfigMaps partita-system/a and partita-system/b both set site.rego",
			},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			e := newTestEngine(t)
			if tc.before != nil {
				if _, err := e.Load(t.Context(), tc.before, "before"); err != nil {
					t.Fatal(err)
				}
			}
			var objs []client.Object
			for _, cm := range tc.configMaps {
				objs = append(objs, cm)
			}
			cl := newFakeClient(t, interceptor.Funcs{}, objs...)
			rec := events.NewFakeRecorder(10)
			l := NewConfigMapLoader(cl, cl, e, rec, testNamespace, time.Millisecond, testingclock.NewFakeClock(time.Now()))
			if err := l.Reconcile(t.Context()); err != nil {
				t.Fatal(err)
			}
			got, err := e.Admission(t.Context(), input("team-a", "team-a", 500))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.wantDeny, got.Deny, cmpEmpty()); diff != "" {
				t.Errorf("decision (-want,+got):\n%s", diff)
			}
			for _, cm := range tc.configMaps {
				var cur corev1.ConfigMap
				if err := cl.Get(t.Context(), client.ObjectKeyFromObject(cm), &cur); err != nil {
					t.Fatal(err)
				}
				if st := cur.Annotations[AnnotationPolicyStatus]; !strings.HasPrefix(st, tc.wantStatus) {
					t.Errorf("status of %s = %q, want prefix %q", cm.Name, st, tc.wantStatus)
				}
			}
			if diff := cmp.Diff(tc.wantEvents, drain(rec), cmpEmpty(), prefixes()); diff != "" {
				t.Errorf("events (-want prefixes,+got):\n%s", diff)
			}
			// Nothing changed: a second pass writes and announces nothing.
			if err := l.Reconcile(t.Context()); err != nil {
				t.Fatal(err)
			}
			if evs := drain(rec); len(evs) > 0 {
				t.Errorf("a second reconcile announced %v", evs)
			}
		})
	}
}

func TestConfigMapLoaderAPIErrors(t *testing.T) {
	boom := errors.New("boom")
	cm := policyConfigMap("site", map[string]string{"site.rego": siteRule})
	cases := map[string]interceptor.Funcs{
		"list fails": {List: func(context.Context, client.WithWatch, client.ObjectList, ...client.ListOption) error { return boom }},
		"patch fails": {Patch: func(context.Context, client.WithWatch, client.Object, client.Patch, ...client.PatchOption) error {
			return boom
		}},
	}
	for name, funcs := range cases {
		t.Run(name, func(t *testing.T) {
			cl := newFakeClient(t, funcs, cm.DeepCopy())
			l := NewConfigMapLoader(cl, cl, newTestEngine(t), nil, testNamespace, time.Millisecond, testingclock.NewFakeClock(time.Now()))
			if err := l.Reconcile(t.Context()); !errors.Is(err, boom) && !strings.Contains(err.Error(), "boom") {
				t.Errorf("Reconcile() = %v, want the API error", err)
			}
		})
	}
}

func TestConfigMapLoaderCheck(t *testing.T) {
	existing := policyConfigMap("a", map[string]string{"site.rego": siteRule})
	cases := map[string]struct {
		cm          *corev1.ConfigMap
		wantCompile bool
		wantErr     bool
	}{
		"valid update of the same ConfigMap": {cm: policyConfigMap("a", map[string]string{"site.rego": siteRule + "\n# changed"})},
		"valid new ConfigMap":                {cm: policyConfigMap("b", map[string]string{"other.rego": siteRule})},
		"broken":                             {cm: policyConfigMap("b", map[string]string{"other.rego": "package x\nallow if {"}), wantCompile: true},
		"clashes with another ConfigMap":     {cm: policyConfigMap("b", map[string]string{"site.rego": siteRule}), wantErr: true},
		"label removed: no longer a policy": {cm: func() *corev1.ConfigMap {
			c := policyConfigMap("a", map[string]string{"site.rego": "broken {"})
			c.Labels = nil
			return c
		}()},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			cl := newFakeClient(t, interceptor.Funcs{}, existing.DeepCopy())
			e := newTestEngine(t)
			before := e.Version()
			l := NewConfigMapLoader(cl, cl, e, nil, testNamespace, time.Millisecond, testingclock.NewFakeClock(time.Now()))
			err := l.CheckConfigMap(t.Context(), tc.cm)
			if IsCompile(err) != tc.wantCompile || (err != nil) != (tc.wantCompile || tc.wantErr) {
				t.Errorf("CheckConfigMap() = %v, want compile error %v, error %v", err, tc.wantCompile, tc.wantErr)
			}
			if e.Version() != before {
				t.Error("CheckConfigMap loaded a policy")
			}
		})
	}
}

// TestConfigMapLoaderStart: Start reconciles at once and again after a
// trigger, batching triggers.
func TestConfigMapLoaderStart(t *testing.T) {
	cl := newFakeClient(t, interceptor.Funcs{})
	e := newTestEngine(t)
	l := NewConfigMapLoader(cl, cl, e, nil, testNamespace, time.Millisecond, clockReal())
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() { _ = l.Start(ctx) }()
	waitFor(t, l.Synced)
	if err := cl.Create(ctx, policyConfigMap("site", map[string]string{"site.rego": siteRule})); err != nil {
		t.Fatal(err)
	}
	want := DefaultBundle().Overlay(map[string]string{"site.rego": siteRule}).Version()
	for range 3 {
		l.batch.trigger()
	}
	waitFor(t, func() bool { return e.Version() == want })
}

func drain(rec *events.FakeRecorder) []string {
	var out []string
	for {
		select {
		case e := <-rec.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

func cmpEmpty() cmp.Option {
	return cmp.FilterValues(func(a, b []string) bool { return len(a) == 0 && len(b) == 0 }, cmp.Ignore())
}

// prefixes compares want strings as prefixes of got strings.
func prefixes() cmp.Option {
	return cmp.Comparer(func(a, b string) bool { return strings.HasPrefix(a, b) || strings.HasPrefix(b, a) })
}

func waitFor(t testing.TB, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
