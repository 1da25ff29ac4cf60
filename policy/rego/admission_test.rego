# Unit tests of the default admission policy. `go test ./policy/` runs them
# with coverage; operators run their own with `partita policy test DIR`.
package partita.admission_test

import data.partita.admission

state := {
	"queues": {
		"research": {
			"parent": "", "children": ["team-a", "team-b"], "ancestors": [],
			"namespaces": [], "namespaceSelector": false,
			"gpu": {"quotaMilli": 8000, "limitMilli": 16000, "allocatedMilli": 0, "requestedMilli": 0, "effectiveLimitMilli": 16000},
		},
		"team-a": {
			"parent": "research", "children": [], "ancestors": ["research"],
			"namespaces": ["team-a"], "namespaceSelector": false,
			"gpu": {"quotaMilli": 4000, "limitMilli": 8000, "allocatedMilli": 1000, "requestedMilli": 2000, "effectiveLimitMilli": 8000},
		},
		"team-b": {
			"parent": "research", "children": [], "ancestors": ["research"],
			"namespaces": [], "namespaceSelector": true,
			"gpu": {"quotaMilli": 4000, "limitMilli": -1, "allocatedMilli": 0, "requestedMilli": 0, "effectiveLimitMilli": 16000},
		},
		"open": {
			"parent": "", "children": [], "ancestors": [],
			"namespaces": [], "namespaceSelector": false,
			"gpu": {"quotaMilli": 0, "limitMilli": 2000, "allocatedMilli": 0, "requestedMilli": 0, "effectiveLimitMilli": 2000},
		},
	},
	"namespaces": {
		"team-a": {"labels": {"partita.dev/default-queue": "team-a"}, "queues": []},
		"team-b": {"labels": {"team": "b"}, "queues": ["team-b"]},
		"ghost": {"labels": {"partita.dev/default-queue": "missing"}, "queues": []},
		"other": {"labels": {}, "queues": []},
		"lent": {"labels": {"partita.dev/default-queue": "team-a"}, "queues": []},
	},
}

config := {"maxGPUMilliPerPod": 0, "minGPUMilli": 0, "requireQueue": false}

pod(ns, queue, milli) := {
	"operation": "CREATE",
	"namespace": ns,
	"request": {
		"queue": queue, "gpuMilli": milli, "minMember": 0,
		"containers": [{"name": "main", "count": 1, "milli": milli, "memoryMiB": 0, "milliPerDevice": milli, "gpuMilli": milli}],
	},
}

decide(req) := {"deny": deny, "patch": patch_of(req)} if {
	deny := admission.deny with input as req
		with data.partita.state as state
		with data.partita.config as config
}

patch_of(req) := p if {
	p := admission.patch with input as req
		with data.partita.state as state
		with data.partita.config as config
} else := {}

test_leaf_queue_of_own_namespace_allowed if {
	d := decide(pod("team-a", "team-a", 500))
	count(d.deny) == 0
	d.patch == {}
}

test_default_queue_patched if {
	d := decide(pod("team-a", "", 500))
	count(d.deny) == 0
	d.patch == {"labels": {"partita.dev/queue": "team-a"}}
}

test_no_queue_allowed_unless_required if {
	count(decide(pod("other", "", 500)).deny) == 0
	admission.deny == {`pod names no queue: set the label partita.dev/queue to a leaf queue, or give namespace other a default with the label partita.dev/default-queue`} with input as pod("other", "", 500)
		with data.partita.state as state
		with data.partita.config as object.union(config, {"requireQueue": true})
}

test_missing_queue_denied if {
	decide(pod("team-a", "nope", 500)).deny == {`queue "nope" (label partita.dev/queue) does not exist; create the Queue or name an existing leaf queue`}
}

test_missing_default_queue_denied if {
	decide(pod("ghost", "", 500)).deny == {`queue "missing" (namespace ghost's default queue (label partita.dev/default-queue)) does not exist; create the Queue or name an existing leaf queue`}
}

test_parent_queue_denied if {
	some msg in decide(pod("team-a", "research", 500)).deny
	startswith(msg, `queue "research" (label partita.dev/queue) is not a leaf: it has child queues team-a, team-b;`)
}

test_foreign_namespace_denied if {
	decide(pod("other", "team-a", 500)).deny == {`namespace other may not submit to queue "team-a"; add other to the queue's spec.namespaces or match it with spec.namespaceSelector, or name another queue`}
}

