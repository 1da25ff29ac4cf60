package ctl

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// ModelReport is one Model as `partita ctl models` shows it.
type ModelReport struct {
	Namespace string                     `json:"namespace"`
	Name      string                     `json:"name"`
	Source    string                     `json:"source"`
	Phase     v1alpha1.ModelPhase        `json:"phase"`
	Size      int64                      `json:"size"`
	Message   string                     `json:"message,omitempty"`
	Nodes     []v1alpha1.ModelNodeStatus `json:"nodes"`
	// Pods that ask for it (partita.dev/model), by phase.
	Pods map[corev1.PodPhase][]string `json:"pods"`
}

// ModelsReport is the models of a namespace (or of all).
type ModelsReport struct {
	Models []ModelReport `json:"models"`
}

// BuildModels reads the Models of namespace ("" for all) and the pods that
// use them; name, when set, keeps that Model alone.
func BuildModels(ctx context.Context, c client.Reader, namespace, name string) (ModelsReport, error) {
	var list v1alpha1.ModelList
	if err := c.List(ctx, &list, client.InNamespace(namespace)); err != nil {
		return ModelsReport{}, fmt.Errorf("list Models: %w", err)
	}
	var pods corev1.PodList
	if err := c.List(ctx, &pods, client.InNamespace(namespace)); err != nil {
		return ModelsReport{}, fmt.Errorf("list pods: %w", err)
	}
	users := map[string]map[corev1.PodPhase][]string{}
	for _, p := range pods.Items {
		for _, m := range v1alpha1.ModelNamesOf(p.Annotations) {
			k := p.Namespace + "/" + m
			if users[k] == nil {
				users[k] = map[corev1.PodPhase][]string{}
			}
			users[k][p.Status.Phase] = append(users[k][p.Status.Phase], p.Name)
		}
	}
	var out ModelsReport
	for _, m := range list.Items {
		if name != "" && m.Name != name {
			continue
		}
		r := ModelReport{Namespace: m.Namespace, Name: m.Name, Source: m.Spec.Source.URI, Phase: m.Status.Phase, Size: m.Status.Size,
			Nodes: m.Status.Nodes, Pods: users[m.Namespace+"/"+m.Name]}
		for _, c := range m.Status.Conditions {
			if c.Type == v1alpha1.ModelConditionReady {
				r.Message = c.Message
			}
		}
		if r.Phase == "" {
			r.Phase = v1alpha1.ModelPending
		}
		slices.SortFunc(r.Nodes, func(a, b v1alpha1.ModelNodeStatus) int { return strings.Compare(a.Name, b.Name) })
		out.Models = append(out.Models, r)
	}
	if name != "" && len(out.Models) == 0 {
		return out, fmt.Errorf("no Model %q in namespace %q", name, namespace)
	}
	slices.SortFunc(out.Models, func(a, b ModelReport) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	return out, nil
}

// WriteModels writes r: one row per model, and with detail one row per
// node that holds or fetches it.
func WriteModels(w io.Writer, r ModelsReport, o Output, detail bool) error {
	if o == OutputJSON {
		return writeJSON(w, "models", r)
	}
	if len(r.Models) == 0 {
		_, err := fmt.Fprintln(w, "No models.")
		return err
	}
	tw := newTable(w)
	tw.row("NAMESPACE\tMODEL\tPHASE\tSIZE\tNODES READY\tFETCHING\tFAILED\tPODS RUNNING\tWAITING\tSOURCE\n")
	for _, m := range r.Models {
		count := map[v1alpha1.ModelPhase]int{}
		for _, n := range m.Nodes {
			count[n.Phase]++
		}
		waiting := len(m.Pods[corev1.PodPending])
		tw.row("%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s\n", m.Namespace, m.Name, m.Phase, bytesOf(m.Size),
			count[v1alpha1.ModelReady], count[v1alpha1.ModelFetching]+count[v1alpha1.ModelPending], count[v1alpha1.ModelFailed],
			len(m.Pods[corev1.PodRunning]), waiting, m.Source)
	}
	if err := tw.flush(); err != nil {
		return fmt.Errorf("write models: %w", err)
	}
	if !detail {
		return nil
	}
	for _, m := range r.Models {
		if _, err := fmt.Fprintf(w, "\n%s/%s: %s\n", m.Namespace, m.Name, m.Message); err != nil {
			return err
		}
		tw := newTable(w)
		tw.row("NODE\tPHASE\tHELD\tMESSAGE\n")
		for _, n := range m.Nodes {
			held := bytesOf(n.Bytes)
			if n.Total > 0 {
				held = fmt.Sprintf("%s of %s (%.0f%%)", bytesOf(n.Bytes), bytesOf(n.Total), 100*float64(n.Bytes)/float64(n.Total))
			}
			tw.row("%s\t%s\t%s\t%s\n", n.Name, n.Phase, held, n.Message)
		}
		if err := tw.flush(); err != nil {
			return fmt.Errorf("write models: %w", err)
		}
		for _, ph := range []corev1.PodPhase{corev1.PodRunning, corev1.PodPending} {
			if ps := m.Pods[ph]; len(ps) > 0 {
				slices.Sort(ps)
				if _, err := fmt.Fprintf(w, "pods %s: %s\n", strings.ToLower(string(ph)), strings.Join(ps, ", ")); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func bytesOf(n int64) string {
	if n <= 0 {
		return "-"
	}
	return resource.NewQuantity(n, resource.BinarySI).String()
}

// RunModels is `partita ctl models [NAME]`.
func RunModels(ctx context.Context, c client.Reader, w io.Writer, namespace, name string, o Output) error {
	r, err := BuildModels(ctx, c, namespace, name)
	if err != nil {
		return err
	}
	return WriteModels(w, r, o, name != "")
}
