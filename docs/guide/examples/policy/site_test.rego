package site_test

import data.partita.admission
import data.partita.quota

# A cluster with one open queue, as data.partita.state would hold it.
state := {
	"queues": {"ml": {
		"parent": "", "children": [], "ancestors": [],
		"namespaces": [], "namespaceSelector": false, "priority": 100,
		"gpu": {"quotaMilli": 4000, "limitMilli": -1, "allocatedMilli": 0, "requestedMilli": 0, "effectiveLimitMilli": -1},
		"pendingWorkloads": 0,
	}},
	"namespaces": {"team-a": {"labels": {}, "queues": []}},
}

config := {"maxGPUMilliPerPod": 0, "minGPUMilli": 0, "requireQueue": false}

notebook(milli) := {
	"operation": "CREATE",
	"namespace": "team-a",
	"pod": {"name": "nb", "labels": {"app.kubernetes.io/component": "notebook"}, "annotations": {}},
	"request": {
		"dialect": "partita", "queue": "ml", "podGroup": "", "placement": "",
		"gpuMilli": milli, "minMember": 0,
		"containers": [{"name": "main", "count": 1, "milli": milli, "memoryMiB": 0,
			"coresPercent": 0, "milliPerDevice": milli, "gpuMilli": milli}],
	},
}

test_half_gpu_notebook_allowed if {
	count(admission.deny) == 0 with input as notebook(500)
		with data.partita.state as state
		with data.partita.config as config
}

test_whole_gpu_notebook_refused if {
	admission.deny == {"notebooks get at most half a GPU; this one asks for 1000 milli-GPUs: ask for partita.dev/gpu-fraction 0.5 or less"} with input as notebook(1000)
		with data.partita.state as state
		with data.partita.config as config
}

workload(q, milli) := {
	"workload": {"namespace": "team-a", "name": "train", "kind": "PodGroup", "queue": q,
		"members": 4, "gpuMilli": milli, "priority": 0},
	"queue": {"name": q, "priority": 100,
		"gpu": {"quotaMilli": 0, "limitMilli": -1, "allocatedMilli": 0, "fairShareMilli": 8000}},
	"ancestors": [],
	"cluster": {"gpuMilli": 32000},
}

test_batch_gang_of_8_waits if {
	quota.deny == {"PodGroup team-a/train asks for 8000 milli-GPUs; the batch queue admits at most 4 GPUs per workload"} with input as workload("batch", 8000)
}

test_batch_gang_of_4_admitted if {
	count(quota.deny) == 0 with input as workload("batch", 4000)
}

test_other_queues_unaffected if {
	count(quota.deny) == 0 with input as workload("ml", 8000)
}