test_selector_namespace_allowed if {
	count(decide(pod("team-b", "team-b", 500)).deny) == 0
}

test_selector_queue_refuses_unselected if {
	count(decide(pod("other", "team-b", 500)).deny) == 1
}

test_open_queue_allowed_everywhere if {
	count(decide(pod("other", "open", 500)).deny) == 0
}

test_over_queue_limit_denied if {
	decide(pod("other", "open", 2500)).deny == {`the pod asks for 2.5 GPUs, more than the 2 GPU limit of queue "open" and its parents; it could never be admitted: ask for less, or raise the queue's spec.resources.gpu.limit`}
}

test_at_queue_limit_allowed if {
	count(decide(pod("other", "open", 2000)).deny) == 0
}

test_parent_limit_applies if {
	# team-b has no limit of its own; research caps it at 16.
	count(decide(pod("team-b", "team-b", 16000)).deny) == 0
	count(decide(pod("team-b", "team-b", 16001)).deny) == 1
}

test_gang_over_limit_denied if {
	gang := json.patch(pod("team-a", "team-a", 2000), [{"op": "replace", "path": "/request/minMember", "value": 5}])
	decide(gang).deny == {`the gang of 5 pods asks for 10 GPUs, more than the 8 GPU limit of queue "team-a" and its parents; it could never be admitted: ask for less, or raise the queue's spec.resources.gpu.limit`}
}

test_per_pod_ceiling if {
	admission.deny == {`the pod asks for 4 GPUs; this cluster allows at most 2 per pod: split the work across pods, or ask for less`} with input as pod("other", "", 4000)
		with data.partita.state as state
		with data.partita.config as object.union(config, {"maxGPUMilliPerPod": 2000})
}

test_minimum_fraction if {
	admission.deny == {`container main asks for 0.05 of a GPU; the smallest slice this cluster gives is 0.1: ask for at least that much`} with input as pod("other", "", 50)
		with data.partita.state as state
		with data.partita.config as object.union(config, {"minGPUMilli": 100})
}

test_gpus_formatting if {
	admission.gpus(1000) == "1"
	admission.gpus(1500) == "1.5"
	admission.gpus(125) == "0.125"
}

test_default_label_lets_a_namespace_use_the_queue if {
	# lent is not in team-a's spec.namespaces, but names it as its default.
	d := decide(pod("lent", "", 500))
	count(d.deny) == 0
	d.patch == {"labels": {"partita.dev/queue": "team-a"}}
}

test_namespace_unknown_to_the_state if {
	count(decide(pod("brand-new", "open", 500)).deny) == 0
	count(decide(pod("brand-new", "team-a", 500)).deny) == 1
}

pod_group(ns, queue) := {
	"kind": "PodGroup",
	"operation": "CREATE",
	"namespace": ns,
	"podGroup": {"name": "train", "labels": {}, "annotations": {}, "queue": queue, "minMember": 4, "priorityClassName": "", "priority": 0},
	"request": {"queue": queue, "podGroup": "train", "minMember": 4},
}

test_pod_group_own_queue_allowed if {
	d := decide(pod_group("team-a", "team-a"))
	count(d.deny) == 0
	d.patch == {}
}

test_pod_group_foreign_queue_denied if {
	decide(pod_group("other", "team-a")).deny == {`namespace other may not submit to queue "team-a"; add other to the queue's spec.namespaces or match it with spec.namespaceSelector, or name another queue`}
}

test_pod_group_missing_queue_denied if {
	decide(pod_group("team-a", "nope")).deny == {`queue "nope" (spec.queue of PodGroup train) does not exist; create the Queue or name an existing leaf queue`}
}

test_pod_group_parent_queue_denied if {
	some msg in decide(pod_group("team-a", "research")).deny
	startswith(msg, `queue "research" (spec.queue of PodGroup train) is not a leaf`)
}

test_pod_group_without_queue_leaves_it_to_members if {
	# Neither the namespace's default nor requireQueue applies: the members
	# bring their queue, and each is asked about.
	d := decide(pod_group("ghost", ""))
	count(d.deny) == 0
	d.patch == {}
	count(admission.deny) == 0 with input as pod_group("other", "")
		with data.partita.state as state
		with data.partita.config as object.union(config, {"requireQueue": true})
}

test_pod_group_default_label_does_not_lend_a_queue if {
	# lent may use team-a for pods that name no queue (its default), but a
	# PodGroup that names team-a is checked like a pod that names it.
	count(decide(pod_group("lent", "team-a")).deny) == 1
}
