package webhook

import (
	"fmt"
	"strings"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
)

// The CEL of the admission policies (policies.go) and of the webhooks'
// matchConditions (configurations.go). Every key, path and message comes
// from the constants the parser and the webhook use, so the rules the API
// server runs cannot drift from the ones the webhook runs; each helper
// returns one parenthesised expression.

// celStr quotes s as a CEL string literal.
func celStr(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}

// celStrs is a CEL list of string literals.
func celStrs[S ~string](ss []S) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = celStr(string(s))
	}
	return "[" + strings.Join(q, ", ") + "]"
}

func celAnnotations(o string) string { return o + ".metadata.?annotations.orValue({})" }
func celLabels(o string) string      { return o + ".metadata.?labels.orValue({})" }
func celLimits(c string) string      { return c + ".?resources.?limits.orValue({})" }
func celRequests(c string) string    { return c + ".?resources.?requests.orValue({})" }
func celEnv(c string) string         { return c + ".?env.orValue([])" }
func celInitContainers(o string) string {
	return o + ".spec.?initContainers.orValue([])"
}

// celAsksResource: container c asks for one of names with a quantity that
// is not zero (gpu.ParsePod counts a zero as unset).
func celAsksResource(c string, names string) string {
	one := func(l string) string {
		return fmt.Sprintf("%s.exists(r, r in %s && quantity(string(%s[r])).compareTo(quantity('0')) != 0)", l, names, l)
	}
	return "(" + one(celLimits(c)) + " || " + one(celRequests(c)) + ")"
}

// celTouchesPartita: pod o carries any of Partita's keys (partita.dev/...),
// another dialect's request, queue or gang key, or asks for a GPU resource:
// the pods the webhook is called for.
func celTouchesPartita(o string) string {
	res := celStrs(gpu.ResourceNames())
	return fmt.Sprintf("(%s.exists(k, k.startsWith(%s) || k in %s) || %s.exists(k, k.startsWith(%s) || k in %s) || %s.spec.containers.exists(c, %s) || %s.exists(c, %s))",
		celAnnotations(o), celStr(v1alpha1.GroupVersion.Group+"/"), celStrs(gpu.ForeignAnnotations()),
		celLabels(o), celStr(v1alpha1.GroupVersion.Group+"/"), celStrs(gpu.ForeignLabels()),
		o, celAsksResource("c", res), celInitContainers(o), celAsksResource("c", res))
}

// celUsesClaims: pod o has pod claims, or a container asks for an extended
// resource a DeviceClass may back (dra.HasClaims): the mutating webhook
// reads its claims, to gate those that ask for GPUs (pod_claims.go).
func celUsesClaims(o string) string {
	return "(" + o + ".spec.?resourceClaims.orValue([]).size() > 0 || " + o + ".spec.containers.exists(c, " + celRequests("c") +
		`.exists(r, r.contains('/') && (!r.matches('^([^/]*[.])?kubernetes[.]io/') || r.startsWith('deviceclass.resource.kubernetes.io/')))))`
}

// celAsksGPU: pod o asks for GPUs, as gpu.ParsePod reads it (a request
// annotation whatever its value, or a GPU resource that is not zero, init
// containers included since ParsePod refuses those).
func celAsksGPU(o string) string {
	res := celStrs(gpu.ResourceNames())
	return fmt.Sprintf("(%s.exists(k, k in %s) || %s.spec.containers.exists(c, %s) || %s.exists(c, %s))",
		celAnnotations(o), celStrs(gpu.RequestAnnotations()), o, celAsksResource("c", res), celInitContainers(o), celAsksResource("c", res))
}

// celIsGPUContainer: container c got partita.dev/gpu-milli from the
// webhook, or in dra mode one of Partita's pod claims (or claims it did).
func celIsGPUContainer(c string) string {
	return "(" + celStr(string(v1alpha1.ResourceGPUMilli)) + " in " + celLimits(c) + " || " + celUsesPartitaClaim(c) + ")"
}

// celUsesPartitaClaim: container c uses one of Partita's pod claims
// (v1alpha1.PodClaimPrefix), as the webhook writes in dra mode.
func celUsesPartitaClaim(c string) string {
	return "(" + c + ".?resources.?claims.orValue([]).exists(r, r.name.startsWith(" + celStr(v1alpha1.PodClaimPrefix) + ")))"
}

