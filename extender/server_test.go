package extender

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	corev1 "k8s.io/api/core/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/partita-dev/partita/api/v1alpha1"
	pt "github.com/partita-dev/partita/internal/partitatest"
)

func TestMain(m *testing.M) {
	gin.SetMode(gin.TestMode)
	os.Exit(m.Run())
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// testServer is a server over a ledger of one node n1 with two GPUs and one
// pending 0.5 pod p.
type testServer struct {
	synced, leader, profiling, debug bool
	maxBytes                         int64
}

func (ts testServer) handler(t *testing.T) http.Handler {
	t.Helper()
	return ts.handlerLogging(t, testr.New(t))
}

func (ts testServer) handlerLogging(t testing.TB, log logr.Logger) http.Handler {
	t.Helper()
	pod := pt.FractionPod("p", "0.5", "500").Obj()
	c := fakeClient(pod, pt.MakePod("plain", "ns").Obj())
	l := pt.Ledger([]*v1alpha1.GPUNode{pt.H100Node("n1", 2).Obj()})
	reg := prometheus.NewRegistry()
	isLeader := func() bool { return ts.leader }
	e := New(l, c, &fakeBinder{c: c},
		WithSynced(func() bool { return ts.synced }), WithLeader(isLeader), WithMetrics(NewMetrics(reg, l, isLeader)))
	opts := []ServerOption{WithMetricsHandler(promhttp.HandlerFor(reg, promhttp.HandlerOpts{})),
		WithReady(func() error {
			if !ts.synced {
				return ErrNotSynced
			}
			return nil
		})}
	if ts.maxBytes > 0 {
		opts = append(opts, WithMaxRequestBytes(ts.maxBytes))
	}
	if ts.profiling {
		opts = append(opts, WithProfiling(true))
	}
	if ts.debug {
		opts = append(opts, WithDebugEndpoints(true))
	}
	return NewServer(log, e, opts...).Handler()
}

func TestServer(t *testing.T) {
	pod := pt.FractionPod("p", "0.5", "500").Obj()
	filterBody := mustJSON(t, &extenderv1.ExtenderArgs{Pod: pod, NodeNames: names("n1")})
	bindBody := mustJSON(t, bindArgs("p", "n1"))
	preemptBody := mustJSON(t, &extenderv1.ExtenderPreemptionArgs{Pod: pod, NodeNameToMetaVictims: map[string]*extenderv1.MetaVictims{}})
	ready := testServer{synced: true, leader: true}
	cases := map[string]struct {
		server testServer
		method string
		path   string
		body   string
		// anonymous sends the request without kube-scheduler's client
		// certificate.
		anonymous  bool
		wantStatus int
		// wantBody is a substring of the body, or (wantJSON) the JSON value.
		wantBody string
		wantJSON any
	}{
		"filter":                     {server: ready, path: "/filter", body: filterBody, wantStatus: 200, wantJSON: &extenderv1.ExtenderFilterResult{NodeNames: names("n1"), FailedNodes: extenderv1.FailedNodesMap{}, FailedAndUnresolvableNodes: extenderv1.FailedNodesMap{}}},
		"filter, lowercase keys":     {server: ready, path: "/filter", body: `{"pod":{"metadata":{"name":"x"}},"nodenames":["n1"]}`, wantStatus: 200, wantBody: `"NodeNames":["n1"]`},
		"filter, empty body":         {server: ready, path: "/filter", wantStatus: 400, wantBody: "read filter request: empty body"},
		"filter, not JSON":           {server: ready, path: "/filter", body: "garbage", wantStatus: 400, wantBody: "body is not a JSON object"},
		"filter, a JSON array":       {server: ready, path: "/filter", body: "[1,2]", wantStatus: 400, wantBody: "body is not a JSON object"},
		"filter, null":               {server: ready, path: "/filter", body: "null", wantStatus: 400, wantBody: "body is not a JSON object"},
		"filter, cut short":          {server: ready, path: "/filter", body: filterBody[:40], wantStatus: 400, wantBody: "decode JSON: unexpected end of JSON input"},
		"filter, trailing data":      {server: ready, path: "/filter", body: filterBody + "{}", wantStatus: 400, wantBody: "decode JSON"},
		"filter, pod of wrong type":  {server: ready, path: "/filter", body: `{"Pod": 5, "NodeNames": []}`, wantStatus: 400, wantBody: "decode JSON: json: cannot unmarshal number"},
		"filter, no pod":             {server: ready, path: "/filter", body: `{"NodeNames": ["n1"]}`, wantStatus: 400, wantBody: "read filter request: no pod"},
		"filter, no nodes":           {server: ready, path: "/filter", body: mustJSON(t, &extenderv1.ExtenderArgs{Pod: pod}), wantStatus: 400, wantBody: "no candidate nodes"},
		"filter, too large":          {server: testServer{synced: true, leader: true, maxBytes: 64}, path: "/filter", body: filterBody, wantStatus: 413, wantBody: "over the limit of 64 bytes"},
		"filter, ledger not synced":  {server: testServer{leader: true}, path: "/filter", body: filterBody, wantStatus: 200, wantJSON: &extenderv1.ExtenderFilterResult{Error: ErrNotSynced.Error()}},
		"filter, GET":                {server: ready, method: "GET", path: "/filter", wantStatus: 404},
		"prioritize":                 {server: ready, path: "/prioritize", body: filterBody, wantStatus: 200, wantJSON: extenderv1.HostPriorityList{{Host: "n1", Score: 4}}},
		"prioritize, not JSON":       {server: ready, path: "/prioritize", body: "\x00\xff", wantStatus: 400, wantBody: "read prioritize request"},
		"prioritize, no pod":         {server: ready, path: "/prioritize", body: `{}`, wantStatus: 400, wantBody: "read prioritize request: no pod"},
		"prioritize, not synced":     {server: testServer{leader: true}, path: "/prioritize", body: filterBody, wantStatus: 503, wantBody: ErrNotSynced.Error()},
		"bind":                       {server: ready, path: "/bind", body: bindBody, wantStatus: 200, wantJSON: &extenderv1.ExtenderBindingResult{}},
		"bind, not the leader":       {server: testServer{synced: true}, path: "/bind", body: bindBody, wantStatus: 200, wantJSON: &extenderv1.ExtenderBindingResult{Error: ErrNotLeader.Error()}},
		"bind, unknown pod":          {server: ready, path: "/bind", body: mustJSON(t, bindArgs("ghost", "n1")), wantStatus: 200, wantBody: `"Error":"bind pod ns/ghost: pods \"ghost\" not found"`},
		"bind, no node":              {server: ready, path: "/bind", body: `{"PodName":"p","PodNamespace":"ns"}`, wantStatus: 400, wantBody: "read bind request: Node is required"},
		"bind, UID of wrong type":    {server: ready, path: "/bind", body: `{"PodName":"p","PodNamespace":"ns","PodUID":7,"Node":"n1"}`, wantStatus: 400, wantBody: "decode JSON"},
		"bind, empty":                {server: ready, path: "/bind", body: " \n", wantStatus: 400, wantBody: "read bind request: empty body"},
		"preempt":                    {server: ready, path: "/preempt", body: preemptBody, wantStatus: 200, wantJSON: &extenderv1.ExtenderPreemptionResult{NodeNameToMetaVictims: map[string]*extenderv1.MetaVictims{}}},
		"preempt, no pod":            {server: ready, path: "/preempt", body: `{"NodeNameToMetaVictims":{}}`, wantStatus: 400, wantBody: "read preempt request: no pod"},
		"preempt, victims not a map": {server: ready, path: "/preempt", body: `{"Pod":{},"NodeNameToMetaVictims":[]}`, wantStatus: 400, wantBody: "decode JSON"},
		"healthz":                    {server: testServer{}, method: "GET", path: "/healthz", wantStatus: 200, wantBody: "ok"},
		"readyz":                     {server: ready, method: "GET", path: "/readyz", wantStatus: 200, wantBody: "ok"},
		"readyz, not synced":         {server: testServer{}, method: "GET", path: "/readyz", wantStatus: 503, wantBody: "not ready: the GPU ledger has not synced"},
		"metrics":                    {server: ready, method: "GET", path: "/metrics", wantStatus: 200, wantBody: `partita_gpu_node_capacity_milli{node="n1"} 2000`},
		"profiler off":               {server: ready, method: "GET", path: "/debug/pprof/", wantStatus: 404},
		"profiler on":                {server: testServer{profiling: true}, method: "GET", path: "/debug/pprof/", wantStatus: 200, wantBody: "goroutine"},
		"debug ledger off":           {server: ready, method: "GET", path: "/debug/ledger", wantStatus: 404},
		"debug ledger":               {server: testServer{synced: true, leader: true, debug: true}, method: "GET", path: "/debug/ledger", wantStatus: 200, wantJSON: &ledgerReport{Nodes: 1, Violations: []string{}, Stranded: []string{}}},
		"bind, a pod without GPUs":   {server: ready, path: "/bind", body: mustJSON(t, bindArgs("plain", "n1")), wantStatus: 200, wantBody: `"Error":"refuse to bind pod ns/plain to node n1: it requests no partita.dev/gpu-milli`},

		// Without kube-scheduler's certificate only the probes and the
		// metrics answer.
		"anonymous filter":       {server: ready, anonymous: true, path: "/filter", body: filterBody, wantStatus: 401, wantBody: "only kube-scheduler may call the extender"},
		"anonymous prioritize":   {server: ready, anonymous: true, path: "/prioritize", body: filterBody, wantStatus: 401, wantBody: "only kube-scheduler may call the extender"},
		"anonymous bind":         {server: ready, anonymous: true, path: "/bind", body: bindBody, wantStatus: 401, wantBody: "only kube-scheduler may call the extender"},
		"anonymous preempt":      {server: ready, anonymous: true, path: "/preempt", body: preemptBody, wantStatus: 401, wantBody: "only kube-scheduler may call the extender"},
		"anonymous debug ledger": {server: testServer{synced: true, leader: true, debug: true}, anonymous: true, method: "GET", path: "/debug/ledger", wantStatus: 401},
		"anonymous profiler":     {server: testServer{profiling: true}, anonymous: true, method: "GET", path: "/debug/pprof/", wantStatus: 401},
		"anonymous healthz":      {server: ready, anonymous: true, method: "GET", path: "/healthz", wantStatus: 200, wantBody: "ok"},
		"anonymous readyz":       {server: ready, anonymous: true, method: "GET", path: "/readyz", wantStatus: 200, wantBody: "ok"},
		"anonymous metrics":      {server: ready, anonymous: true, method: "GET", path: "/metrics", wantStatus: 200, wantBody: `partita_extender_unauthenticated_requests_total{reason="Unauthenticated"} 0`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			method := tc.method
			if method == "" {
				method = http.MethodPost
			}
			req := httptest.NewRequestWithContext(pt.Context(t), method, tc.path, strings.NewReader(tc.body))
			req.Header.Set("Content-Type", "application/json")
			if !tc.anonymous {
				req.TLS = schedulerConn(t)
			}
			rec := httptest.NewRecorder()
			tc.server.handler(t).ServeHTTP(rec, req)
			body := rec.Body.String()
			if rec.Code != tc.wantStatus {
				t.Fatalf("status %d, want %d; body:\n%s", rec.Code, tc.wantStatus, body)
			}
			if !strings.Contains(body, tc.wantBody) {
				t.Errorf("body does not contain %q:\n%s", tc.wantBody, body)
			}
			if tc.wantJSON != nil {
				got := newLike(tc.wantJSON)
				if err := json.Unmarshal(rec.Body.Bytes(), got); err != nil {
					t.Fatalf("decode answer: %v\n%s", err, body)
				}
				if diff := cmp.Diff(tc.wantJSON, deref(got)); diff != "" {
					t.Errorf("answer (-want,+got):\n%s", diff)
				}
			}
		})
	}
}

