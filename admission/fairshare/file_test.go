package fairshare

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestLoad(t *testing.T) {
	cases := map[string]struct {
		file string
		want Input
	}{
		"the example of the CLI help": {
			file: `
capacity: {gpu: 16}
queues:
- {name: org, priority: 100, gpu: {quota: 8, limit: -1, overQuotaWeight: 1}}
- {name: team-a, parent: org, priority: 100, gpu: {quota: 4, limit: -1, overQuotaWeight: 2}}
demand: {team-a: {gpu: 10}}
`,
			want: Input{
				Capacity: map[Resource]float64{GPU: 16},
				Queues: []Queue{
					{Name: "org", Priority: 100, CreationOrder: 0, Resources: map[Resource]Settings{GPU: {Quota: 8, Limit: -1, OverQuotaWeight: 1}}},
					{Name: "team-a", Parent: "org", Priority: 100, CreationOrder: 1, Resources: map[Resource]Settings{GPU: {Quota: 4, Limit: -1, OverQuotaWeight: 2}}},
				},
				Demand: map[string]map[Resource]float64{"team-a": {GPU: 10}},
			},
		},
		"defaults, decimals and quantities": {
			// Unset priority is 100; an unset quota 0, limit -1, weight 1.
			// cpu is in cores ("500m" is 0.5), memory in bytes.
			file: `
capacity:
  gpu: 7.5
  cpu: "64"
  memory: 512Gi
queues:
- name: a
  gpu: {quota: 0.5}
  cpu: {limit: 1500m}
  memory: {quota: 1Gi, overQuotaWeight: 0.5}
- name: b
  priority: -3
demand:
  a: {gpu: 1.25, cpu: 250m, memory: 1000000}
`,
			want: Input{
				Capacity: map[Resource]float64{GPU: 7.5, CPU: 64, Memory: 512 << 30},
				Queues: []Queue{
					{Name: "a", Priority: 100, CreationOrder: 0, Resources: map[Resource]Settings{
						GPU:    {Quota: 0.5, Limit: -1, OverQuotaWeight: 1},
						CPU:    {Quota: 0, Limit: 1.5, OverQuotaWeight: 1},
						Memory: {Quota: 1 << 30, Limit: -1, OverQuotaWeight: 0.5},
					}},
					{Name: "b", Priority: -3, CreationOrder: 1, Resources: map[Resource]Settings{}},
				},
				Demand: map[string]map[Resource]float64{"a": {GPU: 1.25, CPU: 0.25, Memory: 1e6}},
			},
		},
		"JSON is YAML too": {
			file: `{"capacity": {"gpu": 2}, "queues": [{"name": "a"}]}`,
			want: Input{
				Capacity: map[Resource]float64{GPU: 2},
				Queues:   []Queue{{Name: "a", Priority: 100, Resources: map[Resource]Settings{}}},
				Demand:   map[string]map[Resource]float64{},
			},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := Load(strings.NewReader(tc.file))
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Load (-want,+got):\n%s", diff)
			}
		})
	}
}

