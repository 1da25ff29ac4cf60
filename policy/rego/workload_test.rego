# Unit tests of the workload map (workload.rego). `go test ./policy/` runs
# them with coverage; operators run their own with `partita policy test DIR`.
package partita.workload_test

import data.partita.workload

# A pod template as the workload map hands it to the rules: metadata,
# containers' resources, and whether its pods ask for GPUs.
tmpl(gpu) := {"metadata": {}, "spec": {"containers": [{"name": "main"}]}, "gpu": gpu}

pod(labels) := {"namespace": "team-a", "name": "p-0", "uid": "u1", "labels": labels, "annotations": {}}

obj(api, kind, name, spec) := {
	"apiVersion": api, "kind": kind, "namespace": "team-a", "name": name, "uid": concat("-", [kind, name]),
	"labels": {}, "annotations": {}, "spec": spec,
}

input_of(p, chain) := {"pod": p, "chain": chain, "owner": chain[count(chain) - 1]}

gang_of(doc) := g if {
	g := workload.gang with input as doc
}

# ---- Job ----

indexed_job(parallelism, completions) := obj("batch/v1", "Job", "train", {
	"parallelism": parallelism, "completions": completions,
	"completionMode": "Indexed", "template": tmpl(true),
})

test_indexed_job_is_a_gang_of_its_parallelism if {
	g := gang_of(input_of(pod({}), [indexed_job(4, 8)]))
	g == {"name": "job-train", "minMember": 4, "elastic": false, "kind": "Job", "ownerName": "train"}
}

test_indexed_job_capped_by_completions if {
	gang_of(input_of(pod({}), [indexed_job(8, 3)])).minMember == 3
}

test_job_of_one_pod_is_no_gang if {
	not gang_of(input_of(pod({}), [indexed_job(1, 1)]))
}

test_parallel_job_is_no_gang_by_default if {
	j := obj("batch/v1", "Job", "work", {"parallelism": 4, "template": tmpl(true)})
	not gang_of(input_of(pod({}), [j]))
}

test_parallel_job_is_a_gang_with_jobs_all if {
	j := obj("batch/v1", "Job", "work", {"parallelism": 4, "template": tmpl(true)})
	g := workload.gang with input as input_of(pod({}), [j]) with data.partita.config.workloads.jobs as "all"
	g.minMember == 4
}

test_no_job_is_a_gang_with_jobs_none if {
	not workload.gang with input as input_of(pod({}), [indexed_job(4, 4)]) with data.partita.config.workloads.jobs as "none"
}

test_job_annotation_opts_in_and_out if {
	j := obj("batch/v1", "Job", "work", {"parallelism": 2, "template": tmpl(true)})
	opted := object.union(j, {"annotations": {"partita.dev/gang": "true"}})
	gang_of(input_of(pod({}), [opted])).minMember == 2
	out := object.union(indexed_job(4, 4), {"annotations": {"partita.dev/gang": "false"}})
	not gang_of(input_of(pod({}), [out]))
}

test_owner_queue_label_names_the_queue if {
	j := object.union(indexed_job(2, 2), {"labels": {"partita.dev/queue": "team-a"}})
	gang_of(input_of(pod({}), [j])).queue == "team-a"
}

# ---- JobSet and TrainJob ----

replicated(name, replicas, parallelism, gpu) := {
	"name": name, "replicas": replicas,
	"template": {"spec": {"parallelism": parallelism, "completions": parallelism, "template": tmpl(gpu)}},
}

jobset(name) := obj("jobset.x-k8s.io/v1alpha2", "JobSet", name, {"replicatedJobs": [
	replicated("driver", 1, 1, false),
	replicated("workers", 2, 4, true),
]})

test_jobset_counts_the_gpu_pods_of_every_replicated_job if {
	job := obj("batch/v1", "Job", "llama-ft-workers-0", {})
	g := gang_of(input_of(pod({}), [job, jobset("llama-ft")]))
	g == {"name": "jobset-llama-ft", "minMember": 8, "elastic": false, "kind": "JobSet", "ownerName": "llama-ft"}
}

