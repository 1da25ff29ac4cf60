package webhook

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// FuzzParseModelNames: any annotation value gives names or field errors,
// never a panic; every name it keeps is a valid Model name of the pod's
// own namespace, and the API's lenient reader keeps at least those.
func FuzzParseModelNames(f *testing.F) {
	for _, s := range []string{"llama", "llama, mistral", "team-b/llama", "", ",", "a,,b", strings.Repeat("x,", 20), "Llama", "a.b-c", "llama,llama"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Annotations: map[string]string{v1alpha1.AnnotationModel: raw}}}
		names, errs := parseModelNames(pod)
		lenient := v1alpha1.ModelNamesOf(pod.Annotations)
		for _, n := range names {
			if strings.Contains(n, "/") || n == "" || strings.TrimSpace(n) != n {
				t.Fatalf("kept %q from %q", n, raw)
			}
			if len(errs) == 0 && !contains(lenient, n) {
				t.Fatalf("the lenient reader lost %q of %q: %v", n, raw, lenient)
			}
			if len(modelVolumeName(n)) > 63 {
				t.Fatalf("volume name of %q is %d long", n, len(modelVolumeName(n)))
			}
		}
	})
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}
