package console

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/dra"
)

// DefaultTopologyKey is the node label the map groups nodes by, unless
// told otherwise: the zone.
const DefaultTopologyKey = "topology.kubernetes.io/zone"

// Config is everything `partita console` needs to start, in either mode.
type Config struct {
	Mode Mode
	// Rest is the user's kubeconfig (local mode) or the console's own
	// credentials (shared mode).
	Rest   *rest.Config
	Scheme *runtime.Scheme
	// Addr is where to listen: loopback only in local mode.
	Addr string
	// DefaultNamespace is the kubeconfig's namespace: where the forms
	// start, and (local mode) a namespace to watch when the user may not
	// list namespaces.
	DefaultNamespace string
	// PartitaNamespace is where Partita runs (the policy ConfigMaps).
	PartitaNamespace string
	// TopologyKey is the node label that groups the map.
	TopologyKey string
	// GPUClasses are the DeviceClasses whose devices are GPUs (the
	// extender's --gpu-device-classes): why reads pods' claims with them.
	GPUClasses dra.GPUClasses
	// WebhookConfiguration is the webhook's MutatingWebhookConfiguration,
	// whose endpoints the console scrapes for denials without Prometheus.
	WebhookConfiguration string
	// PrometheusURL, when set, serves utilisation and denials.
	PrometheusURL string
	// SampleInterval and History shape the console's own samples.
	SampleInterval time.Duration
	History        time.Duration
	// AccessTTL is how long answers of access reviews and token reviews
	// are kept.
	AccessTTL time.Duration
	// MaxUsers bounds the per-user caches (shared mode).
	MaxUsers int

	// Token is local mode's token (LocalToken reads or makes one from a
	// file); empty: a random one for this run.
	Token string

	// Shared mode: the serving certificate (empty: a self-signed one,
	// made at start), the token audiences, and the authenticating proxy
	// (nil: none; bearer tokens only).
	TLSCertFile, TLSKeyFile string
	TokenAudiences          []string
	Proxy                   *ProxyOptions

	Log   logr.Logger
	Clock clock.Clock
}

func (c *Config) defaults() {
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	if c.PartitaNamespace == "" {
		c.PartitaNamespace = "partita-system"
	}
	if c.WebhookConfiguration == "" {
		c.WebhookConfiguration = "partita"
	}
	if c.SampleInterval <= 0 {
		c.SampleInterval = 15 * time.Second
	}
	if c.History <= 0 {
		c.History = 6 * time.Hour
	}
	if c.AccessTTL <= 0 {
		c.AccessTTL = 20 * time.Second
	}
	if c.MaxUsers <= 0 {
		c.MaxUsers = 512
	}
	if c.Addr == "" {
		c.Addr = "127.0.0.1:0"
	}
}

// Instance is a running console.
type Instance struct {
	// Server is the console.
	Server *Server
	// URL is where it serves the map; in local mode it carries the token
	// (in the fragment, which the browser never sends to any server).
	URL string
	// Token is local mode's token ("" in shared mode).
	Token string
	// Addr is the listening address.
	Addr net.Addr

	errc chan error
	once sync.Once
	err  error
}

// Wait returns when the console stops: nil when ctx ended, else why.
func (i *Instance) Wait() error {
	i.once.Do(func() { i.err = <-i.errc })
	return i.err
}

