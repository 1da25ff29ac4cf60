package console

import (
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
)

// Clients gives the client that acts as a user: every write the console
// makes, and every read it makes on a user's behalf outside the informers
// (events), goes through it, so the API server decides with the user's own
// permissions.
type Clients interface {
	For(u UserInfo) (client.Client, error)
}

// OwnClients is local mode: the user's own kubeconfig client, whoever asks
// (LocalAuth admits only the user).
type OwnClients struct {
	Client client.Client
}

// For implements Clients.
func (c OwnClients) For(UserInfo) (client.Client, error) { return c.Client, nil }

// ImpersonatingClients is shared mode: the console's own credentials,
// impersonating the caller (user, UID, groups and extra), one client per
// user, kept for a while in a bounded cache. client-go keys its transport
// cache on the TLS settings, which impersonation leaves alone, so the
// users' clients share the console's connections.
type ImpersonatingClients struct {
	base   *rest.Config
	scheme *runtime.Scheme
	mapper meta.RESTMapper
	ttl    time.Duration
	cache  *cache.LRUExpireCache
}

// NewImpersonatingClients makes clients from base that impersonate.
func NewImpersonatingClients(base *rest.Config, scheme *runtime.Scheme, ttl time.Duration, size int, c clock.Clock) (*ImpersonatingClients, error) {
	hc, err := rest.HTTPClientFor(base)
	if err != nil {
		return nil, fmt.Errorf("create HTTP client: %w", err)
	}
	mapper, err := apiutil.NewDynamicRESTMapper(base, hc)
	if err != nil {
		return nil, fmt.Errorf("create REST mapper: %w", err)
	}
	return &ImpersonatingClients{base: base, scheme: scheme, mapper: mapper, ttl: ttl, cache: cache.NewLRUExpireCacheWithClock(size, c)}, nil
}

// For implements Clients.
func (c *ImpersonatingClients) For(u UserInfo) (client.Client, error) {
	if u.Name == "" {
		return nil, fmt.Errorf("impersonate: no user name")
	}
	k := u.key()
	if v, ok := c.cache.Get(k); ok {
		return v.(client.Client), nil
	}
	cfg := rest.CopyConfig(c.base)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: u.Name, UID: u.UID, Groups: u.Groups, Extra: u.Extra}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("create client impersonating %s: %w", u.Name, err)
	}
	cl, err := client.New(cfg, client.Options{Scheme: c.scheme, Mapper: c.mapper, HTTPClient: hc})
	if err != nil {
		return nil, fmt.Errorf("create client impersonating %s: %w", u.Name, err)
	}
	c.cache.Add(k, cl, c.ttl)
	return cl, nil
}
