package webhook

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestScopeSecretReads(t *testing.T) {
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Method+" "+r.URL.Path+"?"+r.URL.RawQuery)
	}))
	defer srv.Close()
	client := &http.Client{Transport: ScopeSecretReads("partita-system", "partita-webhook-cert")(http.DefaultTransport)}
	cases := map[string]struct{ method, path, want string }{
		"list":                   {http.MethodGet, "/api/v1/namespaces/partita-system/secrets?limit=500", "GET /api/v1/namespaces/partita-system/secrets?fieldSelector=metadata.name%3Dpartita-webhook-cert&limit=500"},
		"watch":                  {http.MethodGet, "/api/v1/namespaces/partita-system/secrets?watch=true", "GET /api/v1/namespaces/partita-system/secrets?fieldSelector=metadata.name%3Dpartita-webhook-cert&watch=true"},
		"get by name untouched":  {http.MethodGet, "/api/v1/namespaces/partita-system/secrets/partita-webhook-cert", "GET /api/v1/namespaces/partita-system/secrets/partita-webhook-cert?"},
		"other namespace":        {http.MethodGet, "/api/v1/namespaces/other/secrets", "GET /api/v1/namespaces/other/secrets?"},
		"configmaps untouched":   {http.MethodGet, "/api/v1/namespaces/partita-system/configmaps", "GET /api/v1/namespaces/partita-system/configmaps?"},
		"update untouched (PUT)": {http.MethodPut, "/api/v1/namespaces/partita-system/secrets", "PUT /api/v1/namespaces/partita-system/secrets?"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got = nil
			req, err := http.NewRequestWithContext(t.Context(), tc.method, srv.URL+tc.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_ = resp.Body.Close()
			if len(got) != 1 || got[0] != tc.want {
				t.Errorf("server saw %q, want %q", got, tc.want)
			}
		})
	}
}