// Start starts a console: it reads what the credentials may see, starts
// the informers, listens, and returns once the first snapshot is built (or
// with what went wrong). It serves until ctx ends.
func Start(ctx context.Context, cfg Config) (*Instance, error) {
	cfg.defaults()
	switch cfg.Mode {
	case ModeLocal, ModeShared:
	default:
		return nil, fmt.Errorf("unknown console mode %q: want local or shared", cfg.Mode)
	}
	if cfg.Mode == ModeLocal {
		if err := CheckLocalAddr(cfg.Addr); err != nil {
			return nil, err
		}
	}
	cs, err := kubernetes.NewForConfig(cfg.Rest)
	if err != nil {
		return nil, fmt.Errorf("create client: %w", err)
	}
	cl, err := client.New(cfg.Rest, client.Options{Scheme: cfg.Scheme})
	if err != nil {
		return nil, fmt.Errorf("create client for %s: %w", cfg.Rest.Host, err)
	}
	self := SelfReviewer{Client: cs}
	served, err := ServesAPIs(cfg.Rest)
	if err != nil {
		return nil, err
	}
	cov, err := DiscoverCoverage(ctx, self, cl, cfg.PartitaNamespace, []string{cfg.DefaultNamespace}, served)
	if err != nil {
		return nil, fmt.Errorf("ask the API server what the console may read: %w", err)
	}
	if !cov.GPUNodes && !cov.Queues && !cov.Pods.All && len(cov.Pods.Names) == 0 {
		who := "you"
		if cfg.Mode == ModeShared {
			who = "the console's ServiceAccount"
		}
		return nil, fmt.Errorf("%s may list none of gpunodes.partita.dev, queues.partita.dev or pods (in any namespace tried): there is nothing to show; check the credentials (is Partita installed?)", who)
	}
	src, err := NewSource(SourceOptions{Config: cfg.Rest, Scheme: cfg.Scheme, Coverage: cov, PartitaNamespace: cfg.PartitaNamespace, Clock: cfg.Clock, Log: cfg.Log})
	if err != nil {
		return nil, err
	}
	deps := Deps{
		Source:  src,
		Events:  NewEventCache(cl, 5*time.Second, 256, cfg.Clock),
		History: NewHistory(cfg.SampleInterval, cfg.History),
		Reader:  cl,
	}
	if cfg.PrometheusURL != "" {
		if deps.Prometheus, err = NewPrometheus(cfg.PrometheusURL); err != nil {
			return nil, err
		}
	} else {
		deps.Webhook = NewWebhookScraper(cl, cfg.WebhookConfiguration, 15*time.Second, cfg.Clock)
	}
	inst := &Instance{errc: make(chan error, 2)}
	var tlsConfig *tls.Config
	switch cfg.Mode {
	case ModeLocal:
		user := whoAmI(ctx, cs)
		tok := cfg.Token
		if tok == "" {
			if tok, err = randomToken(); err != nil {
				return nil, err
			}
		} else if err := checkToken(tok); err != nil {
			return nil, err
		}
		inst.Token = tok
		deps.Authn = NewLocalAuth(tok, user)
		deps.Authz = NewCachedAuthorizer(self, cfg.AccessTTL, 4096, cfg.Clock)
		deps.Clients = OwnClients{Client: cl}
	case ModeShared:
		chain := Chain{}
		if cfg.Proxy != nil {
			chain = append(chain, NewProxyAuth(*cfg.Proxy))
		}
		chain = append(chain, NewTokenReviewAuth(cs, cfg.TokenAudiences, cfg.AccessTTL, 4*cfg.MaxUsers, cfg.Clock))
		deps.Authn = chain
		deps.Authz = NewCachedAuthorizer(SubjectReviewer{Client: cs}, cfg.AccessTTL, 64*cfg.MaxUsers, cfg.Clock)
		if deps.Clients, err = NewImpersonatingClients(cfg.Rest, cfg.Scheme, 10*time.Minute, cfg.MaxUsers, cfg.Clock); err != nil {
			return nil, err
		}
		if tlsConfig, err = servingTLS(cfg); err != nil {
			return nil, err
		}
	}
	srv, err := New(Options{Mode: cfg.Mode, PartitaNamespace: cfg.PartitaNamespace, TopologyKey: cfg.TopologyKey, GPUClasses: cfg.GPUClasses,
		DefaultNamespace: cfg.DefaultNamespace, Log: cfg.Log, Clock: cfg.Clock}, deps)
	if err != nil {
		return nil, err
	}
	inst.Server = srv
	l, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", cfg.Addr, err)
	}
	inst.Addr = l.Addr()
	ready := make(chan struct{})
	go func() { inst.errc <- srv.Run(ctx, ready) }()
	select {
	case <-ready:
	case err := <-inst.errc:
		_ = l.Close()
		if err == nil {
			err = ctx.Err()
		}
		return nil, err
	}
	go func() { inst.errc <- Serve(ctx, l, srv.Handler(l.Addr()), tlsConfig, cfg.Log) }()
	switch cfg.Mode {
	case ModeLocal:
		inst.URL = "http://" + l.Addr().String() + "/#token=" + inst.Token
	case ModeShared:
		inst.URL = "https://" + l.Addr().String() + "/"
	}
	return inst, nil
}

// CheckLocalAddr refuses a local console on anything but loopback: it
// acts with the user's own credentials, for them alone.
func CheckLocalAddr(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--addr %q: %w", addr, err)
	}
	if host == "localhost" {
		return nil
	}
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("--addr %q: a local console serves on loopback only (127.0.0.1), because it acts with your credentials; for a console others open, install the chart's (console.enabled=true)", addr)
	}
	return nil
}

// whoAmI asks the API server who the kubeconfig's credentials are
// (SelfSubjectReview); on a cluster that cannot say, the name stays
// generic.
func whoAmI(ctx context.Context, cs kubernetes.Interface) UserInfo {
	r, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return UserInfo{Name: "you"}
	}
	u := r.Status.UserInfo
	out := UserInfo{Name: u.Username, UID: u.UID, Groups: u.Groups}
	if len(u.Extra) > 0 {
		out.Extra = map[string][]string{}
		for k, v := range u.Extra {
			out.Extra[k] = v
		}
	}
	return out
}

