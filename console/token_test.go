package console

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLocalToken(t *testing.T) {
	good := strings.Repeat("a", minTokenLength)
	cases := map[string]struct {
		content string // "" leaves no file
		mode    os.FileMode
		want    string // "" with wantErr empty: a new random token
		wantErr string
	}{
		"no file: a new one":          {},
		"kept token":                  {content: good + "\n", mode: 0o600, want: good},
		"readable by others":          {content: good, mode: 0o644, wantErr: "may be read by others"},
		"too short":                   {content: "abc", mode: 0o600, wantErr: "at least 43 characters"},
		"fragment characters":         {content: good + "#x", mode: 0o600, wantErr: "no spaces"},
		"only whitespace in the file": {content: "\n\n", mode: 0o600, wantErr: "at least 43 characters"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "token")
			if tc.content != "" {
				if err := os.WriteFile(path, []byte(tc.content), tc.mode); err != nil {
					t.Fatal(err)
				}
				if err := os.Chmod(path, tc.mode); err != nil {
					t.Fatal(err)
				}
			}
			got, err := LocalToken(path)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("LocalToken = %q, %v; want an error with %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.want != "" && got != tc.want {
				t.Errorf("LocalToken = %q, want %q", got, tc.want)
			}
			if checkToken(got) != nil {
				t.Errorf("LocalToken gave an unusable token %q", got)
			}
			// Asked again: the same token, from a file only its owner reads.
			again, err := LocalToken(path)
			if err != nil || again != got {
				t.Errorf("second LocalToken = %q, %v; want %q", again, err, got)
			}
			st, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if st.Mode().Perm() != 0o600 {
				t.Errorf("token file mode %v, want 0600", st.Mode().Perm())
			}
		})
	}
}