func TestLoadErrors(t *testing.T) {
	cases := map[string]struct {
		file string
		want string
	}{
		"empty file": {
			file: "",
			want: "file: is empty; want capacity, queues and demand",
		},
		"not a mapping": {
			file: "- a\n- b\n",
			want: "file: must be a mapping with capacity, queues and demand",
		},
		"YAML syntax, with its line": {
			file: "capacity: {gpu: 1}\nqueues:\n- name: a\n  gpu: {quota: 1\n",
			want: "parse fair-share file: yaml: line 4: did not find expected ',' or '}'",
		},
		"a key given twice": {
			file: "capacity: {gpu: 1, gpu: 2}\nqueues: [{name: a}]\n",
			want: `parse fair-share file: yaml: unmarshal errors:
  line 1: key "gpu" already set in map`,
		},
		"unknown top-level field": {
			file: "capacity: {gpu: 1}\nqueues: [{name: a}]\ndemands: {a: {gpu: 1}}\n",
			want: `file: unknown field "demands"; want capacity, queues, demand or usageWeight`,
		},
		"no capacity": {
			file: "queues: [{name: a}]\n",
			want: "capacity: is required: give at least one of gpu, cpu or memory",
		},
		"unknown resource in capacity": {
			file: "capacity: {gpus: 1}\nqueues: [{name: a}]\n",
			want: `capacity: unknown resource "gpus"; want gpu, cpu, memory`,
		},
		"no queues": {
			file: "capacity: {gpu: 1}\n",
			want: "queues: is required: a list of queues in creation order",
		},
		"queue without a name": {
			file: "capacity: {gpu: 1}\nqueues: [{name: a}, {parent: a}]\n",
			want: "queues[1].name: is required: a queue name such as team-a",
		},
		"misspelt queue field": {
			file: "capacity: {gpu: 1}\nqueues: [{name: a, prority: 3}]\n",
			want: `queues[0] (a): unknown field "prority"; want name, parent, priority, usage or a resource (gpu, cpu, memory)`,
		},
		"misspelt resource field": {
			file: "capacity: {gpu: 1}\nqueues: [{name: a, gpu: {qouta: 3}}]\n",
			want: `queues[0] (a).gpu: unknown field "qouta"; want quota, limit or overQuotaWeight`,
		},
		"resource that is not a mapping": {
			file: "capacity: {gpu: 1}\nqueues: [{name: a, gpu: 3}]\n",
			want: "queues[0] (a).gpu: must be a mapping such as {quota: 4, limit: -1, overQuotaWeight: 1}",
		},
		"bad quantity": {
			file: "capacity: {gpu: 1}\nqueues: [{name: a, memory: {limit: 4 GB}}]\n",
			want: `queues[0] (a).memory.limit: "4 GB" is not a number (4, 0.5, -1) or a quantity (500m, 64Gi)`,
		},
		"weight as a quantity": {
			file: "capacity: {gpu: 1}\nqueues: [{name: a, gpu: {overQuotaWeight: 2k}}]\n",
			want: "queues[0] (a).gpu.overQuotaWeight: want a number such as 1 or 2, got 2k",
		},
		"fractional priority": {
			file: "capacity: {gpu: 1}\nqueues: [{name: a, priority: 1.5}]\n",
			want: "queues[0] (a).priority: want a whole number such as 100, got 1.5",
		},
		"negative limit": {
			file: "capacity: {gpu: 1}\nqueues: [{name: a, gpu: {limit: -2}}]\n",
			want: `queue "a" gpu limit: must be -1 or at least 0, got -2`,
		},
		"unknown parent": {
			file: "capacity: {gpu: 1}\nqueues: [{name: a, parent: org}]\n",
			want: `queue "a": has unknown parent "org"`,
		},
		"demand for a parent queue": {
			file: "capacity: {gpu: 1}\nqueues: [{name: org}, {name: a, parent: org}]\ndemand: {org: {gpu: 1}}\n",
			want: `demand "org": names a queue with children; only leaf queues have workloads, so give the demand to its leaves`,
		},
		"demand for an unknown queue": {
			file: "capacity: {gpu: 1}\nqueues: [{name: a}]\ndemand: {b: {gpu: 1}}\n",
			want: `demand "b": names no queue`,
		},
		"negative usage": {
			file: "capacity: {gpu: 1}\nqueues: [{name: a, usage: {gpu: -1}}]\n",
			want: `queue "a" usage gpu: must be at least 0, got -1`,
		},
		"usage not a map": {
			file: "capacity: {gpu: 1}\nqueues: [{name: a, usage: 0.5}]\n",
			want: `queues[0] (a).usage: must map resources to amounts, such as {gpu: 8, memory: 64Gi}`,
		},
		"weight not number": {
			file: "capacity: {gpu: 1}\nusageWeight: lots\nqueues: [{name: a}]\n",
			want: `usageWeight: want a number such as 1 or 2, got lots`,
		},
		"negative usage weight": {
			file: "capacity: {gpu: 1}\nusageWeight: -2\nqueues: [{name: a}]\n",
			want: `usageWeight: must be at least 0, got -2`,
		},
		"unknown usage name": {
			file: "capacity: {gpu: 1}\nqueues: [{name: a, usage: {gpus: 1}}]\n",
			want: `queues[0] (a).usage: unknown resource "gpus"; want gpu, cpu, memory`,
		},
		"demand in a resource without capacity": {
			file: "capacity: {gpu: 1}\nqueues: [{name: a}]\ndemand: {a: {cpu: 1}}\n",
			want: `demand "a" cpu: is not in the capacity; add it there (0 if the cluster has none)`,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := Load(strings.NewReader(tc.file))
			if err == nil {
				t.Fatalf("Load returned no error, want %q", tc.want)
			}
			if diff := cmp.Diff(tc.want, err.Error()); diff != "" {
				t.Errorf("error (-want,+got):\n%s", diff)
			}
		})
	}
}
