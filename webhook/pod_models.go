package webhook

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// maxModelsPerPod bounds partita.dev/model: each model is a volume and a
// mount in every container.
const maxModelsPerPod = 8

var modelAnnotationPath = field.NewPath("metadata", "annotations").Key(v1alpha1.AnnotationModel)

// parseModelNames splits partita.dev/model into Model names, or says what is
// wrong with it. A name of another namespace ("ns/name") is refused: a pod
// reads only its own namespace's models.
func parseModelNames(pod *corev1.Pod) ([]string, field.ErrorList) {
	raw, ok := pod.Annotations[v1alpha1.AnnotationModel]
	if !ok {
		return nil, nil
	}
	var names []string
	var errs field.ErrorList
	for _, n := range strings.Split(raw, ",") {
		n = strings.TrimSpace(n)
		switch {
		case n == "":
			errs = append(errs, field.Invalid(modelAnnotationPath, raw, "want Model names of the pod's namespace, comma-separated, none empty"))
			return nil, errs
		case strings.Contains(n, "/"):
			errs = append(errs, field.Forbidden(modelAnnotationPath, fmt.Sprintf("%q names a Model of another namespace: a pod may only use the Models of its own namespace (%s)", n, pod.Namespace)))
			continue
		}
		if msgs := validation.IsDNS1123Subdomain(n); len(msgs) > 0 {
			errs = append(errs, field.Invalid(modelAnnotationPath, n, "not a Model name: "+strings.Join(msgs, "; ")))
			continue
		}
		if !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	if len(names) > maxModelsPerPod {
		errs = append(errs, field.TooMany(modelAnnotationPath, len(names), maxModelsPerPod))
	}
	return names, errs
}

// modelVolumeName is the volume the webhook adds for model: a DNS label,
// unique per model name.
func modelVolumeName(model string) string {
	name := v1alpha1.ModelVolumePrefix + model
	if len(name) <= validation.DNS1123LabelMaxLength && !strings.Contains(model, ".") {
		return name
	}
	sum := sha256.Sum256([]byte(model))
	short := strings.ReplaceAll(model, ".", "-")
	if len(short) > 30 {
		short = short[:30]
	}
	return v1alpha1.ModelVolumePrefix + strings.TrimRight(short, "-") + "-" + hex.EncodeToString(sum[:4])
}

// withModels gives pod what partita.dev/model asks for: per Model (which
// must exist in the pod's namespace), an inline volume of the node's model
// cache (with the Model's Secret for the kubelet to hand over) mounted
// read-only at /models/NAME in every container, and PARTITA_MODEL_DIR. The
// kubelet starts no container before the cache has published the files.
func (a *PodAdmission) withModels(ctx context.Context, pod *corev1.Pod) (*corev1.Pod, error) {
	names, errs := parseModelNames(pod)
	if len(errs) > 0 {
		return nil, &DenialError{Reason: ReasonInvalidRequest, Errs: errs}
	}
	if len(names) == 0 {
		return pod, nil
	}
	if a.noModels {
		return nil, &DenialError{Reason: ReasonInvalidRequest, Errs: field.ErrorList{field.Forbidden(modelAnnotationPath,
			"this cluster runs no model cache (Partita's chart with modelCache.enabled=false): no node could mount the pod's models")}}
	}
	if a.refs == nil {
		return nil, &DenialError{Reason: ReasonNotFound, Errs: field.ErrorList{field.InternalError(modelAnnotationPath, fmt.Errorf("this webhook does not read Models"))}}
	}
	out := pod.DeepCopy()
	for _, name := range names {
		m := &v1alpha1.Model{}
		if err := a.refs.Get(ctx, client.ObjectKey{Namespace: pod.Namespace, Name: name}, m); err != nil {
			if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
				return nil, &DenialError{Reason: ReasonNotFound, Errs: field.ErrorList{field.NotFound(modelAnnotationPath, fmt.Sprintf("Model %q in namespace %q (kubectl get models -n %s)", name, pod.Namespace, pod.Namespace))}}
			}
			return nil, fmt.Errorf("read Model %s/%s: %w", pod.Namespace, name, err)
		}
		addModelVolume(out, m)
	}
	dir := v1alpha1.ModelMountRoot
	if len(names) == 1 {
		dir = path.Join(v1alpha1.ModelMountRoot, names[0])
	}
	for i := range out.Spec.Containers {
		addEnv(&out.Spec.Containers[i], []corev1.EnvVar{{Name: v1alpha1.EnvModelDir, Value: dir}})
	}
	for i := range out.Spec.InitContainers {
		addEnv(&out.Spec.InitContainers[i], []corev1.EnvVar{{Name: v1alpha1.EnvModelDir, Value: dir}})
	}
	return out, nil
}

func addModelVolume(pod *corev1.Pod, m *v1alpha1.Model) {
	vol := modelVolumeName(m.Name)
	if !slices.ContainsFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == vol }) {
		src := &corev1.CSIVolumeSource{
			Driver:           v1alpha1.ModelCSIDriver,
			ReadOnly:         ptr.To(true),
			VolumeAttributes: map[string]string{v1alpha1.ModelVolumeAttribute: m.Name},
		}
		if ref := m.Spec.Source.SecretRef; ref != nil && ref.Name != "" {
			src.NodePublishSecretRef = &corev1.LocalObjectReference{Name: ref.Name}
		}
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: vol, VolumeSource: corev1.VolumeSource{CSI: src}})
	}
	mountAt := path.Join(v1alpha1.ModelMountRoot, m.Name)
	mount := func(c *corev1.Container) {
		if slices.ContainsFunc(c.VolumeMounts, func(vm corev1.VolumeMount) bool { return vm.MountPath == mountAt || vm.Name == vol }) {
			return
		}
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: vol, MountPath: mountAt, ReadOnly: true})
	}
	for i := range pod.Spec.InitContainers {
		mount(&pod.Spec.InitContainers[i])
	}
	for i := range pod.Spec.Containers {
		mount(&pod.Spec.Containers[i])
	}
}

// checkModelVolumes refuses a new pod that asks for models but lacks their
// volumes: the mutating webhook (failing open) did not run, and its
// containers would start without their files.
func checkModelVolumes(pod *corev1.Pod) error {
	names, errs := parseModelNames(pod)
	if len(errs) > 0 {
		return &DenialError{Reason: ReasonInvalidRequest, Errs: errs}
	}
	for _, n := range names {
		if !slices.ContainsFunc(pod.Spec.Volumes, func(v corev1.Volume) bool {
			return v.CSI != nil && v.CSI.Driver == v1alpha1.ModelCSIDriver && v.CSI.VolumeAttributes[v1alpha1.ModelVolumeAttribute] == n
		}) {
			return &DenialError{Reason: ReasonNotCanonical, Messages: []string{fmt.Sprintf(
				"the pod asks for Model %q (%s) but has no volume of %s for it: it did not pass Partita's mutating webhook; create it again in a moment, and if this persists check Partita's webhook",
				n, v1alpha1.AnnotationModel, v1alpha1.ModelCSIDriver)}}
		}
	}
	return nil
}
