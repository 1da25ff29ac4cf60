package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// exampleFile is the worked example of docs/fairshare.md: fair shares
// research 4.5, prod 3, dev 1, batch 1.5.
const exampleFile = `capacity: {gpu: 10}
queues:
- {name: research, gpu: {quota: 2, overQuotaWeight: 2}}
- {name: prod, gpu: {quota: 2}}
- {name: dev}
- {name: batch, priority: 50, gpu: {quota: 1}}
demand:
  research: {gpu: 8}
  prod: {gpu: 3}
  dev: {gpu: 6}
  batch: {gpu: 1.5}
`

func TestFairshareCommand(t *testing.T) {
	dir := t.TempDir()
	example := filepath.Join(dir, "example.yaml")
	if err := os.WriteFile(example, []byte(exampleFile), 0o600); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("capacity: {gpu: 1}\nqueues: [{name: a, gpu: {qouta: 1}}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := map[string]struct {
		args    []string
		stdin   string
		want    string
		wantErr string
	}{
		"table by default": {
			args: []string{"-f", example},
			want: `gpu: capacity 10
QUEUE     PRIORITY  QUOTA  LIMIT  WEIGHT  DEMAND  FAIR SHARE  ALLOCATABLE
research  100       2      none   2       8       4.5         10
prod      100       2      none   1       3       3           10
dev       100       0      none   1       6       1           10
batch     50        1      none   1       1.5     1.5         10
`,
		},
		"json from stdin": {
			args:  []string{"--file", "-", "-o", "json"},
			stdin: exampleFile,
			want: `{
  "queues": [
    {
      "name": "research",
      "fairShare": {
        "gpu": 4.5
      },
      "allocatable": {
        "gpu": 10
      }
    },
    {
      "name": "prod",
      "fairShare": {
        "gpu": 3
      },
      "allocatable": {
        "gpu": 10
      }
    },
    {
      "name": "dev",
      "fairShare": {
        "gpu": 1
      },
      "allocatable": {
        "gpu": 10
      }
    },
    {
      "name": "batch",
      "fairShare": {
        "gpu": 1.5
      },
      "allocatable": {
        "gpu": 10
      }
    }
  ]
}
`,
		},
		"no file": {
			args:    []string{"-o", "json"},
			wantErr: `required flag(s) "file" not set`,
		},
		"unknown output format": {
			args:    []string{"-f", example, "-o", "yaml"},
			wantErr: `unknown output format "yaml": want table or json`,
		},
		"missing file": {
			args:    []string{"-f", filepath.Join(dir, "nope.yaml")},
			wantErr: "load fair-share file: open " + filepath.Join(dir, "nope.yaml") + ": no such file or directory",
		},
		"invalid file": {
			args:    []string{"-f", bad},
			wantErr: "load " + bad + `: queues[0] (a).gpu: unknown field "qouta"; want quota, limit or overQuotaWeight`,
		},
		"invalid stdin": {
			args:    []string{"-f", "-"},
			stdin:   "capacity: {gpu: 1}\n",
			wantErr: "load stdin: queues: is required: a list of queues in creation order",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			cmd := newFairshareCommand()
			var stdout, stderr bytes.Buffer
			cmd.SetArgs(tc.args)
			cmd.SetIn(strings.NewReader(tc.stdin))
			cmd.SetOut(&stdout)
			cmd.SetErr(&stderr)
			err := cmd.Execute()
			gotErr := ""
			if err != nil {
				gotErr = err.Error()
			}
			if diff := cmp.Diff(tc.wantErr, gotErr); diff != "" {
				t.Errorf("error (-want,+got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.want, stdout.String()); diff != "" {
				t.Errorf("stdout (-want,+got):\n%s", diff)
			}
		})
	}
}