// minTokenLength is the shortest token a local console accepts from a
// file: 32 random bytes encode to 43 characters.
const minTokenLength = 43

func checkToken(tok string) error {
	if len(tok) < minTokenLength || strings.ContainsAny(tok, " \t\r\n#&?/") {
		return fmt.Errorf("the console's token must be at least %d characters of a URL fragment (no spaces, '#', '&', '?' or '/'); remove the token file to have a new one made", minTokenLength)
	}
	return nil
}

// LocalToken returns the token kept in path, or makes a random one and
// keeps it there (mode 0600, created exclusively), so that a local console
// started again serves the same URL. A file that others may read, or that
// holds no usable token, is refused.
func LocalToken(path string) (string, error) {
	for range 2 {
		b, err := os.ReadFile(path)
		if err == nil {
			st, err := os.Stat(path)
			if err != nil {
				return "", err
			}
			if st.Mode().Perm()&0o077 != 0 {
				return "", fmt.Errorf("token file %s may be read by others (mode %v): chmod 600 it, or remove it to have a new one made", path, st.Mode().Perm())
			}
			tok := strings.TrimSpace(string(b))
			if err := checkToken(tok); err != nil {
				return "", fmt.Errorf("token file %s: %w", path, err)
			}
			return tok, nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("read the token file: %w", err)
		}
		tok, err := randomToken()
		if err != nil {
			return "", err
		}
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if errors.Is(err, os.ErrExist) {
			continue // another console made it first: read theirs
		}
		if err != nil {
			return "", fmt.Errorf("create the token file: %w", err)
		}
		_, werr := f.WriteString(tok + "\n")
		if cerr := f.Close(); werr == nil {
			werr = cerr
		}
		if werr != nil {
			_ = os.Remove(path)
			return "", fmt.Errorf("write the token file: %w", werr)
		}
		return tok, nil
	}
	return "", fmt.Errorf("token file %s keeps appearing and vanishing", path)
}

func randomToken() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("make the console's token: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// servingTLS is shared mode's TLS: the certificate files (read again when
// they change, so a renewed Secret is served without a restart) or a
// self-signed certificate; and, with a proxy, its client certificates
// verified against its CA.
func servingTLS(cfg Config) (*tls.Config, error) {
	t := &tls.Config{MinVersion: tls.VersionTLS12}
	switch {
	case cfg.TLSCertFile != "" && cfg.TLSKeyFile != "":
		r := &certReloader{cert: cfg.TLSCertFile, key: cfg.TLSKeyFile}
		if _, err := r.get(nil); err != nil {
			return nil, err
		}
		t.GetCertificate = r.get
	case cfg.TLSCertFile != "" || cfg.TLSKeyFile != "":
		return nil, errors.New("give both --tls-cert-file and --tls-key-file, or neither (a self-signed certificate)")
	default:
		c, err := selfSigned(cfg.Clock.Now())
		if err != nil {
			return nil, err
		}
		cfg.Log.Info("Serving with a self-signed certificate made at start; give --tls-cert-file and --tls-key-file for one browsers trust")
		t.Certificates = []tls.Certificate{c}
	}
	if cfg.Proxy != nil {
		if cfg.Proxy.ClientCA == nil {
			return nil, errors.New("the authenticating proxy needs its client CA (--proxy-client-ca-file): the console trusts identity headers only from a client certificate that CA signed")
		}
		t.ClientCAs = cfg.Proxy.ClientCA
		t.ClientAuth = tls.VerifyClientCertIfGiven
	}
	return t, nil
}

// certReloader serves a certificate and key from files, reading them again
// when they change.
type certReloader struct {
	cert, key string
	lock      sync.Mutex
	mod       time.Time
	current   *tls.Certificate
}

func (r *certReloader) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	r.lock.Lock()
	defer r.lock.Unlock()
	st, err := os.Stat(r.cert)
	if err != nil {
		if r.current != nil {
			return r.current, nil
		}
		return nil, fmt.Errorf("read the serving certificate: %w", err)
	}
	if r.current != nil && !st.ModTime().After(r.mod) {
		return r.current, nil
	}
	c, err := tls.LoadX509KeyPair(r.cert, r.key)
	if err != nil {
		if r.current != nil {
			return r.current, nil
		}
		return nil, fmt.Errorf("load the serving certificate %s: %w", r.cert, err)
	}
	r.current, r.mod = &c, st.ModTime()
	return r.current, nil
}

func selfSigned(now time.Time) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("make a self-signed certificate: %w", err)
	}
	names := []string{"localhost"}
	if host, err := os.Hostname(); err == nil && strings.TrimSpace(host) != "" {
		names = append(names, strings.TrimSpace(host))
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(now.UnixNano()),
		Subject:      pkix.Name{CommonName: "partita-console"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     names,
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("make a self-signed certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}
