package console

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"
)

// ErrUnauthenticated says a request carries no identity the console
// accepts.
var ErrUnauthenticated = errors.New("unauthenticated")

// Authenticator says who made a request. It returns ErrUnauthenticated
// (wrapped, with what to do) when the request proves no identity.
type Authenticator interface {
	Authenticate(r *http.Request) (UserInfo, error)
}

// bearer is the request's bearer token, "" when it has none.
func bearer(r *http.Request) string {
	h := r.Header.Get("Authorization")
	if t, ok := strings.CutPrefix(h, "Bearer "); ok {
		return strings.TrimSpace(t)
	}
	return ""
}

// LocalAuth accepts the random token `partita console` printed in its URL:
// the console serves one person, on loopback, and must keep out the other
// users of the machine and any web page the person's browser opens. The
// page keeps the token in its origin's localStorage and sends it as a
// bearer token; no cookie carries it, because the browser would send a
// cookie for 127.0.0.1 to every port, another local user's server
// included.
type LocalAuth struct {
	token []byte
	user  UserInfo
}

// NewLocalAuth accepts token and says every request is user's.
func NewLocalAuth(token string, user UserInfo) *LocalAuth {
	return &LocalAuth{token: []byte(token), user: user}
}

// Authenticate implements Authenticator.
func (a *LocalAuth) Authenticate(r *http.Request) (UserInfo, error) {
	t := bearer(r)
	if t == "" {
		return UserInfo{}, fmt.Errorf("%w: no token; open the URL 'partita console' printed (it carries the token), or send it as 'Authorization: Bearer <token>'", ErrUnauthenticated)
	}
	if subtle.ConstantTimeCompare([]byte(t), a.token) != 1 {
		return UserInfo{}, fmt.Errorf("%w: wrong token; this console was started with another one: open the URL it printed last", ErrUnauthenticated)
	}
	return a.user, nil
}

// TokenReviewAuth accepts bearer tokens the API server vouches for
// (TokenReview): ServiceAccount tokens, and OIDC tokens on clusters that
// accept them. Answers are cached for a short while by the token's digest.
type TokenReviewAuth struct {
	client    kubernetes.Interface
	audiences []string
	ttl       time.Duration
	cache     *cache.LRUExpireCache
}

// NewTokenReviewAuth reviews tokens with client, caching each answer for
// ttl (at most size of them).
func NewTokenReviewAuth(client kubernetes.Interface, audiences []string, ttl time.Duration, size int, c clock.Clock) *TokenReviewAuth {
	return &TokenReviewAuth{client: client, audiences: audiences, ttl: ttl, cache: cache.NewLRUExpireCacheWithClock(size, c)}
}

// Authenticate implements Authenticator.
func (a *TokenReviewAuth) Authenticate(r *http.Request) (UserInfo, error) {
	t := bearer(r)
	if t == "" {
		return UserInfo{}, fmt.Errorf("%w: send a Kubernetes bearer token ('Authorization: Bearer <token>', e.g. from 'kubectl create token'), or sign in on the page", ErrUnauthenticated)
	}
	sum := sha256.Sum256([]byte(t))
	if v, ok := a.cache.Get(sum); ok {
		return v.(UserInfo), nil
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	tr, err := a.client.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: t, Audiences: a.audiences},
	}, metav1.CreateOptions{})
	if err != nil {
		return UserInfo{}, fmt.Errorf("review the bearer token: %w", err)
	}
	if !tr.Status.Authenticated {
		msg := "the API server does not accept the bearer token"
		if tr.Status.Error != "" {
			msg += ": " + tr.Status.Error
		}
		return UserInfo{}, fmt.Errorf("%w: %s", ErrUnauthenticated, msg)
	}
	u := UserInfo{Name: tr.Status.User.Username, UID: tr.Status.User.UID, Groups: tr.Status.User.Groups}
	if len(tr.Status.User.Extra) > 0 {
		u.Extra = map[string][]string{}
		for k, v := range tr.Status.User.Extra {
			u.Extra[k] = v
		}
	}
	a.cache.Add(sum, u, a.ttl)
	return u, nil
}

// ProxyAuth reads the identity an authenticating proxy puts in request
// headers, as kube-apiserver's --requestheader-* flags do. It trusts the
// headers only on a connection whose client certificate the server
// verified against the proxy's CA (ProxyOptions.ClientCA, set as the TLS
// config's ClientCAs), and, when AllowedNames is set, whose common name is
// one of them. Anything else falls through to the next authenticator,
// headers ignored.
type ProxyAuth struct {
	opts ProxyOptions
}

