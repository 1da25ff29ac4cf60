package webhook

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"

	"github.com/partita-dev/partita/internal/durable"
)

// File names of a certificate directory, as cert-controller and
// cert-manager write them.
const (
	CertFile = "tls.crt"
	KeyFile  = "tls.key"
	CAFile   = "ca.crt"
)

// WatchCertificates loads the serving certificate from dir and keeps it
// current: the files are watched (and polled, for Secret volumes whose
// symlinks swap), so a rotated certificate is served at the next handshake.
// It returns once the first certificate is loaded; the watch runs until ctx
// ends.
func WatchCertificates(ctx context.Context, dir string) (*certwatcher.CertWatcher, error) {
	cw, err := certwatcher.New(filepath.Join(dir, CertFile), filepath.Join(dir, KeyFile))
	if err != nil {
		return nil, fmt.Errorf("load serving certificate from %s: %w", dir, err)
	}
	cw = cw.WithWatchInterval(10 * time.Second)
	cw.RegisterCallback(func(c tls.Certificate) {
		if c.Leaf != nil {
			logr.FromContextOrDiscard(ctx).Info("Loaded serving certificate", "dir", dir, "notAfter", c.Leaf.NotAfter)
		}
	})
	go func() {
		if err := cw.Start(ctx); err != nil {
			logr.FromContextOrDiscard(ctx).Error(err, "Stopped watching the serving certificate", "dir", dir)
		}
	}()
	return cw, nil
}

// DevCertificateOptions describe the self-signed certificates of a webhook
// that runs on a developer's machine.
type DevCertificateOptions struct {
	// Dir receives ca.crt, tls.crt and tls.key.
	Dir string
	// IPs and DNSNames are the serving certificate's names (127.0.0.1).
	IPs      []net.IP
	DNSNames []string
	// Now is the time of issue; the certificates last a year and are
	// renewed when less than 30 days remain.
	Now time.Time
}

// devCertValidity and devCertRenewBefore bound the dev certificates' life.
const (
	devCertValidity    = 365 * 24 * time.Hour
	devCertRenewBefore = 30 * 24 * time.Hour
)

// EnsureDevCertificates returns the CA bundle of the certificates in
// o.Dir, generating a CA and a serving certificate first when there are
// none, they are about to expire, or they do not cover o's names. Files are
// replaced by rename, so a watcher never reads half a file.
func EnsureDevCertificates(o DevCertificateOptions) ([]byte, error) {
	if ca, ok := validDevCertificates(o); ok {
		return ca, nil
	}
	if err := os.MkdirAll(o.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("create certificate directory: %w", err)
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate CA key: %w", err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(o.Now),
		Subject:               pkix.Name{CommonName: "partita-dev-webhook-ca", Organization: []string{"partita"}},
		NotBefore:             o.Now.Add(-time.Hour),
		NotAfter:              o.Now.Add(devCertValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("create CA certificate: %w", err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, fmt.Errorf("parse CA certificate: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate serving key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(o.Now.Add(time.Nanosecond)),
		Subject:      pkix.Name{CommonName: "partita-webhook"},
		IPAddresses:  o.IPs,
		DNSNames:     o.DNSNames,
		NotBefore:    o.Now.Add(-time.Hour),
		NotAfter:     o.Now.Add(devCertValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("create serving certificate: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("marshal serving key: %w", err)
	}
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	files := []struct {
		name string
		data []byte
	}{
		{CAFile, caPEM},
		{KeyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})},
		{CertFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})},
	}
	for _, f := range files {
		if err := durable.WriteFile(filepath.Join(o.Dir, f.name), f.data, 0o600); err != nil {
			return nil, err
		}
	}
	return caPEM, nil
}

func serial(t time.Time) *big.Int { return big.NewInt(t.UnixNano()) }

// validDevCertificates reports whether o.Dir holds a CA and a serving
// certificate it signed, covering o's names for at least
// devCertRenewBefore.
func validDevCertificates(o DevCertificateOptions) ([]byte, bool) {
	caPEM, err := os.ReadFile(filepath.Join(o.Dir, CAFile))
	if err != nil {
		return nil, false
	}
	pair, err := tls.LoadX509KeyPair(filepath.Join(o.Dir, CertFile), filepath.Join(o.Dir, KeyFile))
	if err != nil || pair.Leaf == nil {
		return nil, false
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, false
	}
	at := o.Now.Add(devCertRenewBefore)
	for _, ip := range o.IPs {
		if _, err := pair.Leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: ip.String(), CurrentTime: at}); err != nil {
			return nil, false
		}
	}
	for _, n := range o.DNSNames {
		if _, err := pair.Leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: n, CurrentTime: at}); err != nil {
			return nil, false
		}
	}
	return caPEM, true
}
