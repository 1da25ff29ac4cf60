package webhook

import (
	"slices"
	"strconv"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
)

// One admission round trip a GPU pod (issue 19). The mutating webhook
// already refuses everything the validating webhook would refuse of the
// pod it returns; the validating call on CREATE is there for a pod that
// did not get its mutation (the mutating webhook fails open) or that a
// later mutating webhook changed. So the mutating webhook seals the pod
// it returns, partita.dev/canonical: a summary of the fields the queues
// and the ledger read (queue, pod group, each container's gpu-milli, the
// request's annotations, the topology request and sub-group in every
// dialect), and the validating webhook's matchCondition
// skips a new pod whose seal the API server recomputes from the pod as it
// stands, after every mutation. A seal the pod was created with never
// reaches that check: the seal policy (a MutatingAdmissionPolicy, run
// before the mutating webhooks and never again) removes it, so a pod whose
// mutation failed carries none and meets the validating webhook, which
// fails closed. A later webhook that changes what the seal covers breaks
// it, and the pod meets the validating webhook too; what it does not
// cover (device env, mounts, privileged containers) the validating
// policy checks on every pod.

// sealVersion starts every seal, so that a future layout is told apart.
const sealVersion = "v1"

// sealedAnnotations are the annotations a seal covers, in its order: the
// request's canonical annotations (gpu.CanonicalRequestAnnotations, the
// topology request's included), a gang's size, and the other dialects'
// topology keys: the admission loop reads those where Partita's are
// absent, and ParsePod refuses them where they disagree, so a later
// webhook that adds or changes one must meet the validating webhook.
func sealedAnnotations() []string {
	canonical := gpu.CanonicalRequestAnnotations()
	keys := append(canonical[:], v1alpha1.AnnotationMinMember)
	for _, k := range gpu.TopologyAnnotations() {
		if !slices.Contains(keys, k) {
			keys = append(keys, k)
		}
	}
	return keys
}

// sealedLabels are the labels a seal covers beyond the queue and pod
// group, in its order: the sub-group in every dialect, for the same reason.
func sealedLabels() []string { return gpu.SubGroupLabels() }

// sealOf is the seal of pod as it stands: "v1;q=<queue>;g=<pod group>;
// s=<scheduler>;p=<preemption policy>;c=<container>:<gpu-milli>,...;
// a=<key>=<value>,...", containers then init containers, those with a
// gpu-milli limit only, then ";l=<key>=<value>,..." of sealedLabels when
// the pod has any (so that the seal of a pod without is as before them).
// celSealMatches computes the same in the API server. The scheduler name
// and preemption policy are the webhook's too (WithSchedulerName,
// WithPreemptionNever), and nothing else checks them.
func sealOf(pod *corev1.Pod) string {
	var b strings.Builder
	preemption := ""
	if pod.Spec.PreemptionPolicy != nil {
		preemption = string(*pod.Spec.PreemptionPolicy)
	}
	b.WriteString(sealVersion + ";q=" + pod.Labels[v1alpha1.LabelQueue] + ";g=" + pod.Labels[v1alpha1.LabelPodGroup] +
		";s=" + pod.Spec.SchedulerName + ";p=" + preemption + ";c=")
	first := true
	for _, list := range [][]corev1.Container{pod.Spec.Containers, pod.Spec.InitContainers} {
		for _, c := range list {
			q, ok := c.Resources.Limits[v1alpha1.ResourceGPUMilli]
			if !ok {
				continue
			}
			if !first {
				b.WriteByte(',')
			}
			first = false
			milli := "?"
			if v, ok := q.AsInt64(); ok {
				milli = strconv.FormatInt(v, 10)
			}
			b.WriteString(c.Name + ":" + milli)
		}
	}
	b.WriteString(";a=")
	first = true
	for _, k := range sealedAnnotations() {
		v, ok := pod.Annotations[k]
		if !ok {
			continue
		}
		if !first {
			b.WriteByte(',')
		}
		first = false
		b.WriteString(k + "=" + v)
	}
	first = true
	for _, k := range sealedLabels() {
		v, ok := pod.Labels[k]
		if !ok {
			continue
		}
		if first {
			b.WriteString(";l=")
		} else {
			b.WriteByte(',')
		}
		first = false
		b.WriteString(k + "=" + v)
	}
	return b.String()
}

