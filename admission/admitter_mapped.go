package admission

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/admission/cycle"
	"github.com/partita-dev/partita/api/v1alpha1"
)

// The PodGroups of mapped workloads (docs/workloads.md): for every gang the
// workload map makes, the loop keeps a PodGroup of the gang's name, owned
// by the workload's top owner (so it goes when the workload goes), labelled
// partita.dev/workload-kind, whose spec says what the rule says (minMember,
// queue, priorityClassName) and whose status the loop writes as for an
// explicit gang; it shows the topology the rule asks (Partita's
// partita.dev/topology* annotations, whatever dialect the rule read) and
// the gang's sub-groups (spec.subGroups). The rule, not the PodGroup, is
// the truth for all of these: a tenant who edits the PodGroup changes
// nothing but the PodGroup, which is written again. The queue the rule names is taken only from the PodGroup,
// once it exists: creating it goes through the PodGroup webhook, which
// refuses a queue the namespace may not use.

// podGroupWrite is the last write of a mapped gang's PodGroup.
type podGroupWrite struct {
	// err is why the last write failed, for the gang's wait message.
	err string
	// next is when the next write may be tried.
	next time.Time
}

const (
	// podGroupRetry spaces writes after a failure.
	podGroupRetry = 30 * time.Second
	// podGroupSettle spaces writes after a success, until the informer
	// shows the result.
	podGroupSettle = 5 * time.Second
)

// keepMappedPodGroups creates or corrects the PodGroup of each mapped gang.
func (a *Admitter) keepMappedPodGroups(ctx context.Context, st *cycle.State, now time.Time) error {
	log := logr.FromContextOrDiscard(ctx)
	seen := map[cycle.WorkloadKey]bool{}
	var jobs []func() error
	for _, w := range st.Gangs {
		key := w.Key
		if key.Workload == "" {
			continue
		}
		seen[key] = true
		pw := a.podGroups[key]
		switch w.PodGroup {
		case cycle.PodGroupInSync:
			delete(a.podGroups, key)
			continue
		case cycle.PodGroupForeign:
			if pw.err == "" {
				log.Info("A PodGroup of a mapped workload's name exists that Partita did not make; leaving it alone",
					"podGroup", key.Namespace+"/"+key.Workload, "workload", w.Name())
			}
			a.podGroups[key] = podGroupWrite{err: fmt.Sprintf("PodGroup %s/%s exists and is not the one Partita keeps for %s", key.Namespace, key.Workload, w.Name())}
			continue
		}
		if now.Before(pw.next) {
			continue
		}
		want := mappedPodGroup(w)
		create := w.PodGroup == cycle.PodGroupMissing
		a.podGroups[key] = podGroupWrite{err: pw.err, next: now.Add(podGroupSettle)}
		jobs = append(jobs, func() error {
			var err error
			if create {
				err = a.statusClient().Create(ctx, want)
				if apierrors.IsAlreadyExists(err) {
					err = nil
				}
			} else {
				var patch []byte
				if patch, err = mappedPodGroupPatch(want); err == nil {
					err = a.statusClient().Patch(ctx, want, client.RawPatch(types.MergePatchType, patch))
				}
			}
			if err != nil {
				log.V(2).Info("Failed to write the PodGroup of a mapped workload", "podGroup", key.Namespace+"/"+key.Workload, "err", err.Error())
				return &podGroupError{key: key, err: err}
			}
			return nil
		})
	}
	for key := range a.podGroups {
		if !seen[key] {
			delete(a.podGroups, key)
		}
	}
	var out []error
	for _, err := range parallel(statusWorkers, jobs) {
		var pe *podGroupError
		if errors.As(err, &pe) {
			a.podGroups[pe.key] = podGroupWrite{err: truncate(pe.err.Error(), 512), next: now.Add(podGroupRetry)}
			if apierrors.IsForbidden(pe.err) || apierrors.IsInvalid(pe.err) || apierrors.IsBadRequest(pe.err) {
				// A refusal (the PodGroup webhook, RBAC) is the
				// workload's to fix and said in its wait message.
				continue
			}
		}
		out = append(out, err)
	}
	return errors.Join(out...)
}

type podGroupError struct {
	key cycle.WorkloadKey
	err error
}

func (e *podGroupError) Error() string {
	return fmt.Sprintf("write PodGroup %s/%s: %v", e.key.Namespace, e.key.Workload, e.err)
}

