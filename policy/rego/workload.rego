# Partita's workload map (docs/workloads.md, docs/policy.md): how the pods of
# each kind of AI workload group into gangs.
#
# The admission loop asks data.partita.workload.gang for every GPU pod that
# names no pod group of its own (label partita.dev/pod-group, the
# coscheduling label, Run:ai's annotation): the answer makes the pod a member
# of a gang, and an undefined answer leaves it a single pod.
#
# input (docs/policy.md has the full shape):
#   pod      the pod: namespace, name, uid, labels, annotations, and
#            schedulingGroup (spec.schedulingGroup of the native Workload API)
#   chain    the pod's controllers, read through ownerReferences: its own
#            controller first, the top owner last; each with apiVersion,
#            kind, namespace, name, uid, labels, annotations, and, for the
#            kinds `kinds` marks spec: true, the spec, in which every pod
#            template keeps only its metadata, its containers' names and
#            resources, and "gpu": whether its pods ask for GPUs
#   owner    the last of chain (absent when the pod has no controller)
#   podGroup the native scheduling.k8s.io PodGroup the pod's schedulingGroup
#            names, with its spec; workload the Workload that PodGroup's
#            workloadRef names
#
# gang is {"name", "minMember", "elastic", "queue", "priorityClassName",
# "kind", "ownerName"}: name is the gang's name in the namespace (the
# PodGroup Partita keeps its status in), minMember how many of its GPU pods
# must fit before any starts, elastic whether this pod may run as one of the
# members beyond the minimum (admitted as room allows, reclaimed first),
# queue and priorityClassName optional, kind/ownerName what `kubectl partita
# why` calls the workload. It may carry "topology" ({"topology", "required",
# "preferred"}: a Topology and its levels), "subGroups" (the gang's parts:
# [{"name", "minMember", "topologyRequired", "topologyPreferred"}]) and
# "subGroup" (the one this pod joins); the built-in rules read the topology
# from the top owner's annotations (with_topology) and make a JobSet's
# replicas sub-groups when it asks (replica_parts).
#
# Operators add rules in a module of package partita.workload.custom (a
# ConfigMap labelled partita.dev/policy=rego): `rules contains g if {...}` is
# asked before the built-in rules, `disabled contains "GROUP/KIND"` switches
# a built-in rule off, and `kinds contains {...}` names more kinds to watch.
package partita.workload

# The kinds the extender watches to resolve a pod's owners: only those the
# API server serves are watched. spec: true keeps the object's spec for the
# rules; false keeps its metadata only (a link in a chain).
kinds contains {"group": "batch", "kind": "Job", "spec": true}

kinds contains {"group": "apps", "kind": "StatefulSet", "spec": false}

kinds contains {"group": "jobset.x-k8s.io", "kind": "JobSet", "spec": true}

kinds contains {"group": "leaderworkerset.x-k8s.io", "kind": "LeaderWorkerSet", "spec": true}

kinds contains {"group": "trainer.kubeflow.org", "kind": "TrainJob", "spec": true}

kinds contains {"group": "kubeflow.org", "kind": "PyTorchJob", "spec": true}

kinds contains {"group": "kubeflow.org", "kind": "MPIJob", "spec": true}

kinds contains {"group": "ray.io", "kind": "RayCluster", "spec": true}

kinds contains {"group": "ray.io", "kind": "RayJob", "spec": true}

kinds contains {"group": "scheduling.k8s.io", "kind": "PodGroup", "spec": true}

kinds contains {"group": "scheduling.k8s.io", "kind": "Workload", "spec": true}

# watch is every kind to watch: the built-in ones and the operator's.
watch := kinds | k if {
	k := data.partita.workload.custom.kinds
} else := kinds

# The operator's rules (package partita.workload.custom), empty without.
custom_rules := r if {
	r := data.partita.workload.custom.rules
} else := set()

disabled_kinds := d if {
	d := data.partita.workload.custom.disabled
} else := set()

# The answer: an operator's rule first, then the built-in rule of the top
# owner's kind; undefined leaves the pod a single pod.
gang := with_topology(with_queue(g)) if {
	count(custom_rules) == 1
	some g in custom_rules
} else := with_topology(with_queue(g)) if {
	count(custom_rules) == 0
	not disabled_kinds[builtin_kind]
	g := builtin
}

# A workload whose top owner carries the label partita.dev/queue goes to
# that queue (the PodGroup Partita keeps for it names it, and the PodGroup
# webhook checks the namespace may use it), unless the rule chose one.
with_queue(g) := object.union({"queue": q}, g) if {
	q := input.owner.labels["partita.dev/queue"]
} else := g

