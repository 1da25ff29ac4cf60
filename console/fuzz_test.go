package console

import (
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
)

// FuzzBind: whatever a client sends as the body and the query, binding
// either fills the operation's input or says what is wrong; it never
// panics, and the inputs it accepts build a pod or a queue patch without
// panicking either.
func FuzzBind(f *testing.F) {
	f.Add(`{"namespace":"a","image":"busybox","gpuFraction":"0.25","queue":"q"}`, "since=3&topics=nodes")
	f.Add(`{"resources":{"gpu":{"quota":"4","limit":"-1","overQuotaWeight":2}},"resourceVersion":"7"}`, "range=1h")
	f.Add(`{"gpus":-1,"image":""}`, "since=-1")
	f.Add(`[]`, "phase=Waiting&namespace=x")
	f.Add(`{"unknown":1}`, "since=18446744073709551616")
	f.Fuzz(func(t *testing.T, body, query string) {
		r := httptest.NewRequest("POST", "/api/v1/workloads?"+url.PathEscape(query), strings.NewReader(body))
		r.URL.RawQuery = query
		r.Header.Set("Content-Type", "application/json")
		var sub SubmitInput
		if bind(r, &sub) == nil {
			_, _ = submitPod(sub)
		}
		r = httptest.NewRequest("PATCH", "/api/v1/queues/q", strings.NewReader(body))
		r.URL.RawQuery = query
		r.Header.Set("Content-Type", "application/json")
		var q queuePatchRequest
		if bind(r, &q) == nil {
			for name, res := range q.Resources {
				_, _ = res.resourceQuota(name)
			}
		}
		r = httptest.NewRequest("GET", "/api/v1/events", nil)
		r.URL.RawQuery = query
		var ev eventsRequest
		_ = bind(r, &ev)
		var u utilizationRequest
		if bind(r, &u) == nil && u.Range != "" {
			_, _ = parseRange(u.Range)
		}
	})
}

// FuzzVersionInStatus: any status annotation gives a version or nothing,
// and a Loaded status gives back the version it names.
func FuzzVersionInStatus(f *testing.F) {
	f.Add("Loaded: policy abc123")
	f.Add("Refused: x; policy old stays in force")
	f.Add("; policy  stays in force")
	f.Fuzz(func(t *testing.T, v string) {
		_ = versionInStatus(v)
		if v != "" && strings.TrimSpace(v) == v {
			if got := versionInStatus("Loaded: policy " + v); got != v {
				t.Errorf("Loaded: policy %q gives %q", v, got)
			}
		}
	})
}