// celIsSystemAnnotation: annotation key k is written only by Partita.
func celIsSystemAnnotation(k string) string {
	keys := v1alpha1.SystemAnnotationKeys()
	parts := []string{k + " in " + celStrs(keys[:])}
	for _, p := range v1alpha1.SystemAnnotationPrefixes() {
		parts = append(parts, k+".startsWith("+celStr(p)+")")
	}
	return "(" + strings.Join(parts, " || ") + ")"
}

// celSystemAnnotationMessage is systemAnnotationMessage for key k.
func celSystemAnnotationMessage(k string) string {
	var bind []string
	for _, p := range []string{v1alpha1.AnnotationDevicesPrefix, v1alpha1.AnnotationMemLimitPrefix, v1alpha1.AnnotationSMLimitPrefix} {
		bind = append(bind, k+".startsWith("+celStr(p)+")")
	}
	bind = append(bind, k+" == "+celStr(v1alpha1.AnnotationNode))
	return fmt.Sprintf("(%s ? %s : %s)", strings.Join(bind, " || "), celStr(systemAnnotationBindText), celStr(systemAnnotationLoopText))
}

// celTrusted: the requester is one of Partita's identities (id).
func celTrusted(id Identities) string {
	var parts []string
	if len(id.Users) > 0 {
		parts = append(parts, "request.userInfo.?username.orValue('') in "+celStrs(id.Users))
	}
	if len(id.Groups) > 0 {
		parts = append(parts, "request.userInfo.?groups.orValue([]).exists(g, g in "+celStrs(id.Groups)+")")
	}
	if len(parts) == 0 {
		return "false"
	}
	return "(" + strings.Join(parts, " || ") + ")"
}

// celNotMirrorPod: the request is not a kubelet creating (or updating) the
// API copy of a static pod, which the webhook leaves alone too (isMirrorPod).
func celNotMirrorPod() string {
	return fmt.Sprintf("!(request.userInfo.?username.orValue('').startsWith('system:node:') && %s in %s)",
		celStr("kubernetes.io/config.mirror"), celAnnotations("object"))
}

// celNodePath is path p normalised as nodePath does, but for "..", which
// the API server refuses in a hostPath before a policy sees it. ([x].map(v,
// ...)[0] binds x to v once.)
func celNodePath(p string) string {
	return fmt.Sprintf("[%s.split('/').filter(s, s != '' && s != '.')].map(p, p.size() >= 2 && p[0] == 'var' && p[1] == 'run' ? '/run' + p.slice(2, p.size()).map(s, '/' + s).join() : '/' + p.join('/'))[0]", p)
}

// celAncestorOrSelf and celBeneath are ancestorOrSelf and beneath.
func celAncestorOrSelf(n, dir string) string {
	return fmt.Sprintf("(%s == '/' || %s == %s || %s.startsWith(%s + '/'))", n, n, dir, dir, n)
}

func celBeneath(n, dir string) string { return fmt.Sprintf("%s.startsWith(%s + '/')", n, dir) }

// celHostPathReach is hostPathReach of node path n ("" for nothing).
func celHostPathReach(n, mpsDir string) string {
	dev := fmt.Sprintf("(%s || %s.startsWith(%s) || %s == %s || %s)",
		celAncestorOrSelf(n, celStr(devDir)), n, celStr(devNVIDIAPrefix), n, celStr(devCharDir), celBeneath(n, celStr(devCharDir)))
	mps := "(" + celAncestorOrSelf(n, mpsDir) + " || " + celBeneath(n, mpsDir) + ")"
	nv := "(" + celAncestorOrSelf(n, celStr(nvidiaRunDir)) + " || " + celBeneath(n, celStr(nvidiaRunDir)) + ")"
	state := "(" + celAncestorOrSelf(n, celStr(partitaStateDir)) + " || " + celBeneath(n, celStr(partitaStateDir)) + ")"
	return fmt.Sprintf("(%s ? %s : %s ? %s + ' (' + %s + ')' : %s ? %s : %s ? %s : '')",
		dev, celStr(reachDevicesText), mps, celStr(reachMPSText), mpsDir, nv, celStr(reachNVIDIAText), state, celStr(reachStateText))
}

