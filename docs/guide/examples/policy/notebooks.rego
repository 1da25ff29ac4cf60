package partita.admission

# Notebooks (pods labelled app.kubernetes.io/component=notebook) get at most
# half a GPU, and never whole devices.
deny contains msg if {
	input.pod.labels["app.kubernetes.io/component"] == "notebook"
	input.request.gpuMilli > 500
	msg := sprintf("notebooks get at most half a GPU; this one asks for %v milli-GPUs: ask for partita.dev/gpu-fraction 0.5 or less", [input.request.gpuMilli])
}
