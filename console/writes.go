package console

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
)

// QueueInput is a queue's settings as the form sends them. On create,
// name is required and what is left out takes the Queue's defaults; on
// update, only what is given changes.
type QueueInput struct {
	// Name is the queue's name (create only).
	Name string `json:"name,omitempty"`
	// Parent is the parent queue, "" for a top-level queue.
	Parent *string `json:"parent,omitempty"`
	// Priority orders the queues of one parent.
	Priority *int32 `json:"priority,omitempty"`
	// Namespaces may submit to the queue.
	Namespaces *[]string `json:"namespaces,omitempty"`
	// Resources are gpu, cpu and memory.
	Resources map[string]ResourceInput `json:"resources,omitempty"`
	// ResourceVersion, on update, refuses the change if the queue changed
	// since it was read.
	ResourceVersion string `json:"resourceVersion,omitempty"`
}

// ResourceInput is one resource of a queue: quantities as Kubernetes
// writes them ("4", "0.5", "64Gi"), -1 for the whole capacity (quota) or
// no limit (limit).
type ResourceInput struct {
	Quota           *string `json:"quota,omitempty"`
	Limit           *string `json:"limit,omitempty"`
	OverQuotaWeight *int32  `json:"overQuotaWeight,omitempty"`
}

type queuePatchRequest struct {
	Name string `path:"name" json:"-"`
	QueueInput
}

// resourceQuota checks one resource's input and returns it as the CRD's.
func (r ResourceInput) resourceQuota(name string) (*v1alpha1.ResourceQuota, error) {
	out := &v1alpha1.ResourceQuota{OverQuotaWeight: r.OverQuotaWeight}
	parse := func(field string, s *string) (*resource.Quantity, error) {
		if s == nil {
			return nil, nil
		}
		q, err := resource.ParseQuantity(strings.TrimSpace(*s))
		if err != nil {
			return nil, badRequest("resources.%s.%s=%q is not a quantity (e.g. 4, 0.5, 64Gi, -1)", name, field, *s)
		}
		return &q, nil
	}
	var err error
	if out.Quota, err = parse("quota", r.Quota); err != nil {
		return nil, err
	}
	if out.Limit, err = parse("limit", r.Limit); err != nil {
		return nil, err
	}
	if r.OverQuotaWeight != nil && *r.OverQuotaWeight < 0 {
		return nil, badRequest("resources.%s.overQuotaWeight=%d: must be 0 or more", name, *r.OverQuotaWeight)
	}
	return out, nil
}

func checkResourceNames(in map[string]ResourceInput) error {
	for name := range in {
		if !slices.Contains(queueResourceNames(), corev1.ResourceName(name)) {
			return badRequest("resources.%s: a queue has gpu, cpu and memory", name)
		}
	}
	return nil
}

func handleCreateQueue(c *call) (any, error) {
	var in QueueInput
	if err := bind(c.r, &in); err != nil {
		return nil, err
	}
	if errs := validation.IsDNS1123Subdomain(in.Name); len(errs) > 0 {
		return nil, badRequest("name %q: %s", in.Name, strings.Join(errs, "; "))
	}
	if err := checkResourceNames(in.Resources); err != nil {
		return nil, err
	}
	q := &v1alpha1.Queue{ObjectMeta: metav1.ObjectMeta{Name: in.Name}}
	if in.Parent != nil {
		q.Spec.Parent = *in.Parent
	}
	q.Spec.Priority = in.Priority
	if in.Namespaces != nil {
		q.Spec.Namespaces = *in.Namespaces
	}
	for name, r := range in.Resources {
		rq, err := r.resourceQuota(name)
		if err != nil {
			return nil, err
		}
		switch corev1.ResourceName(name) {
		case v1alpha1.ResourceGPU:
			q.Spec.Resources.GPU = rq
		case v1alpha1.ResourceCPU:
			q.Spec.Resources.CPU = rq
		case v1alpha1.ResourceMemory:
			q.Spec.Resources.Memory = rq
		}
	}
	cl, err := c.s.deps.Clients.For(c.user)
	if err != nil {
		return nil, err
	}
	if err := cl.Create(c.ctx(), q); err != nil {
		return nil, err
	}
	return queueViewOf(q), nil
}