# A workload's topology (docs/topology.md) is what its top owner's
# annotations ask, unless the rule chose one: Partita's keys first, then
# KAI-Scheduler's, which KAI reads on the top owner too (a Job's, a JobSet's
# metadata.annotations). Each key is read on its own, as the webhook reads a
# pod's.
with_topology(g) := object.union(g, {"topology": t}) if {
	not g.topology
	t := owner_topology
	count(t) > 0
} else := g

owner_topology := {field: v |
	some field, keys in topology_keys
	v := first_annotation([top_owner], keys)
}

topology_keys := {
	"topology": ["partita.dev/topology", "kai.scheduler/topology"],
	"required": ["partita.dev/topology-required", "kai.scheduler/topology-required-placement"],
	"preferred": ["partita.dev/topology-preferred", "kai.scheduler/topology-preferred-placement"],
}

# first_annotation is the first value, not empty, of keys on objs, the
# objects in turn and for each the keys in turn; undefined when none.
first_annotation(objs, keys) := vs[0] if {
	vs := [v |
		some o in objs
		some k in keys
		v := o.annotations[k]
		v != ""
	]
	count(vs) > 0
}

# top_owner is the object the gang's PodGroup is owned by, as the workload
# map picks it: the top of the chain, else the native Workload, else the
# native PodGroup.
top_owner := input.owner if {
	input.owner.kind != "Pod"
} else := input.workload if {
	input.workload
} else := input.podGroup

# Two custom rules that both answer for one pod are a mistake in the
# policy: the admission loop keeps the pod waiting with this message.
errors contains msg if {
	count(custom_rules) > 1
	msg := sprintf("%d custom workload rules answer for this pod (%v); make their conditions exclusive", [count(custom_rules), sort([object.get(g, "name", "?") | some g in custom_rules])])
}

# owner is the top of the chain; top_group its API group.
top_group := api_group(input.owner.apiVersion)

api_group(v) := g if {
	contains(v, "/")
	g := split(v, "/")[0]
} else := ""

# builtin_kind names the rule that answers, as disabled lists it.
builtin_kind := "scheduling.k8s.io/PodGroup" if {
	native_gang
} else := sprintf("%s/%s", [top_group, input.owner.kind])

# A pod of the native Workload API names its PodGroup itself, whatever its
# controller: a gang policy there is the answer. The basic policy (what the
# Job controller writes unless the Job's spec.scheduling asks for a gang)
# declares no gang, and the rule of the pod's owner decides.
native_gang if input.podGroup.spec.schedulingPolicy.gang

builtin := g if {
	native_gang
	g := native(input.podGroup)
} else := g if {
	input.owner.kind == "Job"
	top_group == "batch"
	g := job(input.owner)
} else := g if {
	input.owner.kind == "JobSet"
	top_group == "jobset.x-k8s.io"
	g := named(input.owner, with_replica_parts(jobset_gang(input.owner), input.owner, [input.owner]))
} else := g if {
	input.owner.kind == "LeaderWorkerSet"
	top_group == "leaderworkerset.x-k8s.io"
	g := lws(input.owner)
} else := g if {
	input.owner.kind == "TrainJob"
	top_group == "trainer.kubeflow.org"
	some js in input.chain
	js.kind == "JobSet"
	g := named(input.owner, with_replica_parts(jobset_gang(js), js, [input.owner, js]))
} else := g if {
	input.owner.kind in {"PyTorchJob", "MPIJob"}
	top_group == "kubeflow.org"
	g := named(input.owner, kubeflow_gang(input.owner))
} else := g if {
	input.owner.kind == "RayCluster"
	top_group == "ray.io"
	g := named(input.owner, ray_gang(input.owner))
} else := g if {
	input.owner.kind == "RayJob"
	top_group == "ray.io"
	some rc in input.chain
	rc.kind == "RayCluster"
	g := named(input.owner, ray_gang(rc))
}

# named completes a gang with the name and kind of the workload it is for:
# "<kind>-<name>", so that two kinds never share a gang name.
named(owner, g) := object.union(g, {
	"name": sprintf("%s-%s", [lower(owner.kind), owner.name]),
	"kind": owner.kind, "ownerName": owner.name,
})

# A per-object switch: the annotation partita.dev/gang "true" or "false" on
# the workload's top owner overrides the rule's choice for that object.
opted_out(o) if o.annotations["partita.dev/gang"] == "false"

