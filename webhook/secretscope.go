package webhook

import (
	"net/http"
	"net/url"
)

// ScopeSecretReads returns a rest.Config transport wrapper that adds the
// field selector metadata.name=<name> to every list and watch of Secrets in
// namespace. cert-controller caches the Secrets of the whole namespace,
// which would need RBAC to list and watch all of them (the namespace also
// holds Helm's release Secrets); with the selector the API server
// authorizes the request against resourceNames, so the webhook's Role can
// name its own certificate Secret and nothing else.
func ScopeSecretReads(namespace, name string) func(http.RoundTripper) http.RoundTripper {
	path := "/api/v1/namespaces/" + url.PathEscape(namespace) + "/secrets"
	return func(rt http.RoundTripper) http.RoundTripper {
		return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
			if req.Method != http.MethodGet || req.URL.Path != path {
				return rt.RoundTrip(req)
			}
			q := req.URL.Query()
			q.Set("fieldSelector", "metadata.name="+name)
			req = req.Clone(req.Context())
			req.URL.RawQuery = q.Encode()
			return rt.RoundTrip(req)
		})
	}
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
