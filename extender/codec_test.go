package extender

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	pt "github.com/partita-dev/partita/internal/partitatest"
)

// checkDecodeAgrees fails when the fast decoder gives something other than
// encoding/json, and returns whether the fast path took the body.
func checkDecodeAgrees(t *testing.T, body []byte) bool {
	t.Helper()
	fast, ok := fastExtenderArgs(body)
	if !ok {
		return false
	}
	var want extenderv1.ExtenderArgs
	if err := json.Unmarshal(body, &want); err != nil {
		t.Fatalf("the fast decoder took %q, which encoding/json refuses: %v", body, err)
	}
	if diff := cmp.Diff(&want, fast); diff != "" {
		t.Fatalf("decoding %q (-encoding/json,+fast):\n%s", body, diff)
	}
	return true
}

// checkEncodeAgrees fails when the fast encoders write other bytes than
// json.Marshal.
func checkEncodeAgrees(t *testing.T, names []string, msg string) {
	t.Helper()
	failed := extenderv1.FailedNodesMap{}
	list := extenderv1.HostPriorityList{}
	for i, n := range names {
		failed[n] = msg
		list = append(list, extenderv1.HostPriorityList{{Host: n, Score: int64(i % 11)}}...)
	}
	results := []*extenderv1.ExtenderFilterResult{
		{NodeNames: &names, FailedNodes: failed, FailedAndUnresolvableNodes: extenderv1.FailedNodesMap{}, Error: msg},
		{},
	}
	for _, r := range results {
		got, ok := encodeFilterResult(r)
		want, err := json.Marshal(r)
		if !ok || err != nil || string(got) != string(want) {
			t.Fatalf("filter result:\nfast          %s\nencoding/json %s", got, want)
		}
	}
	for _, l := range []extenderv1.HostPriorityList{list, nil} {
		got := encodeHostPriorityList(l)
		want, _ := json.Marshal(l)
		if string(got) != string(want) {
			t.Fatalf("priorities:\nfast          %s\nencoding/json %s", got, want)
		}
	}
}

func TestDecodeExtenderArgs(t *testing.T) {
	pod := pt.FractionPod("p", "0.5", "500").Obj()
	kubeScheduler, err := json.Marshal(&extenderv1.ExtenderArgs{Pod: pod, NodeNames: names("gpu-node-0", "gpu-node-1")})
	if err != nil {
		t.Fatal(err)
	}
	withNodes, err := json.Marshal(&extenderv1.ExtenderArgs{Pod: pod, Nodes: &corev1.NodeList{Items: []corev1.Node{{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}}}})
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string]struct {
		body     string
		wantFast bool
	}{
		"as kube-scheduler sends it":     {body: string(kubeScheduler), wantFast: true},
		"whole nodes":                    {body: string(withNodes), wantFast: true},
		"lower-case keys and spaces":     {body: " {\n\"pod\" : {\"metadata\":{\"name\":\"x\"}} ,\t\"nodenames\":[ \"a\" , \"b\" ] }\r\n", wantFast: true},
		"nulls":                          {body: `{"Pod":null,"Nodes":null,"NodeNames":null}`, wantFast: true},
		"no names":                       {body: `{"NodeNames":[]}`, wantFast: true},
		"empty object":                   {body: `{}`, wantFast: true},
		"unknown fields":                 {body: `{"x":[1,{"y":"}"}],"z":-1.5e3,"w":"\"","NodeNames":["a"]}`, wantFast: true},
		"escapes in a name":              {body: `{"NodeNames":["a\u0062"]}`},
		"non-ASCII name":                 {body: `{"NodeNames":["nœud"]}`},
		"a duplicate key":                {body: `{"NodeNames":["a"],"nodeNames":["b"]}`},
		"a null name":                    {body: `{"NodeNames":["a",null]}`},
		"names not an array":             {body: `{"NodeNames":"a"}`},
		"trailing data":                  {body: `{"NodeNames":["a"]} {}`},
		"trailing comma":                 {body: `{"NodeNames":["a"],}`},
		"a broken unknown field":         {body: `{"x":tru,"NodeNames":["a"]}`},
		"a pod of the wrong type":        {body: `{"Pod":5}`},
		"not an object":                  {body: `["a"]`},
		"cut short":                      {body: `{"NodeNames":["a"`},
		"a string with an escaped quote": {body: `{"Pod":{"metadata":{"name":"a\"b"}},"NodeNames":["a"]}`, wantFast: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := checkDecodeAgrees(t, []byte(tc.body)); got != tc.wantFast {
				t.Errorf("fast path taken: %v, want %v", got, tc.wantFast)
			}
			// Whatever path, decodeExtenderArgs answers as encoding/json.
			got, err := decodeExtenderArgs(VerbFilter, []byte(tc.body))
			want, wantErr := decodeArgs[extenderv1.ExtenderArgs](VerbFilter, []byte(tc.body))
			if (err == nil) != (wantErr == nil) {
				t.Fatalf("error %v, encoding/json's %v", err, wantErr)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("(-encoding/json,+decodeExtenderArgs):\n%s", diff)
			}
		})
	}
}

func TestEncodeResults(t *testing.T) {
	cases := map[string]struct {
		names []string
		msg   string
	}{
		"node names":             {names: []string{"gpu-node-1", "gpu-node-0", "a.b-c"}, msg: "largest free slice 0.4 on GPU 0; pod needs 0.6 (container main)"},
		"none":                   {msg: ""},
		"characters to escape":   {names: []string{"a\"b", `c\d`, "e<f>&", "tab\there"}, msg: "line\nbreak"},
		"non-ASCII and invalid":  {names: []string{"nœud", "\xff"}, msg: "\u2028"},
		"a reason with the node": {names: []string{"n1"}, msg: `the pod's GPUs are reserved on node "n2"`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) { checkEncodeAgrees(t, tc.names, tc.msg) })
	}
	if _, ok := encodeFilterResult(&extenderv1.ExtenderFilterResult{Nodes: &corev1.NodeList{}}); ok {
		t.Error("a result with whole nodes took the fast path")
	}
}

// FuzzExtenderArgsCodec checks that the hand-written decoder and encoders
// agree with encoding/json on whatever they take. Input: body is a filter
// request body; the names it decodes to (if any) are encoded back.
func FuzzExtenderArgsCodec(f *testing.F) {
	for _, s := range []string{`{"Pod":{"metadata":{"name":"p"}},"NodeNames":["a","b"]}`, `{"nodenames":[]}`, `{"NodeNames":["a\"b"]}`,
		`{"x":{"y":[1,2,"]"]},"NodeNames":["<a>"]}`, `{"Nodes":{"items":[{"metadata":{"name":"n"}}]}}`, ` {} `, `{"NodeNames":null}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		checkDecodeAgrees(t, body)
		var args extenderv1.ExtenderArgs
		if json.Unmarshal(body, &args) == nil && args.NodeNames != nil {
			msg := ""
			if len(*args.NodeNames) > 0 {
				msg = (*args.NodeNames)[0]
			}
			checkEncodeAgrees(t, *args.NodeNames, msg)
		}
	})
}