opted_in(o) if o.annotations["partita.dev/gang"] == "true"

# ---- batch/v1 Job -------------------------------------------------------

# Which Jobs are gangs: data.partita.config.workloads.jobs is "indexed"
# (the default: Indexed Jobs, the form distributed training takes, one rank
# per index), "all" (every parallel Job, what --implicit-job-gangs did) or
# "none". The Job's annotation partita.dev/gang decides for one Job.
job_mode := m if {
	m := data.partita.config.workloads.jobs
	m != ""
} else := "indexed"

job_is_gang(j) if opted_in(j)

job_is_gang(j) if {
	not opted_out(j)
	not asks_basic(j)
	job_mode == "all"
}

job_is_gang(j) if {
	not opted_out(j)
	not asks_basic(j)
	job_mode == "indexed"
	j.spec.completionMode == "Indexed"
}

# A Job whose spec.scheduling (Kubernetes 1.37) asks for basic scheduling
# wants its pods one by one.
asks_basic(j) if j.spec.scheduling.schedulingPolicy.basic

job(j) := g if {
	job_is_gang(j)
	n := job_size(j.spec)
	n > 1
	g := named(j, {"minMember": n, "elastic": false})
}

# A Job runs min(parallelism, completions) pods at once; parallelism
# defaults to 1 and completions to parallelism.
job_size(spec) := min({p, c}) if {
	p := object.get(spec, "parallelism", 1)
	c := object.get(spec, "completions", p)
}

# ---- jobset.x-k8s.io JobSet (and Kubeflow Trainer's TrainJob) -----------

# Every replicated Job's pods that ask for GPUs, all of them together.
jobset_gang(js) := {"minMember": n, "elastic": false} if {
	not opted_out(js)
	n := sum([m |
		some rj in js.spec.replicatedJobs
		rj.template.spec.template.gpu
		m := object.get(rj, "replicas", 1) * job_size(rj.template.spec)
	])
	n > 0
}

# Each replica of a replicated Job is a sub-group when the JobSet (or the
# TrainJob above it; annotated lists the objects to read, the top owner
# first) carries partita.dev/sub-group-topology-required or -preferred: e.g.
# every replica (a tensor-parallel group) within one rack, while the
# workload's own partita.dev/topology-required keeps the whole job within
# one block. A replica is "<replicatedJob>-<jobIndex>" with its Job's pods
# (only replicated Jobs whose pods ask for GPUs: the others are no part of
# the gang), and the pod joins its own replica's, read from the labels
# JobSet puts on its pods.
with_replica_parts(g, js, annotated) := object.union(g, object.union({"subGroups": parts}, pod_part(parts))) if {
	parts := replica_parts(js, annotated)
	count(parts) > 0
	count(parts) <= max_sub_groups
} else := g

replica_parts(js, annotated) := [object.union({"name": sprintf("%s-%d", [rj.name, i]), "minMember": size}, levels) |
	levels := sub_group_levels(annotated)
	count(levels) > 0
	some rj in js.spec.replicatedJobs
	rj.template.spec.template.gpu
	size := job_size(rj.template.spec)
	size > 0
	n := object.get(rj, "replicas", 1)
	n > 0
	some i in numbers.range(0, n - 1)
]

sub_group_levels(objs) := {field: v |
	some field, key in {
		"topologyRequired": "partita.dev/sub-group-topology-required",
		"topologyPreferred": "partita.dev/sub-group-topology-preferred",
	}
	v := first_annotation(objs, [key])
}

pod_part(parts) := {"subGroup": name} if {
	name := sprintf("%s-%s", [
		input.pod.labels["jobset.sigs.k8s.io/replicatedjob-name"],
		input.pod.labels["jobset.sigs.k8s.io/job-index"],
	])
	some p in parts
	p.name == name
} else := {}

# A PodGroup holds at most this many sub-groups (spec.subGroups).
max_sub_groups := 64

# A JobSet with more replicas than a PodGroup has room for sub-groups waits
# with a message that says so, rather than start without them.
errors contains msg if {
	count(custom_rules) == 0
	builtin_kind in {"jobset.x-k8s.io/JobSet", "trainer.kubeflow.org/TrainJob"}
	not disabled_kinds[builtin_kind]
	some js in input.chain
	js.kind == "JobSet"
	n := count(replica_parts(js, [input.owner, js]))
	n > max_sub_groups
	msg := sprintf("%s %s/%s asks for a sub-group per replica (partita.dev/sub-group-topology-*) but has %d replicas with GPUs; a PodGroup holds at most %d sub-groups: remove the annotation or use fewer replicas", [input.owner.kind, input.owner.namespace, input.owner.name, n, max_sub_groups])
}

