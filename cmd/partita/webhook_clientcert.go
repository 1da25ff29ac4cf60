package main

import (
	"crypto/x509"
	"fmt"

	"github.com/open-policy-agent/cert-controller/pkg/rotator"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/partita-dev/partita/extender"
	"github.com/partita-dev/partita/webhook"
)

// clientCertFlags are the webhook's flags for kube-scheduler's client
// certificate, which the extender requires of every caller of its verbs.
// With --cert-rotation=self the webhook, which already rotates the
// release's serving certificate, rotates this one too, in a Secret of its
// own with a CA of its own (the extender's --client-ca-file is that CA):
// the webhook pods start first in every install, so the extender and its
// kube-scheduler find the Secret filled when they mount it.
type clientCertFlags struct {
	secretName string
	dir        string
	commonName string
}

func (f *clientCertFlags) register(fl interface {
	StringVar(p *string, name, value, usage string)
}) {
	fl.StringVar(&f.secretName, "client-cert-secret-name", "", "with --cert-rotation=self: also rotate kube-scheduler's client certificate for the extender in this Secret (its own CA, ca.crt, which is the extender's --client-ca-file); empty: none")
	fl.StringVar(&f.dir, "client-cert-dir", "/etc/partita/scheduler-client", "where that Secret is mounted (cert-controller waits for it there)")
	fl.StringVar(&f.commonName, "client-cert-common-name", extender.DefaultClientName, "common name of that client certificate: one of the extender's --client-allowed-names")
}

// configOverride is a manager whose clients are built from another
// configuration: cert-controller builds the cache that watches its Secret
// from the manager's, and each Secret needs its own scoped reads
// (webhook.ScopeSecretReads names one Secret).
type configOverride struct {
	manager.Manager
	cfg *rest.Config
}

// GetConfig returns the overriding configuration.
func (m configOverride) GetConfig() *rest.Config { return m.cfg }

// addClientCertRotator adds the rotation of kube-scheduler's client
// certificate to mgr; unscoped is the manager's configuration before its
// Secret reads were scoped to the serving certificate's Secret.
func addClientCertRotator(mgr manager.Manager, unscoped *rest.Config, namespace string, f *clientCertFlags) error {
	cfg := rest.CopyConfig(unscoped)
	cfg.Wrap(webhook.ScopeSecretReads(namespace, f.secretName))
	err := rotator.AddRotator(configOverride{Manager: mgr, cfg: cfg}, &rotator.CertRotator{
		SecretKey:      types.NamespacedName{Namespace: namespace, Name: f.secretName},
		CertDir:        f.dir,
		CAName:         "partita-scheduler-client-ca",
		CAOrganization: "partita",
		DNSName:        f.commonName,
		ExtKeyUsages:   &[]x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		// Nobody waits for it: the webhook serves with or without it.
		IsReady:        make(chan struct{}),
		ControllerName: "partita-scheduler-client-cert",
	})
	if err != nil {
		return fmt.Errorf("set up rotation of the scheduler's client certificate: %w", err)
	}
	return nil
}
