package webhook

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
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

// DefaultExcludedNamespaces are the namespaces beyond kube-system and
// Partita's own that Partita leaves alone unless told otherwise: the NVIDIA
// GPU Operator's, whose DaemonSets set NVIDIA_VISIBLE_DEVICES=all and mount
// the devices themselves.
func DefaultExcludedNamespaces() []string { return []string{"gpu-operator"} }

// ConfigurationOptions describe where the API server reaches the webhook,
// and what the admission policies repeat of the webhook's flags.
type ConfigurationOptions struct {
	// Name names both configurations (DefaultConfigurationName); the
	// policies are named after it (PodPolicyName, VoidPolicyName).
	Name string
	// Namespace is Partita's namespace: never blocked by the pod webhooks,
	// and the only namespace whose policy ConfigMaps load.
	Namespace string
	// ExcludedNamespaces are further namespaces the pod webhooks and
	// policies skip; kube-system always is.
	ExcludedNamespaces []string
	// NamespaceLabels, when set, limit the managed namespaces to those
	// with these labels (the chart's webhook.namespaceSelector).
	NamespaceLabels map[string]string
	// Service is the in-cluster Service of the webhook (its path is set
	// per webhook); exclusive with URL.
	Service *admissionregistrationv1.ServiceReference
	// URL is the webhook's base URL ("https://127.0.0.1:9443") when it runs
	// outside the cluster, as in the dev cluster.
	URL string
	// CABundle is the PEM CA that signed the serving certificate; with
	// cert-controller it is injected later.
	CABundle []byte
	// FailurePolicy is the validating pod webhook's (and, without
	// Policies, the mutating one's); Fail when nil.
	FailurePolicy *admissionregistrationv1.FailurePolicyType
	// Policies installs the admission policies (policies.go) beside the
	// webhooks, which then see only the pods that ask for GPUs or carry
	// Partita's keys, the mutating one failing open. Needs Kubernetes 1.36
	// or later.
	Policies bool
	// MPSDir, AdmissionGate and Trusted are the webhook's --mps-dir,
	// --admission-gate and trusted identities, which the policies' rules
	// and the validating webhook's matchConditions repeat.
	MPSDir        string
	AdmissionGate bool
	Trusted       Identities
	// SideEffects of the mutating pod webhook: with the dra GPU backend it
	// creates claim templates (NoneOnDryRun); None when empty.
	SideEffects admissionregistrationv1.SideEffectClass
}

// MutatingSideEffects are the mutating pod webhook's side effects for a
// GPU backend: the dra backend creates claim templates, except on dry runs.
func MutatingSideEffects(draBackend bool) admissionregistrationv1.SideEffectClass {
	if draBackend {
		return admissionregistrationv1.SideEffectClassNoneOnDryRun
	}
	return admissionregistrationv1.SideEffectClassNone
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

// podRules are the pod operations the mutating webhook (validating:
// false) or the validating webhook (true) sees.
func podRules(validating bool) []admissionregistrationv1.RuleWithOperations {
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
	if !validating {
		return []admissionregistrationv1.RuleWithOperations{
			rule(create, "pods"),
			rule(update, "pods/ephemeralcontainers"),
		}
	}
	return []admissionregistrationv1.RuleWithOperations{
		rule([]admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update}, "pods"),
		// The status subresource also takes labels and annotations.
		rule(update, "pods/ephemeralcontainers", "pods/status"),
		rule(create, "pods/binding"),
	}
}

func (o ConfigurationOptions) podNamespaceSelector() *metav1.LabelSelector {
	sel := &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
		Key: labelNamespaceName, Operator: metav1.LabelSelectorOpNotIn, Values: o.excluded(),
	}}}
	if len(o.NamespaceLabels) > 0 {
		sel.MatchLabels = o.NamespaceLabels
	}
	return sel
}

func (o ConfigurationOptions) failurePolicy() *admissionregistrationv1.FailurePolicyType {
	if o.FailurePolicy != nil {
		return ptr.To(*o.FailurePolicy)
	}
	return ptr.To(admissionregistrationv1.Fail)
}