# ---- leaderworkerset.x-k8s.io LeaderWorkerSet ---------------------------

# Each group (a leader and its size-1 workers) is a gang of its own: the
# group index comes from the pod's label.
lws(o) := g if {
	not opted_out(o)
	idx := input.pod.labels["leaderworkerset.sigs.k8s.io/group-index"]
	t := o.spec.leaderWorkerTemplate
	size := object.get(t, "size", 1)
	leader := object.get(t, "leaderTemplate", t.workerTemplate)
	n := (size - 1) * to_number(t.workerTemplate.gpu) + to_number(leader.gpu)
	n > 0
	g := {
		"name": sprintf("leaderworkerset-%s-%s", [o.name, idx]), "minMember": n, "elastic": false,
		"kind": "LeaderWorkerSet", "ownerName": sprintf("%s group %s", [o.name, idx]),
	}
}

# ---- kubeflow.org PyTorchJob and MPIJob ---------------------------------

replica_specs(spec) := spec.pytorchReplicaSpecs if {
	spec.pytorchReplicaSpecs
} else := spec.mpiReplicaSpecs

# runPolicy.schedulingPolicy.minAvailable, when the job sets it, is the
# gang; otherwise every GPU replica, with a PyTorchJob's elasticPolicy
# making workers beyond minReplicas elastic.
kubeflow_gang(j) := {"minMember": n, "elastic": false} if {
	not opted_out(j)
	n := j.spec.runPolicy.schedulingPolicy.minAvailable
	n > 0
} else := {"minMember": n, "elastic": elastic} if {
	not opted_out(j)
	specs := replica_specs(j.spec)
	n := sum([m |
		some type, rs in specs
		rs.template.gpu
		m := kubeflow_min(j.spec, type, rs)
	])
	n > 0
	elastic := kubeflow_elastic(j.spec)
}

kubeflow_min(spec, "Worker", _) := spec.elasticPolicy.minReplicas if {
	spec.elasticPolicy.minReplicas
} else := object.get(rs, "replicas", 1) if {
	rs := replica_specs(spec).Worker
}

kubeflow_min(_, type, rs) := object.get(rs, "replicas", 1) if type != "Worker"

kubeflow_elastic(spec) if {
	spec.elasticPolicy.minReplicas
	lower(object.get(input.pod.labels, "training.kubeflow.org/replica-type", "")) == "worker"
}

default kubeflow_elastic(_) := false

# ---- ray.io RayCluster (and RayJob) -------------------------------------

# The head and every worker group's minReplicas (times its hosts) start
# together; workers beyond the minimum are elastic.
ray_gang(rc) := {"minMember": n, "elastic": object.get(input.pod.labels, "ray.io/node-type", "") == "worker"} if {
	not opted_out(rc)
	head := to_number(rc.spec.headGroupSpec.template.gpu)
	groups := object.get(rc.spec, "workerGroupSpecs", [])
	workers := sum([m |
		some wg in groups
		wg.template.gpu
		m := ray_min(wg) * object.get(wg, "numOfHosts", 1)
	])
	n := head + workers
	n > 0
}

# A group's minimum: minReplicas, else its replicas when the autoscaler is
# off (RayCluster.spec.enableInTreeAutoscaling).
ray_min(wg) := wg.minReplicas if {
	wg.minReplicas > 0
} else := object.get(wg, "replicas", 0)

# ---- scheduling.k8s.io PodGroup and Workload (native Workload API) ------

# A gang policy's minCount is the gang.
native(pg) := g if {
	n := pg.spec.schedulingPolicy.gang.minCount
	g := {
		"name": sprintf("podgroup-%s", [pg.name]), "minMember": n, "elastic": false,
		"kind": native_kind, "ownerName": native_name(pg),
		"priorityClassName": object.get(pg.spec, "priorityClassName", ""),
	}
}

native_kind := "Workload" if input.workload.name

default native_kind := "PodGroup"

# A Workload of one PodGroup template is named alone; of several, with the
# template its PodGroup was made from.
native_name(pg) := input.workload.name if {
	count(object.get(input.workload, ["spec", "podGroupTemplates"], [])) <= 1
} else := sprintf("%s group %s", [input.workload.name, pg.spec.workloadRef.templateName]) if {
	input.workload.name
} else := pg.name