test_jobset_without_gpu_pods_is_no_gang if {
	js := obj("jobset.x-k8s.io/v1alpha2", "JobSet", "cpu", {"replicatedJobs": [replicated("w", 2, 2, false)]})
	not gang_of(input_of(pod({}), [js]))
}

test_trainjob_is_the_gang_of_its_jobset if {
	tj := obj("trainer.kubeflow.org/v1alpha1", "TrainJob", "ft", {"trainer": {"numNodes": 8}})
	job := obj("batch/v1", "Job", "ft-node-0", {})
	g := gang_of(input_of(pod({}), [job, jobset("ft"), tj]))
	g == {"name": "trainjob-ft", "minMember": 8, "elastic": false, "kind": "TrainJob", "ownerName": "ft"}
}

# ---- topology and sub-groups ----

annotated(o, ann) := object.union(o, {"annotations": ann})

jobset_pod(rj, idx) := pod({"jobset.sigs.k8s.io/replicatedjob-name": rj, "jobset.sigs.k8s.io/job-index": idx})

test_topology_comes_from_the_top_owner if {
	js := annotated(jobset("llama-ft"), {
		"partita.dev/topology": "dc",
		"partita.dev/topology-required": "example.com/block",
		"partita.dev/topology-preferred": "example.com/rack",
	})
	job := annotated(obj("batch/v1", "Job", "llama-ft-workers-0", {}), {"partita.dev/topology": "ignored"})
	g := gang_of(input_of(pod({}), [job, js]))
	g.topology == {"topology": "dc", "required": "example.com/block", "preferred": "example.com/rack"}
	not g.subGroups
}

test_topology_in_kai_keys_and_partita_keys_win if {
	j := annotated(indexed_job(4, 4), {
		"kai.scheduler/topology": "kai-topo",
		"kai.scheduler/topology-required-placement": "example.com/block",
		"kai.scheduler/topology-preferred-placement": "example.com/rack",
		"partita.dev/topology-preferred": "kubernetes.io/hostname",
	})
	gang_of(input_of(pod({}), [j])).topology == {"topology": "kai-topo", "required": "example.com/block", "preferred": "kubernetes.io/hostname"}
}

test_no_topology_without_annotations if {
	g := gang_of(input_of(pod({}), [annotated(indexed_job(4, 4), {"partita.dev/topology": ""})]))
	not g.topology
}

test_topology_of_each_lws_group if {
	l := annotated(lws(4, {}), {"partita.dev/topology-required": "example.com/rack"})
	g := gang_of(input_of(pod({"leaderworkerset.sigs.k8s.io/group-index": "0"}), [l]))
	g.name == "leaderworkerset-vllm-0"
	g.topology == {"required": "example.com/rack"}
}

test_topology_of_a_native_workload if {
	wl := annotated(obj("scheduling.k8s.io/v1beta1", "Workload", "train", {}), {"kai.scheduler/topology-required-placement": "example.com/rack"})
	doc := {"pod": pod({}), "chain": [], "podGroup": native_pg({"gang": {"minCount": 2}}), "workload": wl}
	gang_of(doc).topology == {"required": "example.com/rack"}
	pg := annotated(native_pg({"gang": {"minCount": 2}}), {"partita.dev/topology-required": "example.com/block"})
	gang_of({"pod": pod({}), "chain": [], "podGroup": pg}).topology == {"required": "example.com/block"}
}

test_topology_of_a_custom_rule if {
	doc := object.union(input_of(pod({}), [annotated(indexed_job(4, 4), {"partita.dev/topology-required": "example.com/rack"})]), {"test": "one-rule"})
	gang_of(doc) == {"name": "mine", "minMember": 2, "topology": {"required": "example.com/rack"}}
	own := object.union(doc, {"test": "rule-topology"})
	gang_of(own).topology == {"preferred": "example.com/block"}
}