// MutatingConfiguration is the MutatingWebhookConfiguration: pod CREATE
// and ephemeral containers outside the excluded namespaces, reinvoked when
// a later webhook changes the pod. With Policies it sees only pods that
// ask for GPUs or carry Partita's keys and fails open: the validating
// policy refuses a GPU pod it did not mutate.
func MutatingConfiguration(o ConfigurationOptions) *admissionregistrationv1.MutatingWebhookConfiguration {
	wh := admissionregistrationv1.MutatingWebhook{
		Name:                    WebhookMutatePods,
		ClientConfig:            o.client(PathMutatePods),
		Rules:                   podRules(false),
		FailurePolicy:           o.failurePolicy(),
		MatchPolicy:             ptr.To(admissionregistrationv1.Equivalent),
		NamespaceSelector:       o.podNamespaceSelector(),
		ObjectSelector:          &metav1.LabelSelector{},
		SideEffects:             ptr.To(cmp.Or(o.SideEffects, admissionregistrationv1.SideEffectClassNone)),
		TimeoutSeconds:          ptr.To[int32](3),
		AdmissionReviewVersions: []string{"v1"},
		ReinvocationPolicy:      ptr.To(admissionregistrationv1.IfNeededReinvocationPolicy),
	}
	if o.Policies {
		wh.FailurePolicy = ptr.To(admissionregistrationv1.Ignore)
		wh.MatchConditions = mutateMatchConditions()
	}
	return &admissionregistrationv1.MutatingWebhookConfiguration{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "MutatingWebhookConfiguration"},
		ObjectMeta: metav1.ObjectMeta{Name: o.name(), Labels: map[string]string{"app.kubernetes.io/name": "partita"}},
		Webhooks:   []admissionregistrationv1.MutatingWebhook{wh},
	}
}

// ValidatingConfiguration is the ValidatingWebhookConfiguration: the pod
// webhook, the policy ConfigMap webhook and the PodGroup webhook.
func ValidatingConfiguration(o ConfigurationOptions) *admissionregistrationv1.ValidatingWebhookConfiguration {
	return &admissionregistrationv1.ValidatingWebhookConfiguration{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingWebhookConfiguration"},
		ObjectMeta: metav1.ObjectMeta{Name: o.name(), Labels: map[string]string{"app.kubernetes.io/name": "partita"}},
		Webhooks:   []admissionregistrationv1.ValidatingWebhook{o.podValidatingWebhook(), o.policyValidatingWebhook(), podGroupWebhook(o)},
	}
}

// podValidatingWebhook checks pods (CREATE, UPDATE, status, ephemeral
// containers, bindings) outside the excluded namespaces, failing closed by
// default. Its matchConditions spare Partita's identities, the kubelet's
// status updates and bindings without system keys, and, with Policies,
// pods that have nothing of Partita's.
func (o ConfigurationOptions) podValidatingWebhook() admissionregistrationv1.ValidatingWebhook {
	return admissionregistrationv1.ValidatingWebhook{
		Name:                    WebhookValidatePods,
		ClientConfig:            o.client(PathValidatePods),
		Rules:                   podRules(true),
		FailurePolicy:           o.failurePolicy(),
		MatchPolicy:             ptr.To(admissionregistrationv1.Equivalent),
		NamespaceSelector:       o.podNamespaceSelector(),
		ObjectSelector:          &metav1.LabelSelector{},
		SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
		TimeoutSeconds:          ptr.To[int32](3),
		AdmissionReviewVersions: []string{"v1"},
		MatchConditions:         append(o.notTrusted(), validateMatchConditions(o.Policies)...),
	}
}

// policyValidatingWebhook checks policy ConfigMaps in Partita's namespace,
// failing open (the loader refuses a bad policy anyway).
func (o ConfigurationOptions) policyValidatingWebhook() admissionregistrationv1.ValidatingWebhook {
	return admissionregistrationv1.ValidatingWebhook{
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
	}
}

// podGroupWebhook validates PodGroups (CREATE, UPDATE) where the pod
// webhooks manage pods, failing as the pod validating webhook does (closed
// by default): a PodGroup moves its
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
		FailurePolicy:           o.failurePolicy(),
		MatchPolicy:             ptr.To(admissionregistrationv1.Equivalent),
		NamespaceSelector:       o.podNamespaceSelector(),
		ObjectSelector:          &metav1.LabelSelector{},
		SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
		TimeoutSeconds:          ptr.To[int32](3),
		AdmissionReviewVersions: []string{"v1"},
	}
}

