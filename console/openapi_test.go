package console

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestOpenAPIDocumentsEveryRoute: the document the console serves lists
// exactly the operations its mux serves under /api/v1, with their
// parameters.
func TestOpenAPIDocumentsEveryRoute(t *testing.T) {
	s, err := New(Options{Mode: ModeShared}, Deps{})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	s.Handler(nil).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/api/v1/openapi.json", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /api/v1/openapi.json: %d %s", rec.Code, rec.Body)
	}
	var doc struct {
		OpenAPI string `json:"openapi"`
		Paths   map[string]map[string]struct {
			OperationID string `json:"operationId"`
			Parameters  []struct {
				Name string `json:"name"`
				In   string `json:"in"`
			} `json:"parameters"`
		} `json:"paths"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	var documented, served []string
	for path, ops := range doc.Paths {
		for method, op := range ops {
			documented = append(documented, strings.ToUpper(method)+" "+path)
			// Every {name} of the path is a documented path parameter.
			for _, seg := range strings.Split(path, "/") {
				if name, ok := strings.CutPrefix(seg, "{"); ok {
					name = strings.TrimSuffix(name, "}")
					found := false
					for _, p := range op.Parameters {
						found = found || p.Name == name && p.In == "path"
					}
					if !found {
						t.Errorf("%s %s (%s): path parameter %s is not documented", method, path, op.OperationID, name)
					}
				}
			}
		}
	}
	for _, r := range s.routes {
		served = append(served, r.method+" "+r.path)
	}
	sort.Strings(documented)
	sort.Strings(served)
	if diff := cmp.Diff(served, documented); diff != "" {
		t.Errorf("operations (-served,+documented):\n%s", diff)
	}
	if !strings.HasPrefix(doc.OpenAPI, "3.") {
		t.Errorf("openapi %q", doc.OpenAPI)
	}
}

func TestUnknownAPIPathIsJSON404(t *testing.T) {
	s, err := New(Options{Mode: ModeShared}, Deps{})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	s.Handler(nil).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/api/v1/nothing", nil))
	var e APIError
	if rec.Code != http.StatusNotFound || json.Unmarshal(rec.Body.Bytes(), &e) != nil || e.Error.Reason != "NotFound" {
		t.Errorf("GET /api/v1/nothing: %d %s", rec.Code, rec.Body)
	}
}

// TestOpenAPIDescribesQueueUsage: the queues' usage fields are in the
// document with their units, so that a client knows GPU-hours from GPUs.
func TestOpenAPIDescribesQueueUsage(t *testing.T) {
	s, err := New(Options{Mode: ModeShared}, Deps{})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	s.Handler(nil).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/api/v1/openapi.json", nil))
	var doc struct {
		Components struct {
			Schemas map[string]struct {
				Properties map[string]struct {
					Type        string `json:"type"`
					Description string `json:"description"`
				} `json:"properties"`
			} `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	cases := map[string]struct {
		schema, property, wantType, wantInDescription string
	}{
		"usage hours":              {"ConsoleQueueResource", "usageHours", "number", "GPU-hours"},
		"usage share":              {"ConsoleQueueResource", "usageShare", "number", "0 to 1"},
		"fair share without usage": {"ConsoleQueueResource", "fairShareWithoutUsage", "number", "history decided"},
		"usage window":             {"ConsoleQueueView", "usageWindow", "string", "half-life"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			p, ok := doc.Components.Schemas[tc.schema].Properties[tc.property]
			if !ok {
				t.Fatalf("%s.%s is not documented", tc.schema, tc.property)
			}
			if p.Type != tc.wantType || !strings.Contains(p.Description, tc.wantInDescription) {
				t.Errorf("%s.%s: type %q, description %q; want type %q, a description that says %q", tc.schema, tc.property, p.Type, p.Description, tc.wantType, tc.wantInDescription)
			}
		})
	}
}
