// Package ctl is `partita ctl`, which is also the kubectl plugin `kubectl
// partita`: it connects with the user's kubeconfig (Connection), reads the
// cluster once, and prints the reports of package report (nodes, queues,
// why) as tables or JSON (Output). The console is the other face of the
// same reports.
package ctl
