package webhook

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"gomodules.xyz/jsonpatch/v2"

	"github.com/partita-dev/partita/api/v1alpha1"
)

func TestCreatePatch(t *testing.T) {
	type obj struct {
		Name  string            `json:"name"`
		Big   int64             `json:"big"`
		Env   []string          `json:"env,omitempty"`
		Res   map[string]string `json:"res"`
		Known map[string]string `json:"known,omitempty"`
	}
	cases := map[string]struct {
		raw           string
		before, after obj
		want          []jsonpatch.Operation
	}{
		"unknown fields stay": {
			raw:    `{"name":"a","big":1000000,"res":{},"newField":{"x":1},"known":{"a":"1","future":"y"}}`,
			before: obj{Name: "a", Big: 1000000, Res: map[string]string{}, Known: map[string]string{"a": "1"}},
			after:  obj{Name: "b", Big: 1000000, Res: map[string]string{}, Known: map[string]string{"b": "2"}},
			want: []jsonpatch.Operation{
				{Operation: "add", Path: "/known/b", Value: "2"},
				{Operation: "remove", Path: "/known/a"},
				{Operation: "replace", Path: "/name", Value: "b"},
			},
		},
		"a parent the raw object leaves out is added whole": {
			raw:    `{"name":"a","big":1}`,
			before: obj{Name: "a", Big: 1},
			after:  obj{Name: "a", Big: 1, Res: map[string]string{"gpu": "1"}, Env: []string{"X"}},
			want: []jsonpatch.Operation{
				{Operation: "add", Path: "/env", Value: []any{"X"}},
				{Operation: "add", Path: "/res", Value: map[string]any{"gpu": "1"}},
			},
		},
		"arrays: removals from the end, then additions": {
			raw:    `{"name":"a","big":1,"res":{},"env":["A","B","C"]}`,
			before: obj{Name: "a", Big: 1, Res: map[string]string{}, Env: []string{"A", "B", "C"}},
			after:  obj{Name: "a", Big: 1, Res: map[string]string{}, Env: []string{"Z"}},
			want: []jsonpatch.Operation{
				{Operation: "remove", Path: "/env/2"},
				{Operation: "remove", Path: "/env/1"},
				{Operation: "replace", Path: "/env/0", Value: "Z"},
			},
		},
		"keys are escaped": {
			raw:    `{"name":"a","big":1,"res":{}}`,
			before: obj{Name: "a", Big: 1, Res: map[string]string{}},
			after:  obj{Name: "a", Big: 1, Res: map[string]string{"partita.dev/gpu~milli": "1"}},
			want:   []jsonpatch.Operation{{Operation: "add", Path: "/res/partita.dev~1gpu~0milli", Value: "1"}},
		},
		"no change, no patch": {
			raw:    `{"name":"a","big":1,"res":{}}`,
			before: obj{Name: "a", Big: 1, Res: map[string]string{}},
			after:  obj{Name: "a", Big: 1, Res: map[string]string{}},
			want:   []jsonpatch.Operation{},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := createPatch([]byte(tc.raw), tc.before, tc.after)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("createPatch() (-want,+got):\n%s", diff)
			}
			// The patch applies to raw and keeps what this build does not know.
			b, _ := json.Marshal(got)
			out := mustApply(t, []byte(tc.raw), b)
			var m map[string]any
			if err := json.Unmarshal(out, &m); err != nil {
				t.Fatal(err)
			}
			if _, ok := m["newField"]; strings.Contains(tc.raw, "newField") && !ok {
				t.Error("the patch removed a field this build does not know")
			}
		})
	}
}

// TestPodPatchMatchesGenericDiff: for every admitted pod of the golden
// cases, the webhook's field-aware patch and the general diff (createPatch)
// make the same object.
func TestPodPatchMatchesGenericDiff(t *testing.T) {
	h := newTestServer(t, testOptions{gate: true, modes: []v1alpha1.IsolationMode{v1alpha1.IsolationMPS}})
	entries, err := os.ReadDir(filepath.Join("testdata", "admission"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".yaml")
		if !ok || !strings.HasPrefix(name, "mutate-") {
			continue
		}
		t.Run(name, func(t *testing.T) {
			req := readCase(t, name)
			got := outcomeOf(t, post(t, h, PathMutatePods, req))
			if !got.Allowed {
				t.Fatalf("refused: %+v", got.Status)
			}
			patched := applyPatch(t, req.Object.Raw, got.Patch)
			generic, err := createPatch(req.Object.Raw, podOf(t, req.Object.Raw), podOf(t, patched))
			if err != nil {
				t.Fatal(err)
			}
			want, _ := decodeGeneric(applyPatch(t, req.Object.Raw, generic))
			have, _ := decodeGeneric(patched)
			if diff := cmp.Diff(want, have); diff != "" {
				t.Errorf("podPatch and createPatch disagree (-generic,+podPatch):\n%s", diff)
			}
		})
	}
}
