// Package e2e holds Partita's end-to-end tests. TestMain starts one dev
// cluster (real etcd, kube-apiserver, kube-controller-manager, kube-scheduler
// and kwok simulated GPU nodes) through the `partita` binary, runs the tests
// against it and tears it down. Set PARTITA_BIN to a built binary (make does);
// otherwise the tests build one. PARTITA_E2E_KEEP=1 keeps the cluster.
package e2e
