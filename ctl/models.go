package ctl

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/report"
)

// BuildModels reads the Models of namespace ("" for all) and the pods that
// use them; name, when set, keeps that Model alone.
func BuildModels(ctx context.Context, c client.Reader, namespace, name string) (report.ModelsReport, error) {
	var list v1alpha1.ModelList
	if err := c.List(ctx, &list, client.InNamespace(namespace)); err != nil {
		return report.ModelsReport{}, fmt.Errorf("list Models: %w", err)
	}
	var pods corev1.PodList
	if err := c.List(ctx, &pods, client.InNamespace(namespace)); err != nil {
		return report.ModelsReport{}, fmt.Errorf("list pods: %w", err)
	}
	models := list.Items
	if name != "" {
		models = slices.DeleteFunc(models, func(m v1alpha1.Model) bool { return m.Name != name })
		if len(models) == 0 {
			return report.ModelsReport{}, fmt.Errorf("no Model %q in namespace %q", name, namespace)
		}
	}
	return report.Models(models, pods.Items), nil
}

// WriteModels writes r: one row per model, and with detail one row per
// node that holds or fetches it.
func WriteModels(w io.Writer, r report.ModelsReport, o Output, detail bool) error {
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
				if _, err := fmt.Fprintf(w, "pods %s: %s\n", strings.ToLower(string(ph)), strings.Join(ps, ", ")); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// bytesOf writes n in the largest binary unit it reaches: whole ("16Gi")
// when it is a multiple, else with one decimal ("256.3Mi"), never the raw
// byte count of a model that is no round size.
func bytesOf(n int64) string {
	if n <= 0 {
		return "-"
	}
	units := []string{"", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"}
	u, div := 0, int64(1)
	for u < len(units)-1 && n/div >= 1024 {
		u++
		div *= 1024
	}
	if n%div == 0 {
		return fmt.Sprintf("%d%s", n/div, units[u])
	}
	return fmt.Sprintf("%.1f%s", float64(n)/float64(div), units[u])
}

// RunModels is `partita ctl models [NAME]`.
func RunModels(ctx context.Context, c client.Reader, w io.Writer, namespace, name string, o Output) error {
	r, err := BuildModels(ctx, c, namespace, name)
	if err != nil {
		return err
	}
	return WriteModels(w, r, o, name != "")
}
