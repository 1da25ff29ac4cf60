// Package podcondition keeps the pod condition partita.dev/ModelsReady on
// pods that ask for models (partita.dev/model) and are bound but not
// started: False with what they wait for ("waiting for model llama on
// node-7: 34% ..."), True once their node holds every model. It runs on the
// extender's leader; the kubelet, not this condition, holds the pod.
package podcondition

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// Reasons of the condition.
const (
	ReasonReady    = "ModelsReady"
	ReasonFetching = "WaitingForModel"
	ReasonFailed   = "ModelFailed"
	ReasonMissing  = "ModelNotFound"
)

// Condition is what the pod's condition says of its models on its node.
func Condition(models []v1alpha1.Model, names []string, node string) (corev1.ConditionStatus, string, string) {
	for _, name := range names {
		var m *v1alpha1.Model
		for i := range models {
			if models[i].Name == name {
				m = &models[i]
			}
		}
		if m == nil {
			return corev1.ConditionFalse, ReasonMissing, fmt.Sprintf("model %s does not exist in the pod's namespace", name)
		}
		e := m.Status.ModelNode(node)
		switch {
		case e == nil:
			return corev1.ConditionFalse, ReasonFetching, fmt.Sprintf("waiting for model %s on %s: not fetched there yet", name, node)
		case e.Phase == v1alpha1.ModelReady:
			continue
		case e.Phase == v1alpha1.ModelFailed:
			return corev1.ConditionFalse, ReasonFailed, fmt.Sprintf("model %s failed on %s: %s", name, node, e.Message)
		case strings.HasPrefix(e.Message, "waiting for model"):
			return corev1.ConditionFalse, ReasonFetching, e.Message
		default:
			return corev1.ConditionFalse, ReasonFetching, fmt.Sprintf("waiting for model %s on %s: %s", name, node, e.Phase)
		}
	}
	return corev1.ConditionTrue, ReasonReady, fmt.Sprintf("every model is on %s", node)
}

// Reconciler keeps the condition of one pod.
type Reconciler struct {
	Client client.Client
	Clock  clock.PassiveClock
}

// Reconcile sets the pod's condition when it differs.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	pod := &corev1.Pod{}
	if err := r.Client.Get(ctx, req.NamespacedName, pod); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	names := v1alpha1.ModelNamesOf(pod.Annotations)
	if len(names) == 0 || pod.Spec.NodeName == "" || pod.DeletionTimestamp != nil || (pod.Status.Phase != "" && pod.Status.Phase != corev1.PodPending) {
		return ctrl.Result{}, nil
	}
	var models v1alpha1.ModelList
	if err := r.Client.List(ctx, &models, client.InNamespace(pod.Namespace)); err != nil {
		return ctrl.Result{}, fmt.Errorf("list Models of %s: %w", pod.Namespace, err)
	}
	st, reason, msg := Condition(models.Items, names, pod.Spec.NodeName)
	for _, c := range pod.Status.Conditions {
		if c.Type == v1alpha1.PodConditionModelsReady && c.Status == st && c.Reason == reason && c.Message == msg {
			return ctrl.Result{}, nil
		}
	}
	cond := corev1.PodCondition{Type: v1alpha1.PodConditionModelsReady, Status: st, Reason: reason, Message: msg,
		LastTransitionTime: metav1.NewTime(r.Clock.Now())}
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.PodCondition{cond}}})
	if err != nil {
		return ctrl.Result{}, err
	}
	obj := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name}}
	if err := r.Client.Status().Patch(ctx, obj, client.RawPatch(types.StrategicMergePatchType, patch)); err != nil && !apierrors.IsNotFound(err) {
		return ctrl.Result{}, fmt.Errorf("write the ModelsReady condition of pod %s: %w", req.NamespacedName, err)
	}
	return ctrl.Result{}, nil
}

// Setup adds the reconciler to mgr: pods that ask for models, again when a
// Model of their namespace changes.
func Setup(mgr ctrl.Manager, clk clock.PassiveClock) error {
	c := mgr.GetClient()
	asksModel := predicate.NewPredicateFuncs(func(o client.Object) bool {
		_, ok := o.GetAnnotations()[v1alpha1.AnnotationModel]
		return ok
	})
	podsOf := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
		var pods corev1.PodList
		if err := c.List(ctx, &pods, client.InNamespace(o.GetNamespace())); err != nil {
			return nil
		}
		var out []reconcile.Request
		for _, p := range pods.Items {
			if p.Spec.NodeName == "" || (p.Status.Phase != "" && p.Status.Phase != corev1.PodPending) {
				continue
			}
			for _, n := range v1alpha1.ModelNamesOf(p.Annotations) {
				if n == o.GetName() {
					out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&p)})
					break
				}
			}
		}
		return out
	})
	return builder.ControllerManagedBy(mgr).
		Named("model-pod-condition").
		For(&corev1.Pod{}, builder.WithPredicates(asksModel)).
		Watches(&v1alpha1.Model{}, podsOf).
		Complete(&Reconciler{Client: c, Clock: clk})
}
