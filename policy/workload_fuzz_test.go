package policy

import (
	"bytes"
	"encoding/json"
	"testing"
)

// FuzzReadWorkload: whatever an operator's workload rule answers, reading
// it returns a gang that a PodGroup can carry, or an error; never a panic.
func FuzzReadWorkload(f *testing.F) {
	for _, seed := range []string{
		`{"gang": [{"name": "jobset-train", "minMember": 8, "elastic": false, "queue": "team-a", "kind": "JobSet", "ownerName": "train"}], "errors": []}`,
		`{"gang": [], "errors": ["the JobSet has no replicatedJobs"]}`,
		`{"gang": [{"name": "x", "minMember": 1e300}]}`,
		`{"gang": [{"name": "Not_A_Name", "minMember": 2}]}`,
		`{"gang": [{"name": "x", "minMember": -1, "elastic": "yes"}]}`,
		`{"gang": [{"name": "x", "minMember": 2, "extra": {}}]}`,
		`{"gang": [null], "errors": [1, 2]}`,
		`{"gang": {"name": "x"}}`,
		`[]`,
		`"gang"`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		d := json.NewDecoder(bytes.NewReader(b))
		d.UseNumber() // as OPA hands results back
		var v any
		if d.Decode(&v) != nil {
			return
		}
		got, err := readWorkload("v1", v, true)
		if err != nil {
			return
		}
		if g := got.Gang; g != nil && (g.Name == "" || g.MinMember < 1 || g.MinMember > 100000) {
			t.Errorf("readWorkload(%s) = gang %+v: not a gang a PodGroup can carry", b, g)
		}
	})
}