test_jobset_replicas_are_sub_groups if {
	js := annotated(jobset("llama-ft"), {
		"partita.dev/topology-required": "example.com/block",
		"partita.dev/sub-group-topology-required": "example.com/rack",
	})
	job := obj("batch/v1", "Job", "llama-ft-workers-1", {})
	g := gang_of(input_of(jobset_pod("workers", "1"), [job, js]))
	g == {
		"name": "jobset-llama-ft", "minMember": 8, "elastic": false, "kind": "JobSet", "ownerName": "llama-ft",
		"topology": {"required": "example.com/block"},
		"subGroups": [
			{"name": "workers-0", "minMember": 4, "topologyRequired": "example.com/rack"},
			{"name": "workers-1", "minMember": 4, "topologyRequired": "example.com/rack"},
		],
		"subGroup": "workers-1",
	}
}

test_jobset_sub_groups_preferred_and_of_every_gpu_job if {
	js := annotated(
		obj("jobset.x-k8s.io/v1alpha2", "JobSet", "pp", {"replicatedJobs": [
			replicated("driver", 1, 1, false),
			replicated("stage-a", 1, 2, true),
			replicated("stage-b", 2, 3, true),
			replicated("idle", 0, 3, true),
		]}),
		{"partita.dev/sub-group-topology-preferred": "example.com/rack"},
	)
	g := gang_of(input_of(jobset_pod("stage-b", "0"), [js]))
	g.minMember == 8
	g.subGroups == [
		{"name": "stage-a-0", "minMember": 2, "topologyPreferred": "example.com/rack"},
		{"name": "stage-b-0", "minMember": 3, "topologyPreferred": "example.com/rack"},
		{"name": "stage-b-1", "minMember": 3, "topologyPreferred": "example.com/rack"},
	]
	g.subGroup == "stage-b-0"
}

test_jobset_pod_of_no_listed_replica_joins_none if {
	js := annotated(jobset("x"), {"partita.dev/sub-group-topology-required": "example.com/rack"})
	g := gang_of(input_of(pod({}), [js]))
	count(g.subGroups) == 2
	not g.subGroup
	not gang_of(input_of(jobset_pod("workers", "7"), [js])).subGroup
}

test_trainjob_replicas_are_sub_groups if {
	tj := annotated(obj("trainer.kubeflow.org/v1alpha1", "TrainJob", "ft", {}), {"partita.dev/sub-group-topology-required": "example.com/rack"})
	js := annotated(jobset("ft"), {"partita.dev/sub-group-topology-preferred": "kubernetes.io/hostname"})
	g := gang_of(input_of(jobset_pod("workers", "0"), [obj("batch/v1", "Job", "ft-workers-0", {}), js, tj]))
	g.name == "trainjob-ft"
	g.subGroups[0] == {"name": "workers-0", "minMember": 4, "topologyRequired": "example.com/rack", "topologyPreferred": "kubernetes.io/hostname"}
	g.subGroup == "workers-0"
}

test_jobset_with_too_many_replicas_for_sub_groups_waits if {
	js := annotated(obj("jobset.x-k8s.io/v1alpha2", "JobSet", "big", {"replicatedJobs": [replicated("w", 65, 1, true)]}), {"partita.dev/sub-group-topology-required": "example.com/rack"})
	doc := input_of(jobset_pod("w", "0"), [js])
	g := gang_of(doc)
	g.minMember == 65
	not g.subGroups
	errs := workload.errors with input as doc
	errs == {"JobSet team-a/big asks for a sub-group per replica (partita.dev/sub-group-topology-*) but has 65 replicas with GPUs; a PodGroup holds at most 64 sub-groups: remove the annotation or use fewer replicas"}
}

# ---- LeaderWorkerSet ----

lws(size, leader) := obj("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "vllm", {
	"replicas": 2,
	"leaderWorkerTemplate": object.union({"size": size, "workerTemplate": tmpl(true)}, leader),
})

