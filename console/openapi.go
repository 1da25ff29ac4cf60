package console

import (
	"encoding/json"
	"fmt"
	"net/http"

	openapi "github.com/swaggest/openapi-go"
	"github.com/swaggest/openapi-go/openapi3"
)

// openAPIDocument reflects the routes' request and response types into an
// OpenAPI 3 document: the one the console serves at /api/v1/openapi.json.
func openAPIDocument(routes []route) ([]byte, error) {
	r := openapi3.Reflector{}
	r.Spec = &openapi3.Spec{Openapi: "3.0.3"}
	r.Spec.Info.
		WithTitle("Partita console API").
		WithVersion("v1").
		WithDescription("The JSON API of the Partita console, which its pages use. Every call is made as the caller: " +
			"in local mode (`partita console`) with the token the console printed (Authorization: Bearer <token>); " +
			"in shared mode (the chart) with a Kubernetes bearer token or through the configured authenticating proxy. " +
			"GPU amounts named ...Milli are in milli-GPUs (1000 = one GPU); the queues' amounts are in GPUs, cores and bytes, " +
			"and their usage (usageHours, only while the admission loop weighs past usage in fair share) in GPU-hours, core-hours and byte-hours. " +
			"Errors are {\"error\": {code, reason, message}}; refusals by the API server keep its status and message.")
	bearer := "bearerAuth"
	r.Spec.ComponentsEns().SecuritySchemesEns().WithMapOfSecuritySchemeOrRefValuesItem(bearer, openapi3.SecuritySchemeOrRef{
		SecurityScheme: &openapi3.SecurityScheme{HTTPSecurityScheme: (&openapi3.HTTPSecurityScheme{}).WithScheme("bearer")},
	})
	for _, rt := range routes {
		oc, err := r.NewOperationContext(rt.method, rt.path)
		if err != nil {
			return nil, fmt.Errorf("openapi: %s %s: %w", rt.method, rt.path, err)
		}
		oc.SetID(rt.id)
		oc.SetSummary(rt.summary)
		oc.SetDescription(rt.description)
		oc.SetTags(rt.tag)
		if rt.id != "openapi" {
			oc.AddSecurity(bearer)
		}
		if rt.in != nil {
			oc.AddReqStructure(rt.in)
		}
		if rt.stream {
			oc.AddRespStructure(nil, func(cu *openapi.ContentUnit) {
				cu.HTTPStatus = http.StatusOK
				cu.ContentType = "text/event-stream"
				cu.Description = "Server-Sent Events: hello, nodes, queues, workloads, resync"
			})
		} else {
			status := rt.status
			if status == 0 {
				status = http.StatusOK
			}
			oc.AddRespStructure(rt.out, func(cu *openapi.ContentUnit) { cu.HTTPStatus = status })
		}
		for _, code := range []int{http.StatusBadRequest, http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound} {
			oc.AddRespStructure(new(APIError), func(cu *openapi.ContentUnit) { cu.HTTPStatus = code })
		}
		if err := r.AddOperation(oc); err != nil {
			return nil, fmt.Errorf("openapi: %s %s: %w", rt.method, rt.path, err)
		}
	}
	return json.MarshalIndent(r.Spec, "", "  ")
}
