package webhook

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/policy"
)

// Names of the webhooks inside the configurations.
const (
	WebhookMutatePods        = "pods.mutate.partita.dev"
	WebhookValidatePods      = "pods.validate.partita.dev"
	WebhookValidatePolicies  = "policies.validate.partita.dev"
	WebhookValidatePodGroups = "podgroups.validate.partita.dev"
)

// DefaultConfigurationName names both webhook configurations.
const DefaultConfigurationName = "partita"

// labelNamespaceName is the label the API server puts on every namespace.
const labelNamespaceName = "kubernetes.io/metadata.name"

// ConfigurationOptions describe where the API server reaches the webhook.
type ConfigurationOptions struct {
	// Name names both configurations (DefaultConfigurationName).
	Name string
	// Namespace is Partita's namespace: never blocked by the pod webhooks,
	// and the only namespace whose policy ConfigMaps load.
	Namespace string
	// ExcludedNamespaces are further namespaces the pod webhooks skip;
	// kube-system always is.
	ExcludedNamespaces []string
	// Service is the in-cluster Service of the webhook (its path is set
	// per webhook); exclusive with URL.
	Service *admissionregistrationv1.ServiceReference
	// URL is the webhook's base URL ("https://127.0.0.1:9443") when it runs
	// outside the cluster, as in the dev cluster.
	URL string
	// CABundle is the PEM CA that signed the serving certificate; with
	// cert-controller it is injected later.
	CABundle []byte
}

// excluded is the namespaces the pod webhooks never touch: failing closed
// there could lock out the control plane or Partita itself (DESIGN §10).
func (o ConfigurationOptions) excluded() []string {
	out := []string{metav1.NamespaceSystem, o.Namespace}
	for _, n := range o.ExcludedNamespaces {
		if n != "" && n != metav1.NamespaceSystem && n != o.Namespace {
			out = append(out, n)
		}
	}
	return out
}

func (o ConfigurationOptions) client(path string) admissionregistrationv1.WebhookClientConfig {
	cc := admissionregistrationv1.WebhookClientConfig{CABundle: o.CABundle}
	if o.Service != nil {
		svc := *o.Service
		svc.Path = ptr.To(path)
		cc.Service = &svc
	} else {
		cc.URL = ptr.To(strings.TrimSuffix(o.URL, "/") + path)
	}
	return cc
}

func (o ConfigurationOptions) name() string {
	if o.Name == "" {
		return DefaultConfigurationName
	}
	return o.Name
}

// podRules are the pod operations both pod webhooks see.
func podRules(bindings bool) []admissionregistrationv1.RuleWithOperations {
	rule := func(ops []admissionregistrationv1.OperationType, resources ...string) admissionregistrationv1.RuleWithOperations {
		return admissionregistrationv1.RuleWithOperations{
			Operations: ops,
			Rule: admissionregistrationv1.Rule{
				APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: resources,
				Scope: ptr.To(admissionregistrationv1.NamespacedScope),
			},
		}
	}
	create := []admissionregistrationv1.OperationType{admissionregistrationv1.Create}
	update := []admissionregistrationv1.OperationType{admissionregistrationv1.Update}
	if !bindings {
		return []admissionregistrationv1.RuleWithOperations{
			rule(create, "pods"),
			rule(update, "pods/ephemeralcontainers"),
		}
	}
	return []admissionregistrationv1.RuleWithOperations{
		rule([]admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update}, "pods"),
		rule(update, "pods/ephemeralcontainers"),
		rule(create, "pods/binding"),
	}
}

func (o ConfigurationOptions) podNamespaceSelector() *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
		Key: labelNamespaceName, Operator: metav1.LabelSelectorOpNotIn, Values: o.excluded(),
	}}}
}

// MutatingConfiguration is the MutatingWebhookConfiguration: pod CREATE
// and ephemeral containers, failing closed outside the excluded
// namespaces, reinvoked when a later webhook changes the pod.
func MutatingConfiguration(o ConfigurationOptions) *admissionregistrationv1.MutatingWebhookConfiguration {
	return &admissionregistrationv1.MutatingWebhookConfiguration{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "MutatingWebhookConfiguration"},
		ObjectMeta: metav1.ObjectMeta{Name: o.name(), Labels: map[string]string{"app.kubernetes.io/name": "partita"}},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name:                    WebhookMutatePods,
			ClientConfig:            o.client(PathMutatePods),
			Rules:                   podRules(false),
			FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
			MatchPolicy:             ptr.To(admissionregistrationv1.Equivalent),
			NamespaceSelector:       o.podNamespaceSelector(),
			ObjectSelector:          &metav1.LabelSelector{},
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			TimeoutSeconds:          ptr.To[int32](3),
			AdmissionReviewVersions: []string{"v1"},
			ReinvocationPolicy:      ptr.To(admissionregistrationv1.IfNeededReinvocationPolicy),
		}},
	}
}