// Register creates or updates both configurations, and with Policies the
// admission policies and their bindings (without, it deletes them), and
// Partita's namespace if it does not exist. It is how a webhook outside the
// cluster (the dev cluster's) installs itself; in a cluster the chart
// installs them and cert-controller injects the CA. The namespace is read
// before it is created, and each object before it is written, so that an
// identity allowed only to read namespaces and update the configurations
// (the chart's webhook ServiceAccount, which the dev cluster uses) can
// register.
func Register(ctx context.Context, cs kubernetes.Interface, o ConfigurationOptions) error {
	nsAPI := cs.CoreV1().Namespaces()
	if _, err := nsAPI.Get(ctx, o.Namespace, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		if _, err := nsAPI.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: o.Namespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create namespace %s: %w", o.Namespace, err)
		}
	} else if err != nil {
		return fmt.Errorf("get namespace %s: %w", o.Namespace, err)
	}
	ar := cs.AdmissionregistrationV1()
	// The policies go first: the webhooks' matchConditions rely on them.
	steps := []func() error{
		func() error { return apply(ctx, ar.ValidatingAdmissionPolicies(), ValidatingPolicy(o), o.Policies) },
		func() error {
			return apply(ctx, ar.ValidatingAdmissionPolicyBindings(), ValidatingPolicyBinding(o), o.Policies)
		},
		func() error { return apply(ctx, ar.MutatingAdmissionPolicies(), MutatingPolicy(o), o.Policies) },
		func() error {
			return apply(ctx, ar.MutatingAdmissionPolicyBindings(), MutatingPolicyBinding(o), o.Policies)
		},
		func() error { return apply(ctx, ar.MutatingAdmissionPolicies(), SealPolicy(o), o.Policies) },
		func() error {
			return apply(ctx, ar.MutatingAdmissionPolicyBindings(), SealPolicyBinding(o), o.Policies)
		},
		func() error { return apply(ctx, ar.MutatingWebhookConfigurations(), MutatingConfiguration(o), true) },
		func() error {
			return apply(ctx, ar.ValidatingWebhookConfigurations(), ValidatingConfiguration(o), true)
		},
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return err
		}
	}
	return nil
}

// objectClient is the part of a typed client that apply uses.
type objectClient[T any] interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (T, error)
	Create(ctx context.Context, obj T, opts metav1.CreateOptions) (T, error)
	Update(ctx context.Context, obj T, opts metav1.UpdateOptions) (T, error)
	Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error
}

// apply creates or replaces obj when want, and deletes it otherwise.
func apply[T interface {
	metav1.Object
	runtime.Object
}](ctx context.Context, c objectClient[T], obj T, want bool) error {
	kind := obj.GetObjectKind().GroupVersionKind().Kind
	if !want {
		if err := c.Delete(ctx, obj.GetName(), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete %s %s: %w", kind, obj.GetName(), err)
		}
		return nil
	}
	cur, err := c.Get(ctx, obj.GetName(), metav1.GetOptions{})
	switch {
	case err == nil:
		obj.SetResourceVersion(cur.GetResourceVersion())
		if _, err := c.Update(ctx, obj, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("update %s %s: %w", kind, obj.GetName(), err)
		}
	case apierrors.IsNotFound(err):
		if _, err := c.Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create %s %s: %w", kind, obj.GetName(), err)
		}
	default:
		return fmt.Errorf("get %s %s: %w", kind, obj.GetName(), err)
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

// WaitForPolicies returns once the API server applies the admission
// policies, which it also picks up asynchronously: a dry-run pod without a
// GPU comes back with NVIDIA_VISIBLE_DEVICES=void and without the seal it
// was sent with, and one that sets NVIDIA_VISIBLE_DEVICES=all is refused
// by the validating policy.
func WaitForPolicies(ctx context.Context, cs kubernetes.Interface, namespace string, timeout time.Duration) error {
	probe := func(env []corev1.EnvVar) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "partita-policy-probe-", Namespace: namespace},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "probe", Image: "registry.k8s.io/pause:3.10", Env: env}}},
		}
	}
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	var last error
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		sealed := probe(nil)
		sealed.Annotations = map[string]string{v1alpha1.AnnotationCanonical: sealOf(sealed)}
		got, err := cs.CoreV1().Pods(namespace).Create(ctx, sealed, dry)
		if err != nil {
			last = fmt.Errorf("a pod without a GPU was refused: %w", err)
			return false, nil
		}
		if env := got.Spec.Containers[0].Env; len(env) != 1 || env[0].Name != EnvVisibleDevices || env[0].Value != VisibleDevicesVoid {
			last = fmt.Errorf("a pod without a GPU came back with env %v, not %s=%s", env, EnvVisibleDevices, VisibleDevicesVoid)
			return false, nil
		}
		if v, ok := got.Annotations[v1alpha1.AnnotationCanonical]; ok {
			last = fmt.Errorf("a pod created with %s=%q kept it: the seal policy does not run yet", v1alpha1.AnnotationCanonical, v)
			return false, nil
		}
		_, err = cs.CoreV1().Pods(namespace).Create(ctx, probe([]corev1.EnvVar{{Name: EnvVisibleDevices, Value: "all"}}), dry)
		switch {
		case err == nil:
			last = fmt.Errorf("a pod with %s=all was admitted: the validating policy does not run yet", EnvVisibleDevices)
			return false, nil
		case !strings.Contains(err.Error(), "ValidatingAdmissionPolicy"):
			last = fmt.Errorf("a pod with %s=all was refused, but not by the validating policy: %w", EnvVisibleDevices, err)
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("wait for the API server to apply the admission policies: %w (last: %w)", err, last)
	}
	return nil
}
