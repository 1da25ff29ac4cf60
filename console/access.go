package console

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"sort"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"
)

// UserInfo is an authenticated caller, as the API server knows them.
type UserInfo struct {
	// Name is the user name (system:serviceaccount:ns:sa for a
	// ServiceAccount).
	Name string `json:"name"`
	// UID is the user's UID, when the authenticator gives one.
	UID string `json:"uid,omitempty"`
	// Groups are the user's groups.
	Groups []string `json:"groups,omitempty"`
	// Extra is the authenticator's extra information (scopes, ...).
	Extra map[string][]string `json:"extra,omitempty"`
}

// key is a digest of everything that makes the user who they are, for
// caches: two users who differ in one group never share an answer.
func (u UserInfo) key() string {
	h := sha256.New()
	write := func(s string) { h.Write([]byte(s)); h.Write([]byte{0}) }
	write(u.Name)
	write(u.UID)
	groups := slices.Clone(u.Groups)
	sort.Strings(groups)
	for _, g := range groups {
		write("g:" + g)
	}
	keys := make([]string, 0, len(u.Extra))
	for k := range u.Extra {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		write("x:" + k)
		for _, v := range u.Extra[k] {
			write(v)
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Attributes are one request a user might make, as RBAC sees it.
type Attributes struct {
	Verb        string
	Group       string
	Resource    string
	Subresource string
	// Namespace is "" for a cluster-scoped object, or for every namespace.
	Namespace string
	Name      string
}

func (a Attributes) resourceAttributes() *authorizationv1.ResourceAttributes {
	return &authorizationv1.ResourceAttributes{
		Verb: a.Verb, Group: a.Group, Resource: a.Resource, Subresource: a.Subresource,
		Namespace: a.Namespace, Name: a.Name,
	}
}

// Authorizer asks the API server whether a user may do something. It only
// decides what the console shows and offers: every write is made as the
// user, and the API server decides it again.
type Authorizer interface {
	Allowed(ctx context.Context, u UserInfo, a Attributes) (bool, error)
}

// SelfReviewer asks with SelfSubjectAccessReview, as the credentials of
// its client: local mode, where the client is the user's own and u is
// ignored.
type SelfReviewer struct {
	Client kubernetes.Interface
}

// Allowed implements Authorizer.
func (r SelfReviewer) Allowed(ctx context.Context, _ UserInfo, a Attributes) (bool, error) {
	rev := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: a.resourceAttributes()}}
	got, err := r.Client.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, rev, metav1.CreateOptions{})
	if err != nil {
		return false, fmt.Errorf("SelfSubjectAccessReview (%s): %w", describe(a), err)
	}
	return got.Status.Allowed, nil
}

// SubjectReviewer asks with SubjectAccessReview about another user: shared
// mode, where the console's own ServiceAccount asks about its callers.
type SubjectReviewer struct {
	Client kubernetes.Interface
}

// Allowed implements Authorizer.
func (r SubjectReviewer) Allowed(ctx context.Context, u UserInfo, a Attributes) (bool, error) {
	extra := map[string]authorizationv1.ExtraValue{}
	for k, v := range u.Extra {
		extra[k] = v
	}
	rev := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: u.Name, UID: u.UID, Groups: u.Groups, Extra: extra, ResourceAttributes: a.resourceAttributes(),
	}}
	got, err := r.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, rev, metav1.CreateOptions{})
	if err != nil {
		return false, fmt.Errorf("SubjectAccessReview for %s (%s): %w", u.Name, describe(a), err)
	}
	return got.Status.Allowed, nil
}

func describe(a Attributes) string {
	r := a.Resource
	if a.Subresource != "" {
		r += "/" + a.Subresource
	}
	if a.Group != "" {
		r += "." + a.Group
	}
	where := "cluster-wide"
	if a.Namespace != "" {
		where = "in " + a.Namespace
	}
	return a.Verb + " " + r + " " + where
}

// CachedAuthorizer remembers answers for a while, bounded in size, so a
// page that asks about every namespace asks the API server once per TTL.
// Denials are kept as long as grants: a permission granted now shows
// within one TTL.
type CachedAuthorizer struct {
	next  Authorizer
	ttl   time.Duration
	cache *cache.LRUExpireCache
}

// NewCachedAuthorizer caches next's answers for ttl, at most size of them.
func NewCachedAuthorizer(next Authorizer, ttl time.Duration, size int, c clock.Clock) *CachedAuthorizer {
	return &CachedAuthorizer{next: next, ttl: ttl, cache: cache.NewLRUExpireCacheWithClock(size, c)}
}

type accessKey struct {
	user string
	a    Attributes
}

// Allowed implements Authorizer.
func (c *CachedAuthorizer) Allowed(ctx context.Context, u UserInfo, a Attributes) (bool, error) {
	k := accessKey{u.key(), a}
	if v, ok := c.cache.Get(k); ok {
		return v.(bool), nil
	}
	ok, err := c.next.Allowed(ctx, u, a)
	if err != nil {
		return false, err
	}
	c.cache.Add(k, ok, c.ttl)
	return ok, nil
}

// attrListPods is listing pods in ns, "" for every namespace: what it
// takes to see a namespace's workloads.
func attrListPods(ns string) Attributes {
	return Attributes{Verb: "list", Resource: "pods", Namespace: ns}
}

// Viewer is what one caller may see in one snapshot, worked out once per
// request from the Authorizer.
type Viewer struct {
	User UserInfo
	// Pods are the namespaces whose workloads the caller may see: those
	// where they may list pods.
	Pods NamespaceSet
	// GPUNodes, Queues, Topologies and Policy: the caller may list
	// GPUNodes, Queues, Topologies, and the policy ConfigMaps of Partita's
	// namespace.
	GPUNodes   bool
	Queues     bool
	Topologies bool
	Policy     bool
}

// viewer asks the Authorizer what u may see of s.
func viewer(ctx context.Context, authz Authorizer, u UserInfo, s *Snapshot, partitaNamespace string) (Viewer, error) {
	v := Viewer{User: u}
	checks := []struct {
		a   Attributes
		dst *bool
	}{
		{Attributes{Verb: "list", Group: groupPartita, Resource: "gpunodes"}, &v.GPUNodes},
		{Attributes{Verb: "list", Group: groupPartita, Resource: "queues"}, &v.Queues},
		{Attributes{Verb: "list", Group: groupPartita, Resource: "topologies"}, &v.Topologies},
		{Attributes{Verb: "list", Resource: "configmaps", Namespace: partitaNamespace}, &v.Policy},
	}
	for _, c := range checks {
		ok, err := authz.Allowed(ctx, u, c.a)
		if err != nil {
			return Viewer{}, err
		}
		*c.dst = ok
	}
	pods, err := visibleNamespaces(ctx, authz, u, s.namespaces)
	if err != nil {
		return Viewer{}, err
	}
	v.Pods = pods
	return v, nil
}

// visibleNamespaces are the namespaces of candidates where u may list
// pods: all of them when u may list pods everywhere.
func visibleNamespaces(ctx context.Context, authz Authorizer, u UserInfo, candidates []string) (NamespaceSet, error) {
	all, err := authz.Allowed(ctx, u, attrListPods(""))
	if err != nil {
		return NamespaceSet{}, err
	}
	if all {
		return AllNamespaces(), nil
	}
	out := Namespaces()
	for _, ns := range candidates {
		ok, err := authz.Allowed(ctx, u, attrListPods(ns))
		if err != nil {
			return NamespaceSet{}, err
		}
		if ok {
			out.Names[ns] = true
		}
	}
	return out, nil
}

const groupPartita = "partita.dev"