func handleUpdateQueue(c *call) (any, error) {
	var in queuePatchRequest
	if err := bind(c.r, &in); err != nil {
		return nil, err
	}
	if err := checkResourceNames(in.Resources); err != nil {
		return nil, err
	}
	spec := map[string]any{}
	if in.Parent != nil {
		spec["parent"] = *in.Parent
	}
	if in.Priority != nil {
		spec["priority"] = *in.Priority
	}
	if in.Namespaces != nil {
		spec["namespaces"] = *in.Namespaces
	}
	if len(in.Resources) > 0 {
		res := map[string]any{}
		for name, r := range in.Resources {
			rq, err := r.resourceQuota(name)
			if err != nil {
				return nil, err
			}
			m := map[string]any{}
			if rq.Quota != nil {
				m["quota"] = rq.Quota.String()
			}
			if rq.Limit != nil {
				m["limit"] = rq.Limit.String()
			}
			if rq.OverQuotaWeight != nil {
				m["overQuotaWeight"] = *rq.OverQuotaWeight
			}
			res[name] = m
		}
		spec["resources"] = res
	}
	patch := map[string]any{"spec": spec}
	if in.ResourceVersion != "" {
		// A merge patch that names the resourceVersion is applied only to
		// that version: 409 Conflict otherwise.
		patch["metadata"] = map[string]any{"resourceVersion": in.ResourceVersion}
	}
	data, err := json.Marshal(patch)
	if err != nil {
		return nil, err
	}
	cl, err := c.s.deps.Clients.For(c.user)
	if err != nil {
		return nil, err
	}
	q := &v1alpha1.Queue{ObjectMeta: metav1.ObjectMeta{Name: in.Name}}
	if err := cl.Patch(c.ctx(), q, client.RawPatch(types.MergePatchType, data)); err != nil {
		return nil, err
	}
	return queueViewOf(q), nil
}

// queueViewOf is a queue just written, before the next snapshot has it.
func queueViewOf(q *v1alpha1.Queue) QueueView {
	v := QueueView{Name: q.Name, Parent: q.Spec.Parent, Priority: v1alpha1.DefaultQueuePriority, Namespaces: q.Spec.Namespaces,
		Resources: map[string]QueueResource{}, ResourceVersion: q.ResourceVersion, Leaf: true}
	if q.Spec.Priority != nil {
		v.Priority = *q.Spec.Priority
	}
	for _, name := range queueResourceNames() {
		v.Resources[string(name)] = queueResource(q, name)
	}
	return v
}

// SubmitInput is the form for a simple workload: one pod with one
// container. Give exactly one of gpuFraction, gpuMemory and gpus.
type SubmitInput struct {
	Namespace string `json:"namespace" required:"true"`
	// Name is the pod's name; empty: one is made from generateName.
	Name    string   `json:"name,omitempty"`
	Image   string   `json:"image" required:"true"`
	Command []string `json:"command,omitempty"`
	Args    []string `json:"args,omitempty"`
	// GPUFraction is a share of one GPU, in (0, 1]: "0.25".
	GPUFraction string `json:"gpuFraction,omitempty"`
	// GPUMemory is GPU memory on one GPU: "20Gi".
	GPUMemory string `json:"gpuMemory,omitempty"`
	// GPUs is a number of whole GPUs.
	GPUs int `json:"gpus,omitempty"`
	// Queue is the queue (label partita.dev/queue); empty: the namespace's
	// default, if it has one.
	Queue string `json:"queue,omitempty"`
	// CPU and Memory are the container's requests (and limits), optional.
	CPU    string `json:"cpu,omitempty"`
	Memory string `json:"memory,omitempty"`
}

// SubmitResult names the pod made.
type SubmitResult struct {
	Namespace string      `json:"namespace"`
	Pod       string      `json:"pod"`
	Workload  WorkloadRef `json:"workload"`
}

