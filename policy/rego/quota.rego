# Partita's default quota policy (DESIGN §6, §7, docs/policy.md): the GPU,
# CPU and memory limits of a queue and its ancestors.
#
# The admitter asks data.partita.quota, for each workload (a gang or a
# single pod) it is about to admit, whether the workload's queue may take it
# now:
#   deny  a set of messages; any message keeps the workload waiting, and the
#         admitter writes the messages to its status, so each says which
#         queue is full and by how much.
#
# input is the workload, its queue and the queue's ancestors, with usage the
# admitter has already aggregated (its live reservations included); the
# policy reads no other data, because the admitter asks about a thousand
# times a cycle.
package partita.quota

# The queue's own GPU limit. A negative limit (-1) is none; 0 admits
# nothing. The check is written out in both rules rather than in a
# function: a function call costs about a third of a decision, and the
# admitter asks about a thousand times a cycle.
deny contains msg if {
	input.queue.gpu.limitMilli >= 0
	input.queue.gpu.allocatedMilli + input.workload.gpuMilli > input.queue.gpu.limitMilli
	msg := limit_message(sprintf("queue %s", [input.queue.name]), input.queue.gpu)
}

# The limit of every ancestor: a parent's limit caps its children together.
deny contains msg if {
	some i, a in input.ancestors
	a.gpu.limitMilli >= 0
	a.gpu.allocatedMilli + input.workload.gpuMilli > a.gpu.limitMilli
	msg := limit_message(sprintf("queue %s (%s of %s)", [a.name, kin(i), input.queue.name]), a.gpu)
}

# The CPU and memory limits, of the queue and of every ancestor, the same
# way: what the queue's pods request (CPU in milli-CPUs, memory in bytes)
# may not go over the limit. A queue without a CPU or memory limit (-1, the
# default) is not limited.
deny contains msg if {
	input.queue.cpu.limitMilli >= 0
	input.queue.cpu.allocatedMilli + input.workload.cpuMilli > input.queue.cpu.limitMilli
	msg := cpu_limit_message(sprintf("queue %s", [input.queue.name]), input.queue.cpu)
}

deny contains msg if {
	some i, a in input.ancestors
	a.cpu.limitMilli >= 0
	a.cpu.allocatedMilli + input.workload.cpuMilli > a.cpu.limitMilli
	msg := cpu_limit_message(sprintf("queue %s (%s of %s)", [a.name, kin(i), input.queue.name]), a.cpu)
}

deny contains msg if {
	input.queue.memory.limitBytes >= 0
	input.queue.memory.allocatedBytes + input.workload.memoryBytes > input.queue.memory.limitBytes
	msg := memory_limit_message(sprintf("queue %s", [input.queue.name]), input.queue.memory)
}

deny contains msg if {
	some i, a in input.ancestors
	a.memory.limitBytes >= 0
	a.memory.allocatedBytes + input.workload.memoryBytes > a.memory.limitBytes
	msg := memory_limit_message(sprintf("queue %s (%s of %s)", [a.name, kin(i), input.queue.name]), a.memory)
}

cpu_limit_message(queue, r) := sprintf("%s is at its CPU limit: %s of %s CPUs", [queue, gpus(r.allocatedMilli), gpus(r.limitMilli)]) if {
	r.allocatedMilli >= r.limitMilli
} else := sprintf("%s is at its CPU limit: %s of %s CPUs, and the workload needs %s", [queue, gpus(r.allocatedMilli), gpus(r.limitMilli), gpus(input.workload.cpuMilli)])

memory_limit_message(queue, r) := sprintf("%s is at its memory limit: %s of %s", [queue, gib(r.allocatedBytes), gib(r.limitBytes)]) if {
	r.allocatedBytes >= r.limitBytes
} else := sprintf("%s is at its memory limit: %s of %s, and the workload needs %s", [queue, gib(r.allocatedBytes), gib(r.limitBytes), gib(input.workload.memoryBytes)])

# gib formats bytes in GiB: 68719476736 -> "64Gi", 1610612736 -> "1.5Gi".
gib(b) := sprintf("%sGi", [format_int(b / 1073741824, 10)]) if {
	b % 1073741824 == 0
} else := sprintf("%sGi", [trim_right(trim_right(sprintf("%.3f", [b / 1073741824]), "0"), ".")])

# How an ancestor at index i of input.ancestors is related to the queue.
kin(0) := "parent"

kin(i) := "ancestor" if i > 0

# A queue already at its limit takes nothing more, whatever the workload
# asks; otherwise the message says how much the workload needs, since
# there is some room, just not enough.
limit_message(queue, r) := sprintf("%s is at its limit: %s of %s GPUs", [queue, gpus(r.allocatedMilli), gpus(r.limitMilli)]) if {
	r.allocatedMilli >= r.limitMilli
} else := sprintf("%s is at its limit: %s of %s GPUs, and the workload needs %s", [queue, gpus(r.allocatedMilli), gpus(r.limitMilli), gpus(input.workload.gpuMilli)])

# gpus formats milli-GPUs as a decimal number of GPUs: 2500 -> "2.5". The
# same as admission.rego's, kept here so that either module can be replaced
# or removed without the other; format_int makes whole GPUs cheaper.
gpus(milli) := format_int(milli / 1000, 10) if {
	milli % 1000 == 0
} else := trim_right(trim_right(sprintf("%.3f", [milli / 1000]), "0"), ".")