test_each_lws_group_is_a_gang if {
	sts := obj("apps/v1", "StatefulSet", "vllm", {})
	p := pod({"leaderworkerset.sigs.k8s.io/group-index": "1"})
	g := gang_of(input_of(p, [sts, lws(4, {})]))
	g == {"name": "leaderworkerset-vllm-1", "minMember": 4, "elastic": false, "kind": "LeaderWorkerSet", "ownerName": "vllm group 1"}
}

test_lws_leader_without_gpu_does_not_count if {
	p := pod({"leaderworkerset.sigs.k8s.io/group-index": "0"})
	gang_of(input_of(p, [lws(4, {"leaderTemplate": tmpl(false)})])).minMember == 3
}

# ---- PyTorchJob and MPIJob ----

pytorch(spec) := obj("kubeflow.org/v1", "PyTorchJob", "pt", spec)

test_pytorchjob_counts_master_and_workers if {
	pj := pytorch({"pytorchReplicaSpecs": {
		"Master": {"replicas": 1, "template": tmpl(true)},
		"Worker": {"replicas": 3, "template": tmpl(true)},
	}})
	g := gang_of(input_of(pod({"training.kubeflow.org/replica-type": "master"}), [pj]))
	g == {"name": "pytorchjob-pt", "minMember": 4, "elastic": false, "kind": "PyTorchJob", "ownerName": "pt"}
}

test_pytorchjob_elastic_workers_beyond_min_replicas if {
	pj := pytorch({
		"elasticPolicy": {"minReplicas": 2, "maxReplicas": 6},
		"pytorchReplicaSpecs": {"Worker": {"replicas": 6, "template": tmpl(true)}},
	})
	w := gang_of(input_of(pod({"training.kubeflow.org/replica-type": "worker"}), [pj]))
	w.minMember == 2
	w.elastic
}

test_pytorchjob_min_available_is_the_gang if {
	pj := pytorch({
		"runPolicy": {"schedulingPolicy": {"minAvailable": 3}},
		"pytorchReplicaSpecs": {"Worker": {"replicas": 5, "template": tmpl(true)}},
	})
	gang_of(input_of(pod({}), [pj])).minMember == 3
}

test_mpijob_leaves_out_a_launcher_without_gpus if {
	mj := obj("kubeflow.org/v2beta1", "MPIJob", "mpi", {"mpiReplicaSpecs": {
		"Launcher": {"replicas": 1, "template": tmpl(false)},
		"Worker": {"replicas": 4, "template": tmpl(true)},
	}})
	g := gang_of(input_of(pod({}), [mj]))
	g.name == "mpijob-mpi"
	g.minMember == 4
}

# ---- RayCluster and RayJob ----

raycluster(name, head_gpu) := obj("ray.io/v1", "RayCluster", name, {
	"headGroupSpec": {"template": tmpl(head_gpu)},
	"workerGroupSpecs": [
		{"groupName": "gpu", "replicas": 2, "minReplicas": 2, "maxReplicas": 6, "template": tmpl(true)},
		{"groupName": "cpu", "replicas": 4, "minReplicas": 1, "maxReplicas": 4, "template": tmpl(false)},
	],
})

test_raycluster_head_and_min_workers_start_together if {
	head := gang_of(input_of(pod({"ray.io/node-type": "head"}), [raycluster("rc", true)]))
	head == {"name": "raycluster-rc", "minMember": 3, "elastic": false, "kind": "RayCluster", "ownerName": "rc"}
	worker := gang_of(input_of(pod({"ray.io/node-type": "worker"}), [raycluster("rc", true)]))
	worker.minMember == 3
	worker.elastic
}

test_raycluster_head_without_gpu_does_not_count if {
	gang_of(input_of(pod({"ray.io/node-type": "worker"}), [raycluster("rc", false)])).minMember == 2
}

test_raycluster_replicas_without_min_replicas if {
	rc := obj("ray.io/v1", "RayCluster", "rc", {
		"headGroupSpec": {"template": tmpl(false)},
		"workerGroupSpecs": [{"groupName": "gpu", "replicas": 3, "numOfHosts": 2, "template": tmpl(true)}],
	})
	gang_of(input_of(pod({"ray.io/node-type": "worker"}), [rc])).minMember == 6
}