// submitPod builds the pod of a form, checked with the parser every part
// of Partita uses.
func submitPod(in SubmitInput) (*corev1.Pod, error) {
	if in.Namespace == "" {
		return nil, badRequest("namespace is required")
	}
	if strings.TrimSpace(in.Image) == "" {
		return nil, badRequest("image is required")
	}
	if in.Name != "" {
		if errs := validation.IsDNS1123Subdomain(in.Name); len(errs) > 0 {
			return nil, badRequest("name %q: %s", in.Name, strings.Join(errs, "; "))
		}
	}
	set := 0
	for _, b := range []bool{in.GPUFraction != "", in.GPUMemory != "", in.GPUs != 0} {
		if b {
			set++
		}
	}
	if set != 1 {
		return nil, badRequest("give exactly one of gpuFraction (a share of a GPU, e.g. 0.25), gpuMemory (e.g. 20Gi) or gpus (whole GPUs)")
	}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: in.Namespace, Name: in.Name, Annotations: map[string]string{}, Labels: map[string]string{"app.kubernetes.io/created-by": "partita-console"}},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers:    []corev1.Container{{Name: "main", Image: strings.TrimSpace(in.Image), Command: in.Command, Args: in.Args}},
		},
	}
	if in.Name == "" {
		p.GenerateName = "console-"
	}
	switch {
	case in.GPUFraction != "":
		p.Annotations[v1alpha1.AnnotationGPUFraction] = strings.TrimSpace(in.GPUFraction)
	case in.GPUMemory != "":
		p.Annotations[v1alpha1.AnnotationGPUMemory] = strings.TrimSpace(in.GPUMemory)
	default:
		if in.GPUs < 1 {
			return nil, badRequest("gpus=%d: ask for at least 1 whole GPU, or for a fraction", in.GPUs)
		}
		p.Annotations[v1alpha1.AnnotationGPUCount] = strconv.Itoa(in.GPUs)
	}
	if in.Queue != "" {
		p.Labels[v1alpha1.LabelQueue] = in.Queue
	}
	res := corev1.ResourceList{}
	for name, s := range map[corev1.ResourceName]string{corev1.ResourceCPU: in.CPU, corev1.ResourceMemory: in.Memory} {
		if s == "" {
			continue
		}
		q, err := resource.ParseQuantity(s)
		if err != nil {
			return nil, badRequest("%s=%q is not a quantity", name, s)
		}
		res[name] = q
	}
	if len(res) > 0 {
		p.Spec.Containers[0].Resources = corev1.ResourceRequirements{Requests: res, Limits: res}
	}
	if _, errs := gpu.ParsePod(p); len(errs) > 0 {
		return nil, errorf(http.StatusUnprocessableEntity, "Invalid", "the GPU request is not valid: %v", errs.ToAggregate())
	}
	return p, nil
}

func handleSubmit(c *call) (any, error) {
	var in SubmitInput
	if err := bind(c.r, &in); err != nil {
		return nil, err
	}
	p, err := submitPod(in)
	if err != nil {
		return nil, err
	}
	cl, err := c.s.deps.Clients.For(c.user)
	if err != nil {
		return nil, err
	}
	if err := cl.Create(c.ctx(), p); err != nil {
		return nil, err
	}
	return SubmitResult{Namespace: p.Namespace, Pod: p.Name, Workload: WorkloadRef{Kind: KindPod, Namespace: p.Namespace, Name: p.Name}}, nil
}

// ActionResult says what an action did.
type ActionResult struct {
	Message string `json:"message"`
}

