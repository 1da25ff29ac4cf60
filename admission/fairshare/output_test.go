package fairshare

import (
	"bytes"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// treeFile lists lab between org and org's child, so the table (tree order)
// and the JSON (input order) differ. By hand: gpu (16): quotas org 8, lab 4,
// left 4; tier 100: org is offered 4 and takes the 2 it wants; tier 50: lab
// is offered 2 and takes 2: org 10, lab 6; team-a gets all of org's 10. cpu (64): only team-a wants, 3.5. memory (512Gi): org
// wants 64Gi, lab 1e9 bytes, both within quota or offer.
const treeFile = `
capacity: {gpu: 16, memory: 512Gi, cpu: "64"}
queues:
- {name: org, priority: 100, gpu: {quota: 8, limit: -1, overQuotaWeight: 1}}
- {name: lab, priority: 50, gpu: {quota: 4}, memory: {quota: 100Gi, limit: 200Gi}}
- {name: team-a, parent: org, gpu: {quota: 4, overQuotaWeight: 2}, cpu: {quota: 500m}}
demand: {team-a: {gpu: 10, memory: 64Gi, cpu: 3.5}, lab: {gpu: 12, memory: 1000000000}}
`

func mustDivide(t *testing.T, file string) Division {
	t.Helper()
	in, err := Load(strings.NewReader(file))
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	d, err := in.Divide()
	if err != nil {
		t.Fatalf("Divide: %v", err)
	}
	return d
}

func TestWriteTable(t *testing.T) {
	want := `gpu: capacity 16
QUEUE     PRIORITY  QUOTA  LIMIT  WEIGHT  DEMAND  FAIR SHARE  ALLOCATABLE
org       100       8      none   1       10      10          16
  team-a  100       4      none   2       10      10          16
lab       50        4      none   1       12      6           16

cpu: capacity 64
QUEUE     PRIORITY  QUOTA  LIMIT  WEIGHT  DEMAND  FAIR SHARE  ALLOCATABLE
org       100       0      none   1       3.5     3.5         64
  team-a  100       0.5    none   1       3.5     3.5         64
lab       50        0      none   1       0       0           64

memory: capacity 512Gi
QUEUE     PRIORITY  QUOTA  LIMIT  WEIGHT  DEMAND  FAIR SHARE  ALLOCATABLE
org       100       0      none   1       64Gi    64Gi        512Gi
  team-a  100       0      none   1       64Gi    64Gi        512Gi
lab       50        100Gi  200Gi  1       1G      1G          200Gi
`
	var got bytes.Buffer
	if err := WriteTable(&got, mustDivide(t, treeFile)); err != nil {
		t.Fatalf("WriteTable: %v", err)
	}
	if diff := cmp.Diff(want, got.String()); diff != "" {
		t.Errorf("WriteTable (-want,+got):\n%s", diff)
	}
}

func TestWriteJSON(t *testing.T) {
	cases := map[string]struct {
		division Division
		want     string
	}{
		"input order, GPUs, cores and bytes": {
			division: mustDivide(t, treeFile),
			want: `{
  "queues": [
    {
      "name": "org",
      "fairShare": {
        "cpu": 3.5,
        "gpu": 10,
        "memory": 68719476736
      },
      "allocatable": {
        "cpu": 64,
        "gpu": 16,
        "memory": 549755813888
      }
    },
    {
      "name": "lab",
      "fairShare": {
        "cpu": 0,
        "gpu": 6,
        "memory": 1000000000
      },
      "allocatable": {
        "cpu": 64,
        "gpu": 16,
        "memory": 214748364800
      }
    },
    {
      "name": "team-a",
      "fairShare": {
        "cpu": 3.5,
        "gpu": 10,
        "memory": 68719476736
      },
      "allocatable": {
        "cpu": 64,
        "gpu": 16,
        "memory": 549755813888
      }
    }
  ]
}
`,
		},
		"amounts rounded to 3 decimals": {
			division: Division{
				Capacity: map[Resource]float64{GPU: 10},
				Queues: []QueueShare{{
					Queue:       Queue{Name: "a"},
					FairShare:   map[Resource]float64{GPU: 4.4999999999, CPU: 1.0 / 3},
					Allocatable: map[Resource]float64{GPU: 10, Memory: 1 << 50},
				}},
			},
			want: `{
  "queues": [
    {
      "name": "a",
      "fairShare": {
        "cpu": 0.333,
        "gpu": 4.5
      },
      "allocatable": {
        "gpu": 10,
        "memory": 1125899906842624
      }
    }
  ]
}
`,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var got bytes.Buffer
			if err := WriteJSON(&got, tc.division); err != nil {
				t.Fatalf("WriteJSON: %v", err)
			}
			if diff := cmp.Diff(tc.want, got.String()); diff != "" {
				t.Errorf("WriteJSON (-want,+got):\n%s", diff)
			}
		})
	}
}