// seal writes pod's seal into it.
func seal(pod *corev1.Pod) {
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[v1alpha1.AnnotationCanonical] = sealOf(pod)
}

// keepSeal makes want carry pod's seal, or none when pod has none.
func keepSeal(pod, want *corev1.Pod) {
	if v, ok := pod.Annotations[v1alpha1.AnnotationCanonical]; ok {
		if want.Annotations == nil {
			want.Annotations = map[string]string{}
		}
		want.Annotations[v1alpha1.AnnotationCanonical] = v
		return
	}
	delete(want.Annotations, v1alpha1.AnnotationCanonical)
}

// celSeal is sealOf in CEL, for the object o. A gpu-milli limit that is
// not an integer reads "?", as in sealOf.
func celSeal(o string) string {
	milli := "(isQuantity(string(m)) && quantity(string(m)).isInteger() ? string(quantity(string(m)).asInteger()) : '?')"
	ctrs := "(" + o + ".spec.?containers.orValue([]) + " + celInitContainers(o) + ")" +
		".filter(c, " + celStr(string(v1alpha1.ResourceGPUMilli)) + " in " + celLimits("c") + ")" +
		".map(c, [" + celLimits("c") + "[" + celStr(string(v1alpha1.ResourceGPUMilli)) + "]].map(m, c.name + ':' + " + milli + ")[0])" +
		".join(',')"
	anns := celStrs(sealedAnnotations()) + ".filter(k, k in " + celAnnotations(o) + ").map(k, k + '=' + " + celAnnotations(o) + "[k]).join(',')"
	// [x].map(l, ...)[0] binds the present labels to l once.
	labels := "[" + celStrs(sealedLabels()) + ".filter(k, k in " + celLabels(o) + ")].map(l, l.size() > 0 ? " + celStr(";l=") +
		" + l.map(k, k + '=' + " + celLabels(o) + "[k]).join(',') : '')[0]"
	return celStr(sealVersion+";q=") + " + " + celLabels(o) + celMapKey(v1alpha1.LabelQueue) + ".orValue('') + " +
		celStr(";g=") + " + " + celLabels(o) + celMapKey(v1alpha1.LabelPodGroup) + ".orValue('') + " +
		celStr(";s=") + " + " + o + ".spec.?schedulerName.orValue('') + " +
		celStr(";p=") + " + " + o + ".spec.?preemptionPolicy.orValue('') + " +
		celStr(";c=") + " + " + ctrs + " + " + celStr(";a=") + " + " + anns + " + " + labels
}

// celMapKey is the optional index [?'key'] of a map by a key that is no
// CEL identifier.
func celMapKey(key string) string { return "[" + "?" + celStr(key) + "]" }

// celSealMatches: o carries a seal, and it is o's. The seal is computed
// only for a pod that carries one: the matchCondition runs on every pod
// write the validating webhook could see, plain pods' creates included.
func celSealMatches(o string) string {
	key := celStr(v1alpha1.AnnotationCanonical)
	return "(" + key + " in " + celAnnotations(o) + " && " + celAnnotations(o) + "[" + key + "] == " + celSeal(o) + ")"
}

// sealedCreateMatchCondition skips the validating webhook for the creation
// of a pod that still agrees with its seal.
func sealedCreateMatchCondition() admissionregistrationv1.MatchCondition {
	return admissionregistrationv1.MatchCondition{
		Name: "not-sealed-by-partita",
		Expression: "!(request.operation == 'CREATE' && request.?subResource.orValue('') == '' && " +
			celSealMatches("object") + ")",
	}
}
