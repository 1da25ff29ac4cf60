package webhook

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/partita-dev/partita/gpu"
)

func TestRequireNRIPlugin(t *testing.T) {
	req := &gpu.PodRequest{Containers: []gpu.ContainerRequest{{Name: "main"}, {Name: "aux"}}}
	cases := map[string]struct {
		annotations map[string]string
		want        map[string]string
		wantErr     bool
	}{
		"every GPU container requires Partita's plugin": {
			annotations: map[string]string{"keep": "me"},
			want: map[string]string{"keep": "me",
				"required-plugins.noderesource.dev/container.main": `["partita"]`,
				"required-plugins.noderesource.dev/container.aux":  `["partita"]`},
		},
		"plugins the pod names itself are kept": {
			annotations: map[string]string{"required-plugins.noderesource.dev/container.main": "[balloons]"},
			want: map[string]string{
				"required-plugins.noderesource.dev/container.main": `["balloons","partita"]`,
				"required-plugins.noderesource.dev/container.aux":  `["partita"]`},
		},
		"named once": {
			annotations: map[string]string{"required-plugins.noderesource.dev/container.main": `["partita"]`},
			want: map[string]string{
				"required-plugins.noderesource.dev/container.main": `["partita"]`,
				"required-plugins.noderesource.dev/container.aux":  `["partita"]`},
		},
		"not a list is refused": {
			annotations: map[string]string{"required-plugins.noderesource.dev/container.main": "{a: b}"},
			wantErr:     true,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: tc.annotations}}
			err := requireNRIPlugin(pod, req)
			if (err != nil) != tc.wantErr {
				t.Fatalf("requireNRIPlugin() error = %v, want error %v", err, tc.wantErr)
			}
			if tc.wantErr {
				return
			}
			if diff := cmp.Diff(tc.want, pod.Annotations); diff != "" {
				t.Errorf("annotations (-want +got):\n%s", diff)
			}
		})
	}
}

func TestChangedNRIRequirements(t *testing.T) {
	const key = "required-plugins.noderesource.dev/container.main"
	old := map[string]string{key: `["partita"]`}
	cases := map[string]struct {
		updated map[string]string
		want    int
	}{
		"unchanged":                      {updated: map[string]string{key: `["partita"]`, "other": "x"}},
		"removed":                        {updated: map[string]string{}, want: 1},
		"changed":                        {updated: map[string]string{key: `[]`}, want: 1},
		"another container's is free":    {updated: map[string]string{key: `["partita"]`, "required-plugins.noderesource.dev/container.web": "[x]"}},
		"the pod-scoped key is not ours": {updated: map[string]string{key: `["partita"]`, "required-plugins.noderesource.dev/pod": "[x]"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := changedNRIRequirements(old, tc.updated, []string{"main"}); len(got) != tc.want {
				t.Errorf("changedNRIRequirements() = %v, want %d errors", got, tc.want)
			}
		})
	}
}

// FuzzRequireNRIPlugin: whatever a pod writes in its required-plugins
// annotation, the webhook refuses it clearly or leaves Partita's plugin
// named, once, in a list the runtime reads back.
func FuzzRequireNRIPlugin(f *testing.F) {
	for _, s := range []string{`["partita"]`, "[a, b]", "", "{a: b}", "- x\n- partita", "[partita, partita]", "&a [*a]"} {
		f.Add(s)
	}
	req := &gpu.PodRequest{Containers: []gpu.ContainerRequest{{Name: "main"}}}
	f.Fuzz(func(t *testing.T, v string) {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{nriRequiredPrefix + "main": v}}}
		if err := requireNRIPlugin(pod, req); err != nil {
			return
		}
		var got []string
		if err := yaml.Unmarshal([]byte(pod.Annotations[nriRequiredPrefix+"main"]), &got); err != nil {
			t.Fatalf("the webhook wrote %q, which does not read back: %v", pod.Annotations[nriRequiredPrefix+"main"], err)
		}
		if n := countOf(got, NRIPluginName); n < 1 {
			t.Fatalf("the webhook wrote %q for %q: Partita's plugin missing", got, v)
		}
	})
}

func countOf(list []string, s string) int {
	n := 0
	for _, x := range list {
		if x == s {
			n++
		}
	}
	return n
}
