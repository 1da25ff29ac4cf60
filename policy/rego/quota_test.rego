# Unit tests of the default quota policy. `go test ./policy/` runs them with
# coverage; operators run their own with `partita policy test DIR`.
package partita.quota_test

import data.partita.quota

gpu(limit, allocated) := {"quotaMilli": 4000, "limitMilli": limit, "allocatedMilli": allocated, "fairShareMilli": 4000}

# A workload of milli milli-GPUs for team-a, whose own limit and usage are
# team; ancestors lists the chain above it, parent first.
req(milli, team, ancestors) := {
	"workload": {
		"namespace": "team-a", "name": "train-1", "kind": "PodGroup", "queue": "team-a",
		"members": 2, "gpuMilli": milli, "priority": 100,
	},
	"queue": {"name": "team-a", "priority": 100, "gpu": team},
	"ancestors": ancestors,
	"cluster": {"gpuMilli": 32000},
}

research(limit, allocated) := {"name": "research", "priority": 100, "gpu": gpu(limit, allocated)}

org(limit, allocated) := {"name": "org", "priority": 100, "gpu": gpu(limit, allocated)}

deny(doc) := d if {
	d := quota.deny with input as doc
}

test_under_limit_allowed if {
	count(deny(req(2000, gpu(8000, 3000), [research(16000, 3000)]))) == 0
}

test_exactly_at_limit_allowed if {
	count(deny(req(1000, gpu(4000, 3000), []))) == 0
}

test_full_queue_denied if {
	deny(req(1000, gpu(4000, 4000), [])) == {"queue team-a is at its limit: 4 of 4 GPUs"}
}

test_queue_over_its_limit_denied if {
	# The limit was lowered below what the queue already holds.
	deny(req(500, gpu(2000, 3500), [])) == {"queue team-a is at its limit: 3.5 of 2 GPUs"}
}

test_some_room_but_not_enough if {
	deny(req(2000, gpu(4000, 3000), [])) == {"queue team-a is at its limit: 3 of 4 GPUs, and the workload needs 2"}
}

test_fractions_in_messages if {
	deny(req(1500, gpu(4500, 3250), [])) == {"queue team-a is at its limit: 3.25 of 4.5 GPUs, and the workload needs 1.5"}
}

test_no_limit if {
	count(deny(req(64000, gpu(-1, 100000), [research(-1, 100000)]))) == 0
}

test_zero_limit_admits_nothing if {
	deny(req(100, gpu(0, 0), [])) == {"queue team-a is at its limit: 0 of 0 GPUs"}
}

test_zero_gpu_workload_fits_a_full_queue if {
	count(deny(req(0, gpu(4000, 4000), []))) == 0
}

test_parent_limit if {
	deny(req(1000, gpu(-1, 2000), [research(8000, 8000)])) == {"queue research (parent of team-a) is at its limit: 8 of 8 GPUs"}
	deny(req(2000, gpu(-1, 2000), [research(8000, 7000)])) == {"queue research (parent of team-a) is at its limit: 7 of 8 GPUs, and the workload needs 2"}
}

test_only_the_full_ancestor_denies if {
	deny(req(2000, gpu(8000, 1000), [research(16000, 9000), org(10000, 9000)])) == {"queue org (ancestor of team-a) is at its limit: 9 of 10 GPUs, and the workload needs 2"}
}

test_every_full_queue_is_named if {
	deny(req(2000, gpu(2000, 1000), [research(4000, 4000), org(-1, 9000)])) == {
		"queue team-a is at its limit: 1 of 2 GPUs, and the workload needs 2",
		"queue research (parent of team-a) is at its limit: 4 of 4 GPUs",
	}
}

test_gpus_formatting if {
	quota.gpus(0) == "0"
	quota.gpus(1000) == "1"
	quota.gpus(2500) == "2.5"
	quota.gpus(125) == "0.125"
}

# The CPU and memory limits. A workload of cpu milli-CPUs and mem bytes for
# team-a, whose own CPU and memory limits and usage are given.
res_req(cpu, mem, team_cpu, team_mem, ancestors) := {
	"workload": {
		"namespace": "team-a", "name": "train-1", "kind": "PodGroup", "queue": "team-a",
		"members": 2, "gpuMilli": 1000, "cpuMilli": cpu, "memoryBytes": mem, "priority": 100,
	},
	"queue": {"name": "team-a", "priority": 100, "gpu": gpu(-1, 0), "cpu": team_cpu, "memory": team_mem},
	"ancestors": ancestors,
	"cluster": {"gpuMilli": 32000, "cpuMilli": 256000, "memoryBytes": 1099511627776},
}

cpu(limit, allocated) := {"quotaMilli": 0, "limitMilli": limit, "allocatedMilli": allocated, "fairShareMilli": 0}

mem(limit, allocated) := {"quotaBytes": 0, "limitBytes": limit, "allocatedBytes": allocated, "fairShareBytes": 0}

gi := 1073741824

test_cpu_and_memory_under_limits if {
	count(deny(res_req(8000, 64 * gi, cpu(64000, 56000), mem(256 * gi, 192 * gi), []))) == 0
}

test_no_cpu_or_memory_limit if {
	count(deny(res_req(8000, 64 * gi, cpu(-1, 640000), mem(-1, 1024 * gi), []))) == 0
}

test_cpu_limit if {
	deny(res_req(8000, 0, cpu(64000, 60000), mem(-1, 0), [])) == {"queue team-a is at its CPU limit: 60 of 64 CPUs, and the workload needs 8"}
	deny(res_req(500, 0, cpu(4000, 4000), mem(-1, 0), [])) == {"queue team-a is at its CPU limit: 4 of 4 CPUs"}
}

test_memory_limit if {
	deny(res_req(0, 64 * gi, cpu(-1, 0), mem(256 * gi, 224 * gi), [])) == {"queue team-a is at its memory limit: 224Gi of 256Gi, and the workload needs 64Gi"}
	deny(res_req(0, gi / 2, cpu(-1, 0), mem(gi + gi / 2, gi + gi / 2), [])) == {"queue team-a is at its memory limit: 1.5Gi of 1.5Gi"}
}

test_parent_cpu_and_memory_limits if {
	parent := {"name": "research", "priority": 100, "gpu": gpu(-1, 0), "cpu": cpu(16000, 12000), "memory": mem(64 * gi, 60 * gi)}
	deny(res_req(8000, 8 * gi, cpu(-1, 0), mem(-1, 0), [parent])) == {
		"queue research (parent of team-a) is at its CPU limit: 12 of 16 CPUs, and the workload needs 8",
		"queue research (parent of team-a) is at its memory limit: 60Gi of 64Gi, and the workload needs 8Gi",
	}
}

test_a_workload_without_cpu_fits_a_full_queue if {
	count(deny(res_req(0, 0, cpu(4000, 4000), mem(gi, gi), []))) == 0
}