// mappedPodGroup is the PodGroup the loop keeps for a mapped gang.
func mappedPodGroup(w *cycle.Workload) *v1alpha1.PodGroup {
	pg := &v1alpha1.PodGroup{
		TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "PodGroup"},
		ObjectMeta: metav1.ObjectMeta{
			Namespace:   w.Key.Namespace,
			Name:        w.Key.Workload,
			Labels:      map[string]string{v1alpha1.LabelWorkloadKind: labelValue(w.Kind)},
			Annotations: map[string]string{v1alpha1.AnnotationWorkload: w.Kind + "/" + w.OwnerName},
		},
		Spec: v1alpha1.PodGroupSpec{
			MinMember: w.MinMember, Queue: w.RuleQueue, PriorityClassName: w.PriorityClassName,
			SubGroups: slices.Clone(w.RuleSubGroups),
		},
	}
	for k, v := range topologyAnnotations(w.RuleTopology) {
		if v != "" {
			pg.Annotations[k] = v
		}
	}
	if o := w.Owner; o.UID != "" {
		// Not a controller, and not blocking the owner's deletion (which
		// would need the right to update the owner's finalizers): garbage
		// collection removes the PodGroup after its owner.
		pg.OwnerReferences = []metav1.OwnerReference{{APIVersion: o.APIVersion, Kind: o.Kind, Name: o.Name, UID: o.UID}}
	}
	return pg
}

// topologyAnnotations are Partita's keys of a topology request, each with
// its value, empty for a level it does not ask.
func topologyAnnotations(r v1alpha1.TopologyRequest) map[string]string {
	return map[string]string{
		v1alpha1.AnnotationTopology:          r.Topology,
		v1alpha1.AnnotationTopologyRequired:  r.Required,
		v1alpha1.AnnotationTopologyPreferred: r.Preferred,
	}
}

// mappedPodGroupPatch is the JSON merge patch that makes a mapped gang's
// PodGroup say what pg says: pg itself, and a null for each topology key
// and for the sub-groups the rule no longer asks, which pg leaves out and
// a merge patch would otherwise keep.
func mappedPodGroupPatch(pg *v1alpha1.PodGroup) ([]byte, error) {
	b, err := json.Marshal(pg)
	if err != nil {
		return nil, fmt.Errorf("encode PodGroup: %w", err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("decode PodGroup: %w", err)
	}
	// metadata and spec are objects in any encoded PodGroup; annotations
	// may be left out.
	meta := m["metadata"].(map[string]any)
	ann, _ := meta["annotations"].(map[string]any)
	if ann == nil {
		ann = map[string]any{}
		meta["annotations"] = ann
	}
	for k := range topologyAnnotations(v1alpha1.TopologyRequest{}) {
		if _, ok := ann[k]; !ok {
			ann[k] = nil
		}
	}
	if len(pg.Spec.SubGroups) == 0 {
		m["spec"].(map[string]any)["subGroups"] = nil
	}
	return json.Marshal(m)
}

// labelValue is s cut to a valid label value ("Workload" when empty).
func labelValue(s string) string {
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s) && len(out) < 63; i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.' {
			out = append(out, c)
		}
	}
	for len(out) > 0 && !alnum(out[len(out)-1]) {
		out = out[:len(out)-1]
	}
	for len(out) > 0 && !alnum(out[0]) {
		out = out[1:]
	}
	if len(out) == 0 {
		return "Workload"
	}
	return string(out)
}

func alnum(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' }

// workloadAnnotations name a mapped gang's workload and PodGroup on its
// pods; nil for other workloads.
func workloadAnnotations(w *cycle.Workload) map[string]string {
	if w.Key.Workload == "" {
		return nil
	}
	return map[string]string{
		v1alpha1.AnnotationWorkload:         w.Kind + "/" + w.OwnerName,
		v1alpha1.AnnotationWorkloadPodGroup: w.Key.Workload,
	}
}

// missing is what of ann the pod does not carry yet; nil when it carries
// all of it.
func missing(pod *corev1.Pod, ann map[string]string) map[string]string {
	var out map[string]string
	for k, v := range ann {
		if pod.Annotations[k] != v {
			if out == nil {
				out = map[string]string{}
			}
			out[k] = v
		}
	}
	return out
}