// newLike returns a pointer to a new zero value of v's type (of *v's type
// when v is a pointer).
func newLike(v any) any {
	switch v.(type) {
	case *extenderv1.ExtenderFilterResult:
		return &extenderv1.ExtenderFilterResult{}
	case extenderv1.HostPriorityList:
		return &extenderv1.HostPriorityList{}
	case *extenderv1.ExtenderBindingResult:
		return &extenderv1.ExtenderBindingResult{}
	case *extenderv1.ExtenderPreemptionResult:
		return &extenderv1.ExtenderPreemptionResult{}
	case *ledgerReport:
		return &ledgerReport{}
	}
	panic("newLike: unknown type")
}

func deref(v any) any {
	if l, ok := v.(*extenderv1.HostPriorityList); ok {
		return *l
	}
	return v
}

// TestNotLeaderClosesTheConnection: a follower's answer to bind closes the
// connection, so that kube-scheduler's retry dials again and may reach the
// leader; the leader keeps it open.
func TestNotLeaderClosesTheConnection(t *testing.T) {
	body := mustJSON(t, bindArgs("p", "n1"))
	for _, leader := range []bool{false, true} {
		req := httptest.NewRequestWithContext(pt.Context(t), http.MethodPost, "/bind", strings.NewReader(body))
		req.TLS = schedulerConn(t)
		rec := httptest.NewRecorder()
		testServer{synced: true, leader: leader}.handler(t).ServeHTTP(rec, req)
		if got, want := rec.Header().Get("Connection") == "close", !leader; got != want {
			t.Errorf("leader %t: Connection: close %t, want %t; body:\n%s", leader, got, want, rec.Body)
		}
	}
}