// ValidatingConfiguration is the ValidatingWebhookConfiguration: pods
// (CREATE, UPDATE, ephemeral containers, bindings) and PodGroups (CREATE,
// UPDATE) failing closed outside the excluded namespaces, and policy
// ConfigMaps in Partita's namespace failing open (the loader refuses a bad
// policy anyway).
func ValidatingConfiguration(o ConfigurationOptions) *admissionregistrationv1.ValidatingWebhookConfiguration {
	return &admissionregistrationv1.ValidatingWebhookConfiguration{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingWebhookConfiguration"},
		ObjectMeta: metav1.ObjectMeta{Name: o.name(), Labels: map[string]string{"app.kubernetes.io/name": "partita"}},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{
			{
				Name:                    WebhookValidatePods,
				ClientConfig:            o.client(PathValidatePods),
				Rules:                   podRules(true),
				FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
				MatchPolicy:             ptr.To(admissionregistrationv1.Equivalent),
				NamespaceSelector:       o.podNamespaceSelector(),
				ObjectSelector:          &metav1.LabelSelector{},
				SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
				TimeoutSeconds:          ptr.To[int32](3),
				AdmissionReviewVersions: []string{"v1"},
			},
			{
				Name:         WebhookValidatePolicies,
				ClientConfig: o.client(PathValidatePolicies),
				Rules: []admissionregistrationv1.RuleWithOperations{{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
					Rule: admissionregistrationv1.Rule{
						APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"},
						Scope: ptr.To(admissionregistrationv1.NamespacedScope),
					},
				}},
				FailurePolicy: ptr.To(admissionregistrationv1.Ignore),
				MatchPolicy:   ptr.To(admissionregistrationv1.Equivalent),
				NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
					Key: labelNamespaceName, Operator: metav1.LabelSelectorOpIn, Values: []string{o.Namespace},
				}}},
				ObjectSelector:          &metav1.LabelSelector{MatchLabels: map[string]string{v1alpha1.LabelPolicy: policy.PolicyLabelValue}},
				SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
				TimeoutSeconds:          ptr.To[int32](3),
				AdmissionReviewVersions: []string{"v1"},
			},
			podGroupWebhook(o),
		},
	}
}

// podGroupWebhook validates PodGroups (CREATE, UPDATE) where the pod
// webhooks manage pods, failing closed as they do: a PodGroup moves its
// members' queue and priority, so it is checked against the same policy.
// Its status (the admission loop's) is a subresource and never sent.
func podGroupWebhook(o ConfigurationOptions) admissionregistrationv1.ValidatingWebhook {
	return admissionregistrationv1.ValidatingWebhook{
		Name:         WebhookValidatePodGroups,
		ClientConfig: o.client(PathValidatePodGroups),
		Rules: []admissionregistrationv1.RuleWithOperations{{
			Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
			Rule: admissionregistrationv1.Rule{
				APIGroups: []string{v1alpha1.GroupVersion.Group}, APIVersions: []string{v1alpha1.GroupVersion.Version}, Resources: []string{"podgroups"},
				Scope: ptr.To(admissionregistrationv1.NamespacedScope),
			},
		}},
		FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
		MatchPolicy:             ptr.To(admissionregistrationv1.Equivalent),
		NamespaceSelector:       o.podNamespaceSelector(),
		ObjectSelector:          &metav1.LabelSelector{},
		SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
		TimeoutSeconds:          ptr.To[int32](3),
		AdmissionReviewVersions: []string{"v1"},
	}
}

// Register creates or updates both configurations, and Partita's namespace
// if it does not exist. It is how a webhook outside the cluster (the dev
// cluster's) installs itself; in a cluster the chart installs them and
// cert-controller injects the CA. The namespace is read before it is
// created, and a configuration before it is written, so that an identity
// allowed only to read namespaces and update the configurations (the
// chart's webhook ServiceAccount, which the dev cluster uses) can register.
func Register(ctx context.Context, cs kubernetes.Interface, o ConfigurationOptions) error {
	nsAPI := cs.CoreV1().Namespaces()
	if _, err := nsAPI.Get(ctx, o.Namespace, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		if _, err := nsAPI.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: o.Namespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create namespace %s: %w", o.Namespace, err)
		}
	} else if err != nil {
		return fmt.Errorf("get namespace %s: %w", o.Namespace, err)
	}
	mAPI := cs.AdmissionregistrationV1().MutatingWebhookConfigurations()
	m := MutatingConfiguration(o)
	if cur, err := mAPI.Get(ctx, m.Name, metav1.GetOptions{}); err == nil {
		m.ResourceVersion = cur.ResourceVersion
		if _, err := mAPI.Update(ctx, m, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("update MutatingWebhookConfiguration %s: %w", m.Name, err)
		}
	} else if _, err := mAPI.Create(ctx, m, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create MutatingWebhookConfiguration %s: %w", m.Name, err)
	}
	vAPI := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	v := ValidatingConfiguration(o)
	if cur, err := vAPI.Get(ctx, v.Name, metav1.GetOptions{}); err == nil {
		v.ResourceVersion = cur.ResourceVersion
		if _, err := vAPI.Update(ctx, v, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("update ValidatingWebhookConfiguration %s: %w", v.Name, err)
		}
	} else if _, err := vAPI.Create(ctx, v, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create ValidatingWebhookConfiguration %s: %w", v.Name, err)
	}
	return nil
}

// probeFraction is the bad request of the dry-run pod WaitForRegistration
// sends: a parser error, which the webhook refuses whoever asks.
const probeFraction = "2"

// WaitForRegistration returns once the API server calls the webhook: the
// API server picks up new configurations asynchronously, and a pod created
// before then would skip Partita. It sends a dry-run pod with an invalid GPU
// request into namespace until the webhook refuses it.
func WaitForRegistration(ctx context.Context, cs kubernetes.Interface, namespace string, timeout time.Duration) error {
	probe := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "partita-webhook-probe-", Namespace: namespace,
			Annotations: map[string]string{v1alpha1.AnnotationGPUFraction: probeFraction}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "probe", Image: "registry.k8s.io/pause:3.10"}}},
	}
	var last error
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		_, err := cs.CoreV1().Pods(namespace).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil && strings.Contains(err.Error(), v1alpha1.AnnotationGPUFraction) {
			return true, nil
		}
		last = err
		if last == nil {
			last = errors.New("the API server admitted a pod the webhook refuses")
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("wait for the API server to call the webhook: %w (last: %w)", err, last)
	}
	return nil
}
