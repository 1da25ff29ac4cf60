package console

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// promStandIn answers the two Prometheus HTTP API calls the console makes
// with canned series: Prometheus itself cannot run on the test machine,
// and what is tested here is the console's reading of the API's answers
// (alignment on the time grid, the share, the queues kept), not
// Prometheus.
func promStandIn(t *testing.T, start int64) *httptest.Server {
	t.Helper()
	matrix := func(series ...string) string {
		return `{"status":"success","data":{"resultType":"matrix","result":[` + strings.Join(series, ",") + `]}}`
	}
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := r.ParseForm(); err != nil {
			t.Error(err)
		}
		q := r.Form.Get("query")
		w.Header().Set("Content-Type", "application/json")
		pt := func(i int, v string) string { return fmt.Sprintf(`[%d,"%s"]`, start+int64(i)*60, v) }
		switch {
		case r.URL.Path == "/api/v1/query" && q == queryDenials:
			fmt.Fprint(w, `{"status":"success","data":{"resultType":"vector","result":[{"metric":{"reason":"Policy"},"value":[1,"3.0000001"]},{"metric":{"reason":"SystemKey"},"value":[1,"1"]}]}}`)
		case q == queryAllocated:
			fmt.Fprint(w, matrix(`{"metric":{},"values":[`+pt(0, "2")+","+pt(2, "6")+`]}`))
		case q == queryCapacity:
			fmt.Fprint(w, matrix(`{"metric":{},"values":[`+pt(0, "8")+","+pt(1, "8")+","+pt(2, "8")+`]}`))
		case q == queryQueues:
			fmt.Fprint(w, matrix(`{"metric":{"queue":"team-a"},"values":[`+pt(1, "4")+`]}`, `{"metric":{"queue":"secret"},"values":[`+pt(1, "1")+`]}`))
		default:
			t.Errorf("unexpected query %s %q", r.URL.Path, q)
			http.Error(w, "no", http.StatusBadRequest)
		}
	}))
}

func TestPrometheusUtilizationAndDenials(t *testing.T) {
	start := time.Unix(6000, 0)
	srv := promStandIn(t, start.Unix())
	defer srv.Close()
	p, err := NewPrometheus(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	u, err := p.Utilization(t.Context(), start, start.Add(2*time.Minute), time.Minute, func(q string) bool { return q != "secret" })
	if err != nil {
		t.Fatal(err)
	}
	f := func(v float64) *float64 { return &v }
	b, _ := json.Marshal(u)
	if diff := cmp.Diff([]int64{6000, 6060, 6120}, u.Times); diff != "" {
		t.Errorf("times (-want,+got):\n%s\n%s", diff, b)
	}
	if diff := cmp.Diff([]*float64{f(0.25), nil, f(0.75)}, u.Share); diff != "" {
		t.Errorf("share (-want,+got):\n%s", diff)
	}
	if len(u.Queues) != 1 || u.Queues[0].Queue != "team-a" || u.Queues[0].GPUs[0] != nil || *u.Queues[0].GPUs[1] != 4 {
		t.Errorf("queues %s", b)
	}
	d, err := p.Denials(t.Context(), start)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]DenialCount{{Reason: "Policy", Count: 3}, {Reason: "SystemKey", Count: 1}}, d); diff != "" {
		t.Errorf("denials (-want,+got):\n%s", diff)
	}
}