// celReachesContainerDevices is reachesContainerDevices of path p.
func celReachesContainerDevices(p string) string {
	return fmt.Sprintf("(['/' + %s.split('/').filter(s, s != '' && s != '.').join('/') + '/'].exists(n, n.startsWith(%s) || n.startsWith(%s)) || (%s.split('/').exists(s, s == '..') && %s.contains('nvidia-container-devices')))",
		p, celStr(containerDevicesDir+"/"), celStr(containerDevicesDirRun+"/"), p, p)
}

// celIsPartitaMPSVolume is isPartitaMPSVolume of volume v.
func celIsPartitaMPSVolume(v, mpsDir string) string {
	return fmt.Sprintf("(%s.name == %s && has(%s.hostPath) && %s.hostPath.path == %s && %s.hostPath.?type.orValue('') == %s)",
		v, celStr(MPSVolume), v, v, mpsDir, v, celStr(string(*mpsVolume("/").HostPath.Type)))
}

// celIsMPSMount is isMPSMount of mount m.
func celIsMPSMount(m string) string {
	return fmt.Sprintf("(%s.mountPath == %s && %s.?subPathExpr.orValue('') == %s && %s.?subPath.orValue('') == '' && !%s.?readOnly.orValue(false) && !has(%s.recursiveReadOnly) && %s.?mountPropagation.orValue('None') == 'None')",
		m, celStr(MPSPipeMountPath), m, celStr(mpsSubPathExpr), m, m, m, m)
}

// celIsDeviceEnv is isDeviceEnv of variable name n.
func celIsDeviceEnv(n string) string {
	return fmt.Sprintf("(%s in %s || %s.startsWith(%s) || %s.startsWith(%s))",
		n, celStrs([]string{EnvVisibleDevices, EnvPartitaDevice}), n, celStr(envPrefixMPS), n, celStr(envPrefixDevice))
}

// celAnnotationRef: env e reads annotation prefix+<container c's name>
// through the downward API, and nothing else.
func celAnnotationRef(e, c, prefix string) string {
	return fmt.Sprintf("(%s.?value.orValue('') == '' && %s.?valueFrom.?fieldRef.?fieldPath.orValue('') == %s + %s.name + %s)",
		e, e, celStr("metadata.annotations['"+prefix), c, celStr("']"))
}

// celVoidForm: env e is NVIDIA_VISIBLE_DEVICES=void.
func celVoidForm(e string) string {
	return fmt.Sprintf("(%s.name == %s && %s.?value.orValue('') == %s && !has(%s.valueFrom))",
		e, celStr(EnvVisibleDevices), e, celStr(VisibleDevicesVoid), e)
}

// celGPUEnvForm: env e of GPU container c has its gpuEnvForms form.
func celGPUEnvForm(e, c string) string {
	var parts []string
	for _, f := range gpuEnvForms() {
		if f.refPrefix != "" {
			parts = append(parts, fmt.Sprintf("(%s.name == %s && %s)", e, celStr(f.name), celAnnotationRef(e, c, f.refPrefix)))
		} else {
			parts = append(parts, fmt.Sprintf("(%s.name == %s && %s.?value.orValue('') == %s && !has(%s.valueFrom))", e, celStr(f.name), e, celStr(f.value), e))
		}
	}
	return "(" + strings.Join(parts, " || ") + ")"
}

// celShorten is shorten (for ASCII values).
func celShorten(v string) string {
	return fmt.Sprintf("(%s.size() > 64 ? %s.substring(0, 64) + '...' : %s)", v, v, v)
}

// celEnvWhat is the variable as deviceEnvMessage names it.
func celEnvWhat(e string) string {
	return fmt.Sprintf("%s.name + (%s.?value.orValue('') != '' ? '=\"' + %s + '\"' : '')", e, e, celShorten(e+".value"))
}

// ctrList is one of a pod's container lists, as the policy rules walk it.
type ctrList struct {
	// expr is the list in CEL, path its field path.
	expr, path string
	// kind is how deviceEnvMessage speaks of its containers; kindGPU
	// means "GPU or plain, by partita.dev/gpu-milli".
	kind containerKind
	// newOnly: only the containers that oldObject lacks (ephemeral ones).
	newOnly bool
}

