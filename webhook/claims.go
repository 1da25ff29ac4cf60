package webhook

import (
	"context"
	"fmt"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"

	corev1 "k8s.io/api/core/v1"

	"github.com/partita-dev/partita/dra"
	"github.com/partita-dev/partita/gpu"
)

// The dra GPU backend (docs/design.md, "GPU backends"): the webhook writes
// each GPU container a pod claim from Partita's claim template of its
// request (dra.ApplyClaims) instead of partita.dev/gpu-milli and the
// downward-API device env, and creates the template in the pod's namespace
// when it is missing (so the mutating webhook has side effects, skipped on
// dry runs: SideEffects NoneOnDryRun).

// TemplateStore creates and reads Partita's claim templates.
type TemplateStore interface {
	// Ensure makes sure t exists with its spec: it creates it when
	// missing, and refuses one of that name with another spec.
	Ensure(ctx context.Context, t *resourceapi.ResourceClaimTemplate) error
	// Get reads a template.
	Get(ctx context.Context, namespace, name string) (*resourceapi.ResourceClaimTemplate, error)
}

// ClientTemplates is a TemplateStore over a controller-runtime client
// (reads through the manager's cache, which watches only Partita's
// templates) and an API reader for cache misses.
type ClientTemplates struct {
	Client client.Client
	Live   client.Reader
}

// Get implements TemplateStore.
func (s ClientTemplates) Get(ctx context.Context, namespace, name string) (*resourceapi.ResourceClaimTemplate, error) {
	t := &resourceapi.ResourceClaimTemplate{}
	key := client.ObjectKey{Namespace: namespace, Name: name}
	err := s.Client.Get(ctx, key, t)
	if apierrors.IsNotFound(err) && s.Live != nil {
		err = s.Live.Get(ctx, key, t)
	}
	if err != nil {
		return nil, err
	}
	return t, nil
}

// Ensure implements TemplateStore.
func (s ClientTemplates) Ensure(ctx context.Context, want *resourceapi.ResourceClaimTemplate) error {
	got, err := s.Get(ctx, want.Namespace, want.Name)
	if apierrors.IsNotFound(err) {
		err = s.Client.Create(ctx, want.DeepCopy())
		if apierrors.IsAlreadyExists(err) {
			got, err = s.Get(ctx, want.Namespace, want.Name)
		} else if err == nil {
			return nil
		}
	}
	if err != nil {
		return fmt.Errorf("claim template %s/%s: %w", want.Namespace, want.Name, err)
	}
	return sameTemplate(got, want)
}

// sameTemplate refuses a template of Partita's name whose spec is not the
// one that name stands for.
func sameTemplate(got, want *resourceapi.ResourceClaimTemplate) error {
	if !equality.Semantic.DeepEqual(got.Spec.Spec, want.Spec.Spec) {
		return &DenialError{Reason: ReasonDeviceAccess, Messages: []string{fmt.Sprintf(
			"ResourceClaimTemplate %s/%s has the name of Partita's template for this request but asks for something else; "+
				"only Partita writes templates named %s*: delete it and create the pod again", got.Namespace, got.Name, dra.TemplatePrefix)}}
	}
	return nil
}

// WithGPUBackend sets the GPU backend; dra needs templates, where the
// webhook creates and checks Partita's claim templates.
func WithGPUBackend(b dra.Backend, templates TemplateStore) PodOption {
	return func(a *PodAdmission) { a.backend, a.templates = b, templates }
}

// canonicalDRA is pod as Partita writes it for req in dra mode, and the
// templates its claims need.
func (a *PodAdmission) canonicalDRA(pod *corev1.Pod, req *gpu.PodRequest) (*corev1.Pod, []*resourceapi.ResourceClaimTemplate, error) {
	out := gpu.ApplyCanonical(pod, req, a.cluster.ReferenceDeviceMemoryMiB())
	// GPU containers get their device env from the CDI spec of their
	// claim; the others, and init containers, void.
	gpuCtrs := gpuContainers(req)
	for i := range out.Spec.Containers {
		if _, ok := gpuCtrs[out.Spec.Containers[i].Name]; !ok {
			addEnv(&out.Spec.Containers[i], voidEnv())
		}
	}
	for i := range out.Spec.InitContainers {
		addEnv(&out.Spec.InitContainers[i], voidEnv())
	}
	out, templates, err := dra.ApplyClaims(out, req, a.cluster.MemorySizesMiB())
	if err != nil {
		return nil, nil, &DenialError{Reason: ReasonInvalidRequest, Errs: field.ErrorList{field.Invalid(field.NewPath("metadata", "annotations"), describeRequest(req), err.Error())}}
	}
	return out, templates, nil
}

