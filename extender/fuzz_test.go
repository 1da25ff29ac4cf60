package extender

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/go-logr/logr"

	pt "github.com/partita-dev/partita/internal/partitatest"

	extenderv1 "k8s.io/kube-scheduler/extender/v1"
)

// FuzzServer sends arbitrary bodies to every verb. The decoder is the
// server's front door for whatever reaches the port, so whatever comes in:
// no panic (the recovery middleware would answer 500), an answer of 200,
// 400 or 413 only, and a 200 whose body is the verb's result type.
//
// Input: verb selects the path (filter, prioritize, bind, preempt, modulo 4);
// body is the request body as sent.
func FuzzServer(f *testing.F) {
	pod := pt.FractionPod("p", "0.5", "500").Obj()
	seed := func(verb uint8, v any) {
		b, err := json.Marshal(v)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(verb, string(b))
	}
	seed(0, &extenderv1.ExtenderArgs{Pod: pod, NodeNames: names("n1", "n2")})
	seed(1, &extenderv1.ExtenderArgs{Pod: pod, NodeNames: names("n1")})
	seed(2, bindArgs("p", "n1"))
	seed(3, &extenderv1.ExtenderPreemptionArgs{Pod: pod, NodeNameToMetaVictims: map[string]*extenderv1.MetaVictims{"n1": metaVictimsOf("x")}})
	seed(0, &extenderv1.ExtenderArgs{Pod: pt.FractionPod("q", "7", "500").Obj(), NodeNames: names("n1")})
	for _, s := range []string{"", "{}", "null", "[]", `{"Pod":null}`, `{"Pod":{"spec":{"containers":[{}]}},"Nodes":{"items":[{}]}}`,
		`{"Pod":{"metadata":{"annotations":{"partita.dev/gpu-memory":"1e400"}}},"NodeNames":["n1"]}`, "\xff{", `{"Node":"n1","PodName":"p","PodNamespace":"ns","PodUID":"uid-ns-p"}`} {
		for v := range uint8(4) {
			f.Add(v, s)
		}
	}
	h := testServer{synced: true, leader: true}.handlerLogging(f, logr.Discard())
	conn := schedulerConn(f)
	paths := []string{"/filter", "/prioritize", "/bind", "/preempt"}
	f.Fuzz(func(t *testing.T, verb uint8, body string) {
		path := paths[int(verb)%len(paths)]
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
		req.TLS = conn
		h.ServeHTTP(rec, req)
		switch rec.Code {
		case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
			return
		case http.StatusOK:
		default:
			t.Fatalf("%s answered %d to %q: %s", path, rec.Code, body, rec.Body.String())
		}
		var out any
		switch path {
		case "/filter":
			out = &extenderv1.ExtenderFilterResult{}
		case "/prioritize":
			out = &extenderv1.HostPriorityList{}
		case "/bind":
			out = &extenderv1.ExtenderBindingResult{}
		default:
			out = &extenderv1.ExtenderPreemptionResult{}
		}
		if err := json.Unmarshal(rec.Body.Bytes(), out); err != nil {
			t.Fatalf("%s answered 200 with a body that is not its result: %v\n%s", path, err, rec.Body.String())
		}
	})
}