// podLists are the container lists a pod CREATE brings.
func podLists() []ctrList {
	return []ctrList{
		{expr: "object.spec.containers", path: "spec.containers", kind: kindGPU},
		{expr: celInitContainers("object"), path: "spec.initContainers", kind: kindPlain},
	}
}

// ephemeralLists is what a pods/ephemeralcontainers UPDATE brings.
func ephemeralLists() []ctrList {
	return []ctrList{{expr: "object.spec.?ephemeralContainers.orValue([])", path: "spec.ephemeralContainers", kind: kindEphemeral, newOnly: true}}
}

// each maps every (new) container c at index i of l to a list of strings
// (expression body) and joins them.
func (l ctrList) each(body string) string {
	if l.newOnly {
		return fmt.Sprintf("%s.transformList(i, c, !(c.name in variables.oldEphemeralNames), %s).flatten()", l.expr, body)
	}
	return fmt.Sprintf("%s.transformList(i, c, %s).flatten()", l.expr, body)
}

// at is the field path of container i, then rest.
func (l ctrList) at(rest string) string {
	return celStr(l.path+"[") + " + string(i) + " + celStr("]"+rest)
}

// isGPU: container c of l is a GPU container.
func (l ctrList) isGPU() string {
	if l.kind == kindGPU {
		return celIsGPUContainer("c")
	}
	return "false"
}

// envErrors is deviceEnvErrors for l: each device variable not in its
// allowed form.
func (l ctrList) envErrors() string {
	allowed := celVoidForm("e")
	visible := celStr(envPlainText)
	switch l.kind {
	case kindGPU:
		allowed = fmt.Sprintf("(%s ? %s : %s)", l.isGPU(), celGPUEnvForm("e", "c"), celVoidForm("e"))
		visible = fmt.Sprintf("(%s ? %s : %s)", l.isGPU(), celStr(envGPUText), celStr(envPlainText))
	case kindEphemeral:
		visible = celStr(envEphemeralText)
	}
	// As deviceEnvMessage words it.
	tail := fmt.Sprintf("(e.name == %s ? %s : e.name != %s ? %s : %s)",
		celStr(EnvPartitaDevice), celStr(envGPUText), celStr(EnvVisibleDevices), celStr(envLimitText), visible)
	return l.each(fmt.Sprintf("%s.transformList(j, e, %s && !%s, %s + string(j) + %s + %s + %s)",
		celEnv("c"), celIsDeviceEnv("e.name"), allowed, l.at(".env["), celStr("]: Forbidden: "), celEnvWhat("e"), tail))
}

// voidMissing: a container without a GPU and without
// NVIDIA_VISIBLE_DEVICES (the mutating policy did not run on it).
func (l ctrList) voidMissing() string {
	return l.each(fmt.Sprintf("!%s && !%s.exists(e, e.name == %s) ? [%s + %s] : []",
		l.isGPU(), celEnv("c"), celStr(EnvVisibleDevices), l.at(".env: Required value: "), celStr(voidMissingText)))
}

// privileged: a privileged container (refused in a pod that asks for GPUs).
func (l ctrList) privileged() string {
	return l.each(fmt.Sprintf("c.?securityContext.?privileged.orValue(false) ? [%s + %s] : []",
		l.at(".securityContext.privileged: Forbidden: "), celStr(privilegedText)))
}

// mountErrors: mounts of MPSVolume other than Partita's, and mounts where
// the NVIDIA runtime reads device requests.
func (l ctrList) mountErrors() string {
	return l.each(fmt.Sprintf("c.?volumeMounts.orValue([]).transformList(j, m, (m.name == %s && !(%s && %s) ? [%s + string(j) + %s] : []) + (%s ? [%s + string(j) + %s + m.mountPath + %s] : [])).flatten()",
		celStr(MPSVolume), l.isGPU(), celIsMPSMount("m"), l.at(".volumeMounts["), celStr("]: Forbidden: "+mpsMountText),
		celReachesContainerDevices("m.mountPath"), l.at(".volumeMounts["), celStr(`].mountPath: Forbidden: "`), celStr(`"`+containerDevicesText)))
}

// joinLists concatenates the CEL lists of each l.
func joinLists(ls []ctrList, f func(ctrList) string) string {
	parts := make([]string, len(ls))
	for i, l := range ls {
		parts[i] = f(l)
	}
	return strings.Join(parts, " + ")
}
