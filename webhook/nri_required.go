package webhook

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"

	"github.com/partita-dev/partita/gpu"
)

// NRIPluginName is the name the agent registers under as the container
// runtime's NRI plugin (nodeagent/nri.PluginName).
const NRIPluginName = "partita"

// nriRequiredPrefix starts NRI's per-container annotation naming the plugins
// that must take part in creating the container: with the runtime's NRI
// default validator on (containerd's
// [plugins."io.containerd.nri.v1.nri".default_validator] enable = true),
// the runtime refuses to create a container that one of them did not see.
// The webhook names Partita's plugin for every GPU container, so that a GPU
// container is never created while the agent is down without the devices,
// limits and mounts it decides (a hami-core slice without its interposer,
// a slice without its dmem cap). Without the validator the annotation is
// inert.
const nriRequiredPrefix = "required-plugins.noderesource.dev/container."

// requireNRIPlugin names Partita's plugin among the required NRI plugins of
// each GPU container of req, keeping any others the pod names.
func requireNRIPlugin(pod *corev1.Pod, req *gpu.PodRequest) error {
	if req == nil {
		return nil
	}
	for _, c := range req.Containers {
		key := nriRequiredPrefix + c.Name
		var plugins []string
		if v, ok := pod.Annotations[key]; ok {
			if err := yaml.Unmarshal([]byte(v), &plugins); err != nil {
				return &DenialError{Reason: ReasonInvalidRequest, Errs: field.ErrorList{field.Invalid(annotationsPath().Key(key), v,
					"must be a YAML list of NRI plugin names, as the container runtime reads it")}}
			}
		}
		if !slices.Contains(plugins, NRIPluginName) {
			plugins = append(plugins, NRIPluginName)
		}
		if pod.Annotations == nil {
			pod.Annotations = map[string]string{}
		}
		pod.Annotations[key] = nriPluginList(plugins)
	}
	return nil
}

// nriPluginList writes plugin names as the flow-style YAML list NRI reads.
func nriPluginList(plugins []string) string {
	quoted := make([]string, len(plugins))
	for i, p := range plugins {
		quoted[i] = fmt.Sprintf("%q", p)
	}
	return "[" + strings.Join(quoted, ",") + "]"
}

// changedNRIRequirements refuses an update that changes or removes the
// required NRI plugins of a GPU container (one of gpuContainers): without
// them, a runtime with NRI's validator could create the container while
// the agent is down.
func changedNRIRequirements(old, updated map[string]string, gpuContainers []string) field.ErrorList {
	var errs field.ErrorList
	for _, c := range gpuContainers {
		key := nriRequiredPrefix + c
		ov, hadOld := old[key]
		nv, hasNew := updated[key]
		if hadOld == hasNew && ov == nv {
			continue
		}
		errs = append(errs, field.Forbidden(annotationsPath().Key(key),
			"names the NRI plugins that must create this GPU container (Partita's among them); it is fixed when the pod is created"))
	}
	return errs
}