test_rayjob_is_the_gang_of_its_raycluster if {
	rj := obj("ray.io/v1", "RayJob", "rj", {})
	g := gang_of(input_of(pod({"ray.io/node-type": "worker"}), [raycluster("rj-raycluster-x", true), rj]))
	g.name == "rayjob-rj"
	g.minMember == 3
}

test_rayjob_submitter_is_no_gang if {
	rj := obj("ray.io/v1", "RayJob", "rj", {})
	submitter := obj("batch/v1", "Job", "rj", {"template": tmpl(true)})
	not gang_of(input_of(pod({}), [submitter, rj]))
}

# ---- the native Workload API ----

native_pg(gang) := object.union(obj("scheduling.k8s.io/v1beta1", "PodGroup", "train-pg", {}), {"spec": {
	"workloadRef": {"workloadName": "train", "templateName": "workers"},
	"schedulingPolicy": gang,
	"priorityClassName": "low",
}})

test_native_podgroup_gang_policy if {
	doc := {
		"pod": object.union(pod({}), {"schedulingGroup": {"podGroupName": "train-pg"}}),
		"chain": [indexed_job(8, 8)], "owner": indexed_job(8, 8),
		"podGroup": native_pg({"gang": {"minCount": 6}}),
		"workload": obj("scheduling.k8s.io/v1beta1", "Workload", "train", {}),
	}
	g := gang_of(doc)
	g == {
		"name": "podgroup-train-pg", "minMember": 6, "elastic": false,
		"kind": "Workload", "ownerName": "train", "priorityClassName": "low",
	}
	two := object.union(doc, {"workload": obj("scheduling.k8s.io/v1beta1", "Workload", "train", {"podGroupTemplates": [{"name": "a"}, {"name": "workers"}]})})
	gang_of(two).ownerName == "train group workers"
}

test_native_podgroup_without_workload if {
	doc := {"pod": pod({}), "chain": [], "podGroup": native_pg({"gang": {"minCount": 2}})}
	g := gang_of(doc)
	g.kind == "PodGroup"
	g.ownerName == "train-pg"
}

test_native_basic_policy_is_no_gang if {
	doc := {"pod": pod({}), "chain": [], "podGroup": native_pg({"basic": {}})}
	not gang_of(doc)
}

test_native_basic_policy_leaves_the_owner_rule if {
	doc := {"pod": pod({}), "chain": [indexed_job(3, 3)], "owner": indexed_job(3, 3), "podGroup": native_pg({"basic": {}})}
	gang_of(doc).name == "job-train"
}

test_job_asking_basic_scheduling_is_no_gang if {
	j := object.union(indexed_job(3, 3), {"spec": object.union(indexed_job(3, 3).spec, {"scheduling": {"schedulingPolicy": {"basic": {}}}})})
	not gang_of(input_of(pod({}), [j]))
}

# ---- operators' rules ----

test_bare_pod_is_no_gang if {
	not gang_of({"pod": pod({}), "chain": []})
}

test_custom_rule_comes_first if {
	g := gang_of(object.union(input_of(pod({}), [indexed_job(4, 4)]), {"test": "one-rule"}))
	g == {"name": "mine", "minMember": 2}
}

test_two_custom_rules_are_an_error if {
	doc := object.union(input_of(pod({}), [indexed_job(4, 4)]), {"test": "two-rules"})
	not gang_of(doc)
	errs := workload.errors with input as doc
	errs == {`2 custom workload rules answer for this pod (["a", "b"]); make their conditions exclusive`}
}

test_disabled_builtin_rule if {
	not gang_of(object.union(input_of(pod({}), [indexed_job(4, 4)]), {"test": "disable-jobs"}))
}

test_watch_adds_custom_kinds if {
	{"group": "example.com", "kind": "Trainer", "spec": true} in workload.watch
	{"group": "jobset.x-k8s.io", "kind": "JobSet", "spec": true} in workload.watch
}

test_watch_counts_builtin_and_custom_kinds if {
	count(workload.watch) == 12
}