// ProxyOptions are the authenticating proxy's settings.
type ProxyOptions struct {
	// ClientCA verifies the proxy's client certificate.
	ClientCA *x509.CertPool
	// AllowedNames are the common names a proxy certificate may have;
	// empty: any the CA signed.
	AllowedNames []string
	// UsernameHeaders, GroupHeaders and ExtraHeaderPrefixes name the
	// headers (X-Remote-User, X-Remote-Group, X-Remote-Extra-).
	UsernameHeaders     []string
	GroupHeaders        []string
	ExtraHeaderPrefixes []string
}

// NewProxyAuth returns a ProxyAuth with the kube-apiserver defaults for
// empty header lists.
func NewProxyAuth(o ProxyOptions) *ProxyAuth {
	if len(o.UsernameHeaders) == 0 {
		o.UsernameHeaders = []string{"X-Remote-User"}
	}
	if len(o.GroupHeaders) == 0 {
		o.GroupHeaders = []string{"X-Remote-Group"}
	}
	if len(o.ExtraHeaderPrefixes) == 0 {
		o.ExtraHeaderPrefixes = []string{"X-Remote-Extra-"}
	}
	return &ProxyAuth{opts: o}
}

// verifiedProxy reports whether the request came over a connection with a
// proxy client certificate.
func (a *ProxyAuth) verifiedProxy(r *http.Request) (bool, string) {
	if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		return false, "no client certificate"
	}
	// VerifiedChains are set only when the certificate chains to
	// ClientCAs, the proxy's CA, for client authentication.
	if len(r.TLS.VerifiedChains) == 0 {
		return false, "client certificate not signed by the proxy CA"
	}
	leaf := r.TLS.PeerCertificates[0]
	opts := x509.VerifyOptions{Roots: a.opts.ClientCA, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, Intermediates: x509.NewCertPool()}
	for _, c := range r.TLS.PeerCertificates[1:] {
		opts.Intermediates.AddCert(c)
	}
	if _, err := leaf.Verify(opts); err != nil {
		return false, "client certificate not signed by the proxy CA: " + err.Error()
	}
	if len(a.opts.AllowedNames) > 0 && !slices.Contains(a.opts.AllowedNames, leaf.Subject.CommonName) {
		return false, fmt.Sprintf("client certificate %q is not an allowed proxy name", leaf.Subject.CommonName)
	}
	return true, ""
}

// Authenticate implements Authenticator.
func (a *ProxyAuth) Authenticate(r *http.Request) (UserInfo, error) {
	ok, why := a.verifiedProxy(r)
	if !ok {
		return UserInfo{}, fmt.Errorf("%w: not from the authenticating proxy (%s)", ErrUnauthenticated, why)
	}
	var u UserInfo
	for _, h := range a.opts.UsernameHeaders {
		if v := r.Header.Get(h); v != "" {
			u.Name = v
			break
		}
	}
	if u.Name == "" {
		return UserInfo{}, fmt.Errorf("%w: the proxy sent no user (%s)", ErrUnauthenticated, strings.Join(a.opts.UsernameHeaders, ", "))
	}
	for _, h := range a.opts.GroupHeaders {
		u.Groups = append(u.Groups, r.Header.Values(h)...)
	}
	for name, vals := range r.Header {
		for _, p := range a.opts.ExtraHeaderPrefixes {
			if len(name) > len(p) && strings.EqualFold(name[:len(p)], p) {
				key, err := url.PathUnescape(strings.ToLower(name[len(p):]))
				if err != nil {
					key = strings.ToLower(name[len(p):])
				}
				if u.Extra == nil {
					u.Extra = map[string][]string{}
				}
				u.Extra[key] = append(u.Extra[key], vals...)
			}
		}
	}
	return u, nil
}

// Chain tries authenticators in order: the first that proves an identity
// wins. An error other than ErrUnauthenticated (the API server is down)
// stops the chain.
type Chain []Authenticator

// Authenticate implements Authenticator.
func (c Chain) Authenticate(r *http.Request) (UserInfo, error) {
	var msgs []string
	for _, a := range c {
		u, err := a.Authenticate(r)
		if err == nil {
			return u, nil
		}
		if !errors.Is(err, ErrUnauthenticated) {
			return UserInfo{}, err
		}
		msgs = append(msgs, strings.TrimPrefix(err.Error(), ErrUnauthenticated.Error()+": "))
	}
	return UserInfo{}, fmt.Errorf("%w: %s", ErrUnauthenticated, strings.Join(msgs, "; "))
}

// loopbackHosts are the Host headers a local console answers: its own
// address by IP or as localhost. Any other name is a DNS rebinding attempt
// (a web page whose name resolves to 127.0.0.1) or a mistake.
func loopbackHosts(addr net.Addr) []string {
	_, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return nil
	}
	return []string{net.JoinHostPort("127.0.0.1", port), net.JoinHostPort("localhost", port), net.JoinHostPort("::1", port)}
}
