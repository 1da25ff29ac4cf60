package admission

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
)

// TestTruncate: messages for conditions and Events fit their limit and
// stay valid UTF-8 when cut inside a multi-byte rune.
func TestTruncate(t *testing.T) {
	tests := []struct {
		name string
		in   string
		n    int
		want string
	}{
		{name: "short enough", in: "gang needs 2 × 8 GPUs", n: 1024, want: "gang needs 2 × 8 GPUs"},
		{name: "cut at a byte boundary", in: strings.Repeat("a", 10), n: 8, want: "aaaaa..."},
		// "×" is two bytes: a cut after its first byte backs off before it.
		{name: "cut inside a rune", in: "aaaa×bbbb", n: 8, want: "aaaa..."},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := truncate(tc.in, tc.n)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("truncate(%q, %d) (-want +got):\n%s", tc.in, tc.n, diff)
			}
			if len(got) > tc.n || !utf8.ValidString(got) {
				t.Errorf("truncate(%q, %d) = %q: %d bytes, valid UTF-8 %v", tc.in, tc.n, got, len(got), utf8.ValidString(got))
			}
		})
	}
}
