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
		`{"gang": [{"name": "x", "minMember": 4, "topology": {"topology": "dc", "required": "example.com/block"}, "subGroups": [{"name": "w-0", "minMember": 2, "topologyRequired": "example.com/rack"}, {"name": "w-1", "minMember": 2}], "subGroup": "w-1"}]}`,
		`{"gang": [{"name": "x", "minMember": 1, "topology": [], "subGroups": [{"name": "a", "minMember": 2}, null], "subGroup": "b"}]}`,
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
		g := got.Gang
		if g == nil {
			return
		}
		if g.Name == "" || g.MinMember < 1 || g.MinMember > 100000 || len(g.SubGroups) > 64 {
			t.Errorf("readWorkload(%s) = gang %+v: not a gang a PodGroup can carry", b, g)
		}
		var sum int32
		names := map[string]bool{}
		for _, sg := range g.SubGroups {
			if sg.Name == "" || names[sg.Name] || sg.MinMember < 1 {
				t.Errorf("readWorkload(%s) = sub-group %+v: not one a PodGroup can carry", b, sg)
			}
			names[sg.Name] = true
			sum += sg.MinMember
		}
		if sum > g.MinMember || g.SubGroup != "" && !names[g.SubGroup] {
			t.Errorf("readWorkload(%s) = gang %+v: its sub-groups do not fit it", b, g)
		}
	})
}