func handleDelete(c *call) (any, error) {
	var in workloadPath
	if err := bind(c.r, &in); err != nil {
		return nil, err
	}
	ref := in.ref()
	spec, ok := c.s.kind.spec(ref.Kind)
	if !ok || !spec.deletable {
		return nil, errorf(http.StatusUnprocessableEntity, "Unsupported", "the console cannot delete a %s; delete it with kubectl", ref.Kind)
	}
	cl, err := c.s.deps.Clients.For(c.user)
	if err != nil {
		return nil, err
	}
	bg := client.PropagationPolicy(metav1.DeletePropagationBackground)
	switch ref.Kind {
	case KindJob:
		j := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: ref.Namespace, Name: ref.Name}}
		if err := cl.Delete(c.ctx(), j, bg); err != nil {
			return nil, err
		}
		return ActionResult{Message: fmt.Sprintf("deleted Job %s/%s and its pods", ref.Namespace, ref.Name)}, nil
	case KindPod:
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ref.Namespace, Name: ref.Name}}
		if err := cl.Delete(c.ctx(), p); err != nil {
			return nil, err
		}
		return ActionResult{Message: fmt.Sprintf("deleted pod %s/%s", ref.Namespace, ref.Name)}, nil
	case KindPodGroup:
		return deleteGang(c.ctx(), cl, c.snap.workloadIndex[ref], ref)
	}
	return nil, errorf(http.StatusUnprocessableEntity, "Unsupported", "the console cannot delete a %s", ref.Kind)
}

// deleteGang deletes a gang's pods, then its PodGroup: all as the caller,
// so a caller who may not delete one of them is refused it by the API
// server and told which.
func deleteGang(ctx context.Context, cl client.Client, w *Workload, ref WorkloadRef) (any, error) {
	var names []string
	if w != nil {
		for _, p := range w.members {
			names = append(names, p.Name)
		}
	}
	for _, n := range names {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ref.Namespace, Name: n}}
		if err := cl.Delete(ctx, p); err != nil && !apierrors.IsNotFound(err) {
			return nil, err
		}
	}
	pg := &v1alpha1.PodGroup{ObjectMeta: metav1.ObjectMeta{Namespace: ref.Namespace, Name: ref.Name}}
	if err := cl.Delete(ctx, pg); err != nil && !apierrors.IsNotFound(err) {
		return nil, err
	}
	return ActionResult{Message: fmt.Sprintf("deleted PodGroup %s/%s and its %d pods", ref.Namespace, ref.Name, len(names))}, nil
}

func handleSuspend(suspend bool) func(c *call) (any, error) {
	return func(c *call) (any, error) {
		var in workloadPath
		if err := bind(c.r, &in); err != nil {
			return nil, err
		}
		ref := in.ref()
		spec, ok := c.s.kind.spec(ref.Kind)
		if !ok || !spec.suspendable {
			return nil, errorf(http.StatusUnprocessableEntity, "Unsupported", "a %s cannot be suspended (only a Job can); delete it instead", ref.Kind)
		}
		cl, err := c.s.deps.Clients.For(c.user)
		if err != nil {
			return nil, err
		}
		data, _ := json.Marshal(map[string]any{"spec": map[string]any{"suspend": suspend}})
		j := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: ref.Namespace, Name: ref.Name}}
		if err := cl.Patch(c.ctx(), j, client.RawPatch(types.MergePatchType, data)); err != nil {
			return nil, err
		}
		verb := "suspended"
		if !suspend {
			verb = "resumed"
		}
		return ActionResult{Message: fmt.Sprintf("%s Job %s/%s", verb, ref.Namespace, ref.Name)}, nil
	}
}

// lastReload is the latest PolicyLoaded or PolicyRefused event on the
// policy ConfigMaps.
func lastReload(ctx context.Context, r client.Reader, namespace string) (*PolicyReload, error) {
	var l corev1.EventList
	if err := r.List(ctx, &l, client.InNamespace(namespace)); err != nil {
		return nil, fmt.Errorf("list events in %s: %w", namespace, err)
	}
	var best *PolicyReload
	for i := range l.Items {
		e := &l.Items[i]
		if e.InvolvedObject.Kind != "ConfigMap" || !slices.Contains(policyReasons(), e.Reason) {
			continue
		}
		ev := eventView(e)
		if best == nil || ev.Time.After(best.Time) {
			outcome := "Loaded"
			if strings.Contains(e.Reason, "Refused") {
				outcome = "Refused"
			}
			best = &PolicyReload{Outcome: outcome, Message: ev.Message, ConfigMap: e.InvolvedObject.Name, Time: ev.Time}
		}
	}
	if best == nil {
		return nil, errors.New("no policy events")
	}
	return best, nil
}