// TestServerBindsOnce checks through HTTP that a bind writes the Binding
// once and that a retry of it succeeds without writing again.
func TestServerBindsOnce(t *testing.T) {
	pod := pt.FractionPod("p", "0.5", "500").Obj()
	c := fakeClient(pod)
	l := pt.Ledger([]*v1alpha1.GPUNode{pt.H100Node("n1", 2).Obj()})
	binder := &fakeBinder{c: c}
	h := NewServer(testr.New(t), New(l, c, binder)).Handler()
	body := mustJSON(t, bindArgs("p", "n1"))
	for i := range 2 {
		rec := httptest.NewRecorder()
		req := httptest.NewRequestWithContext(pt.Context(t), http.MethodPost, "/bind", strings.NewReader(body))
		req.TLS = schedulerConn(t)
		h.ServeHTTP(rec, req)
		if rec.Code != 200 || strings.TrimSpace(rec.Body.String()) != `{"Error":""}` {
			t.Fatalf("bind %d: %d %s", i+1, rec.Code, rec.Body.String())
		}
		if i == 0 {
			// The informer shows the bound pod.
			got := &corev1.Pod{}
			if err := c.Get(t.Context(), clientKey("ns", "p"), got); err != nil {
				t.Fatal(err)
			}
			l.UpsertPod(got)
		}
	}
	if n := binder.count(); n != 1 {
		t.Errorf("%d Bindings written, want 1", n)
	}
}
