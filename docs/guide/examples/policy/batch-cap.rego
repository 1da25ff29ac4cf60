package partita.quota

# Workloads of the batch queue may not take more than 4 GPUs at once.
deny contains msg if {
	input.queue.name == "batch"
	input.workload.gpuMilli > 4000
	msg := sprintf("%s %s/%s asks for %v milli-GPUs; the batch queue admits at most 4 GPUs per workload",
		[input.workload.kind, input.workload.namespace, input.workload.name, input.workload.gpuMilli])
}
