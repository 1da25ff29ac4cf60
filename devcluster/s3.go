package devcluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/devcluster/realnode"
	"github.com/partita-dev/partita/internal/durable"
)

// S3Credentials are the S3 addon's root keys, made once per cluster.
type S3Credentials struct {
	AccessKeyID     string `json:"accessKeyID"`
	SecretAccessKey string `json:"secretAccessKey"`
}

func (c *Cluster) s3CredentialsPath() string {
	a, _ := addon(AddonS3)
	return filepath.Join(c.addonState(a), "credentials.json")
}

// s3Credentials reads the cluster's S3 keys, making them on first use.
func (c *Cluster) s3Credentials() (S3Credentials, error) {
	var cr S3Credentials
	b, err := os.ReadFile(c.s3CredentialsPath())
	if err == nil {
		if err := json.Unmarshal(b, &cr); err != nil {
			return cr, fmt.Errorf("read %s: %w", c.s3CredentialsPath(), err)
		}
		return cr, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return cr, err
	}
	cr = S3Credentials{AccessKeyID: "PARTITA" + strings.ToUpper(randomHex(7)), SecretAccessKey: randomHex(20)}
	if b, err = json.Marshal(cr); err != nil {
		return cr, err
	}
	if err := os.MkdirAll(filepath.Dir(c.s3CredentialsPath()), 0o700); err != nil {
		return cr, err
	}
	return cr, durable.WriteFile(c.s3CredentialsPath(), b, 0o600)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// S3Endpoint is the S3 addon's URL on the host's address, which host
// processes and the real node's pods both reach.
func (c *Cluster) S3Endpoint() (string, error) {
	ip, err := realnode.HostIP()
	if err != nil {
		return "", err
	}
	port, err := c.Port(AddonS3)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("http://%s:%d", ip, port), nil
}

// addonValues replaces an addon's own placeholders in its arguments.
func (c *Cluster) addonValues(a Addon) *strings.Replacer {
	pairs := []string{"{addon}", c.addonState(a)}
	if a.Name == AddonS3 {
		cr, err := c.s3Credentials()
		if err == nil {
			pairs = append(pairs, "{s3-access}", cr.AccessKeyID, "{s3-secret}", cr.SecretAccessKey)
		}
		ip, err := realnode.HostIP()
		if err != nil {
			ip = "127.0.0.1"
		}
		pairs = append(pairs, "{host-ip}", ip)
	}
	return strings.NewReplacer(pairs...)
}

// writeS3Secret makes (or updates) the Secret partita-system/s3 that says
// how to reach the S3 addon.
func (c *Cluster) writeS3Secret(ctx context.Context, _ Addon) error {
	cr, err := c.s3Credentials()
	if err != nil {
		return err
	}
	endpoint, err := c.S3Endpoint()
	if err != nil {
		return err
	}
	cs, err := c.Clientset()
	if err != nil {
		return err
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: PartitaNamespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", PartitaNamespace, err)
	}
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: PartitaNamespace, Name: S3SecretName, Labels: map[string]string{"app.kubernetes.io/part-of": "partita-dev"}},
		StringData: map[string]string{
			"endpoint":                          endpoint,
			v1alpha1.ModelSecretAccessKeyID:     cr.AccessKeyID,
			v1alpha1.ModelSecretSecretAccessKey: cr.SecretAccessKey,
		},
	}
	_, err = cs.CoreV1().Secrets(PartitaNamespace).Create(ctx, sec, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		_, err = cs.CoreV1().Secrets(PartitaNamespace).Update(ctx, sec, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("write Secret %s/%s: %w", PartitaNamespace, S3SecretName, err)
	}
	return nil
}