func describeRequest(req *gpu.PodRequest) string {
	if req == nil || len(req.Containers) == 0 {
		return ""
	}
	c := req.Containers[0]
	if c.MemoryMiB > 0 {
		return fmt.Sprintf("%d x %dMi", c.Count, c.MemoryMiB)
	}
	return fmt.Sprintf("%d x %s GPU", c.Count, gpu.FormatMilli(c.Milli))
}

// ensureTemplates creates the templates a pod's claims need (not on a dry
// run: the pod is not stored either).
func (a *PodAdmission) ensureTemplates(ctx context.Context, dryRun bool, templates []*resourceapi.ResourceClaimTemplate) error {
	if dryRun || a.templates == nil {
		return nil
	}
	for _, t := range templates {
		if err := a.templates.Ensure(ctx, t); err != nil {
			return err
		}
	}
	return nil
}

// tolerateClaimDrift makes want name the templates pod names where they
// are Partita's for the same request and only the cluster's device sizes
// moved since the mutation; checkClaimTemplates then checks them.
func tolerateClaimDrift(pod, want *corev1.Pod) {
	for i := range want.Spec.ResourceClaims {
		w := &want.Spec.ResourceClaims[i]
		if w.ResourceClaimTemplateName == nil {
			continue
		}
		for _, g := range pod.Spec.ResourceClaims {
			if g.Name == w.Name && g.ResourceClaimTemplateName != nil &&
				templateShapePrefix(*g.ResourceClaimTemplateName) == templateShapePrefix(*w.ResourceClaimTemplateName) {
				name := *g.ResourceClaimTemplateName
				w.ResourceClaimTemplateName = &name
			}
		}
	}
}

// templateShapePrefix is a template's name without its content hash.
func templateShapePrefix(name string) string {
	if i := strings.LastIndexByte(name, '-'); i > 0 {
		return name[:i]
	}
	return name
}

// checkClaimTemplates checks that every template a dra-mode pod's Partita
// claims name is Partita's for the request: the one dra.Template writes
// for the device sizes it lists.
func (a *PodAdmission) checkClaimTemplates(ctx context.Context, pod *corev1.Pod, req *gpu.PodRequest) error {
	if req == nil || a.templates == nil {
		return nil
	}
	for _, c := range req.Containers {
		claim := dra.PodClaimName(c.Index)
		for _, rc := range pod.Spec.ResourceClaims {
			if rc.Name != claim || rc.ResourceClaimTemplateName == nil {
				continue
			}
			got, err := a.templates.Get(ctx, pod.Namespace, *rc.ResourceClaimTemplateName)
			if err != nil {
				return &DenialError{Reason: ReasonNotCanonical, Messages: []string{fmt.Sprintf(
					"the GPU claim %s names ResourceClaimTemplate %s/%s, which Partita cannot read (%v); create the pod again", claim, pod.Namespace, *rc.ResourceClaimTemplateName, err)}}
			}
			want, err := dra.Template(pod.Namespace, c, dra.TemplateSizes(got))
			if err != nil || want.Name != got.Name {
				return &DenialError{Reason: ReasonDeviceAccess, Messages: []string{fmt.Sprintf(
					"ResourceClaimTemplate %s/%s is not Partita's template for this pod's request: only Partita writes templates named %s*", pod.Namespace, got.Name, dra.TemplatePrefix)}}
			}
			if err := sameTemplate(got, want); err != nil {
				return err
			}
		}
	}
	return nil
}
