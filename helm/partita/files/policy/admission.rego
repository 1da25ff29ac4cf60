# Partita's default admission policy (DESIGN §7, docs/policy.md).
#
# The webhook asks data.partita.admission for every pod that requests GPUs:
#   deny   a set of messages; any message refuses the pod, and the message is
#          what the user sees, so it says what is wrong and how to fix it;
#   patch  defaults the webhook writes when the pod does not set them:
#          {"labels": {...}, "annotations": {...}}.
#
# The webhook also asks about PodGroups (created, or with their spec
# changed): input.kind is "PodGroup" and input.podGroup replaces input.pod;
# request.queue is the PodGroup's spec.queue, so the queue rules below refuse
# a gang whose namespace may not use its queue as they refuse a pod. A
# PodGroup asks for no GPUs itself (its members do, and each is asked about),
# so the rules on amounts do not apply to it, and no patch is written.
#
# input is the request (docs/policy.md); data.partita.state is the cluster
# state (queues, their usage, namespaces) and data.partita.config the
# operator's settings (webhook flags).
package partita.admission

# is_pod_group is true when the webhook asks about a PodGroup.
is_pod_group if input.kind == "PodGroup"

# The queue the pod goes to: the one it names, else its namespace's default
# (label partita.dev/default-queue). A pod that names neither goes to the
# cluster's default queue (the webhook's --default-queue), which the webhook
# writes and then asks about again as if the pod had named it. A PodGroup's
# is its spec.queue alone: empty leaves the queue to its members.
queue_name := input.request.queue if {
	input.request.queue != ""
} else := object.get(namespace.labels, "partita.dev/default-queue", "") if {
	not is_pod_group
} else := ""

# queue_from_default is true when the queue comes from the namespace label.
queue_from_default if {
	input.request.queue == ""
	queue_name != ""
}

# The pod's namespace as the state has it; a point read, so a policy never
# copies the whole namespace map.
namespace := ns if {
	ns := data.partita.state.namespaces[input.namespace]
} else := {"labels": {}, "queues": []}

queue := data.partita.state.queues[queue_name]

# Where the queue name came from, for messages.
queue_source := sprintf("namespace %s's default queue (label partita.dev/default-queue)", [input.namespace]) if {
	queue_from_default
} else := sprintf("spec.queue of PodGroup %s", [input.podGroup.name]) if {
	is_pod_group
} else := "label partita.dev/queue"

deny contains msg if {
	data.partita.config.requireQueue
	not is_pod_group
	queue_name == ""
	msg := sprintf("pod names no queue: set the label partita.dev/queue to a leaf queue, or give namespace %s a default with the label partita.dev/default-queue", [input.namespace])
}

deny contains msg if {
	queue_name != ""
	not queue
	msg := sprintf("queue %q (%s) does not exist; create the Queue or name an existing leaf queue", [queue_name, queue_source])
}

deny contains msg if {
	count(queue.children) > 0
	msg := sprintf("queue %q (%s) is not a leaf: it has child queues %s; only leaf queues take work, name one of them", [queue_name, queue_source, concat(", ", sort(queue.children))])
}

deny contains msg if {
	queue
	not namespace_may_use_queue
	msg := sprintf("namespace %s may not submit to queue %q; add %s to the queue's spec.namespaces or match it with spec.namespaceSelector, or name another queue", [input.namespace, queue_name, input.namespace])
}

# A queue that lists no namespaces and has no selector is open to all.
namespace_may_use_queue if {
	count(queue.namespaces) == 0
	not queue.namespaceSelector
}

namespace_may_use_queue if input.namespace in queue.namespaces

namespace_may_use_queue if queue_name in namespace.queues

namespace_may_use_queue if queue_from_default

# The tightest GPU limit of the queue and its ancestors, in milli-GPUs
# (computed with the state); -1 means none.
limit_milli := queue.gpu.effectiveLimitMilli if queue.gpu.effectiveLimitMilli >= 0

# The gang's size when the pod says it (partita.dev/min-member), else 1.
workload_members := max([1, input.request.minMember])

workload_milli := workload_members * input.request.gpuMilli

deny contains msg if {
	workload_milli > limit_milli
	msg := sprintf("%s asks for %s GPUs, more than the %s GPU limit of queue %q and its parents; it could never be admitted: ask for less, or raise the queue's spec.resources.gpu.limit", [workload_words, gpus(workload_milli), gpus(limit_milli), queue_name])
}

workload_words := "the pod" if {
	workload_members == 1
} else := sprintf("the gang of %d pods", [workload_members])

deny contains msg if {
	data.partita.config.maxGPUMilliPerPod > 0
	input.request.gpuMilli > data.partita.config.maxGPUMilliPerPod
	msg := sprintf("the pod asks for %s GPUs; this cluster allows at most %s per pod: split the work across pods, or ask for less", [gpus(input.request.gpuMilli), gpus(data.partita.config.maxGPUMilliPerPod)])
}

deny contains msg if {
	data.partita.config.minGPUMilli > 0
	some c in input.request.containers
	c.milliPerDevice < data.partita.config.minGPUMilli
	msg := sprintf("container %s asks for %s of a GPU; the smallest slice this cluster gives is %s: ask for at least that much", [c.name, gpus(c.milliPerDevice), gpus(data.partita.config.minGPUMilli)])
}

# Default the queue label from the namespace.
patch := {"labels": {"partita.dev/queue": queue_name}} if queue_from_default

# gpus formats milli-GPUs as a decimal number of GPUs: 2500 -> "2.5".
gpus(milli) := sprintf("%d", [milli / 1000]) if {
	milli % 1000 == 0
} else := trim_right(trim_right(sprintf("%.3f", [milli / 1000]), "0"), ".")
