package extender

import (
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

	"github.com/partita-dev/partita/internal/durable"
)

// Files of a dev certificate directory (EnsureDevCertificates).
const (
	// DevCAFile is the CA that signed both certificates: kube-scheduler's
	// caFile, and the extender's --client-ca-file.
	DevCAFile = "ca.crt"
	// DevServingCertFile and DevServingKeyFile are the extender's serving
	// certificate (--cert-dir).
	DevServingCertFile = "tls.crt"
	DevServingKeyFile  = "tls.key"
	// DevClientCertFile and DevClientKeyFile are kube-scheduler's client
	// certificate (tlsConfig certFile and keyFile).
	DevClientCertFile = "client.crt"
	DevClientKeyFile  = "client.key"
)

// DevCertificateOptions describe the certificates of an extender and its
// kube-scheduler on a developer's machine (partita dev up).
type DevCertificateOptions struct {
	// Dir receives the files above.
	Dir string
	// IPs are the serving certificate's addresses (127.0.0.1); it also
	// names localhost.
	IPs []net.IP
	// ClientName is the client certificate's common name
	// (DefaultClientName when empty).
	ClientName string
	// Now is the time of issue; the certificates last a year and are
	// renewed when less than 30 days remain.
	Now time.Time
}

const (
	devCertValidity    = 365 * 24 * time.Hour
	devCertRenewBefore = 30 * 24 * time.Hour
)

// EnsureDevCertificates makes sure o.Dir holds a CA, a serving certificate
// for o.IPs and a client certificate for o.ClientName that it signed, valid
// for at least 30 more days; otherwise it writes new ones (each file by
// rename, so a process that reloads them never reads half a file). One CA
// signs both: the client certificate can serve nothing and the serving one
// cannot authenticate (extended key usages), and the extender checks the
// client's name. The keys are readable by their owner only.
func EnsureDevCertificates(o DevCertificateOptions) error {
	if o.ClientName == "" {
		o.ClientName = DefaultClientName
	}
	if validDevCertificates(o) {
		return nil
	}
	if err := os.MkdirAll(o.Dir, 0o700); err != nil {
		return fmt.Errorf("create certificate directory: %w", err)
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("generate CA key: %w", err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(o.Now.UnixNano()),
		Subject:               pkix.Name{CommonName: "partita-dev-extender-ca", Organization: []string{"partita"}},
		NotBefore:             o.Now.Add(-time.Hour),
		NotAfter:              o.Now.Add(devCertValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return fmt.Errorf("create CA certificate: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return fmt.Errorf("parse CA certificate: %w", err)
	}
	serving := &x509.Certificate{
		SerialNumber: big.NewInt(o.Now.UnixNano() + 1),
		Subject:      pkix.Name{CommonName: "partita-extender"},
		IPAddresses:  o.IPs,
		DNSNames:     []string{"localhost"},
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	client := &x509.Certificate{
		SerialNumber: big.NewInt(o.Now.UnixNano() + 2),
		Subject:      pkix.Name{CommonName: o.ClientName},
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	files := map[string][]byte{DevCAFile: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})}
	for _, leaf := range []struct {
		tmpl              *x509.Certificate
		certFile, keyFile string
	}{{serving, DevServingCertFile, DevServingKeyFile}, {client, DevClientCertFile, DevClientKeyFile}} {
		leaf.tmpl.NotBefore, leaf.tmpl.NotAfter = o.Now.Add(-time.Hour), o.Now.Add(devCertValidity)
		leaf.tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return fmt.Errorf("generate key for %s: %w", leaf.certFile, err)
		}
		der, err := x509.CreateCertificate(rand.Reader, leaf.tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return fmt.Errorf("create %s: %w", leaf.certFile, err)
		}
		keyDER, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return fmt.Errorf("marshal key for %s: %w", leaf.certFile, err)
		}
		files[leaf.certFile] = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
		files[leaf.keyFile] = pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	}
	// The CA last: a reader that sees the new CA sees certificates it
	// signed.
	for _, name := range []string{DevServingKeyFile, DevServingCertFile, DevClientKeyFile, DevClientCertFile, DevCAFile} {
		if err := durable.WriteFile(filepath.Join(o.Dir, name), files[name], 0o600); err != nil {
			return err
		}
	}
	return nil
}

// validDevCertificates reports whether o.Dir holds certificates that
// EnsureDevCertificates would keep.
func validDevCertificates(o DevCertificateOptions) bool {
	caPEM, err := os.ReadFile(filepath.Join(o.Dir, DevCAFile))
	if err != nil {
		return false
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		return false
	}
	at := o.Now.Add(devCertRenewBefore)
	check := func(certFile, keyFile string, opts x509.VerifyOptions) bool {
		pair, err := tls.LoadX509KeyPair(filepath.Join(o.Dir, certFile), filepath.Join(o.Dir, keyFile))
		if err != nil || pair.Leaf == nil {
			return false
		}
		opts.Roots, opts.CurrentTime = roots, at
		_, err = pair.Leaf.Verify(opts)
		return err == nil && (opts.DNSName != "" || pair.Leaf.Subject.CommonName == o.ClientName)
	}
	for _, ip := range o.IPs {
		if !check(DevServingCertFile, DevServingKeyFile, x509.VerifyOptions{DNSName: ip.String(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}) {
			return false
		}
	}
	return check(DevClientCertFile, DevClientKeyFile, x509.VerifyOptions{KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
}
