// Package models is the home of model files for pods (issue 27;
// docs/models.md): a Model's files fetched once per node into a cache and
// served read-only at /models/NAME. It holds ApplyStatus, the one way every
// writer of a Model's status (a node's cache, the leader's summary, a
// prefetch request) applies its fields; its subpackages are the parts:
// safetensors, fetch, origin, cache, node, csi, peer, summary, locate,
// prefetch and podcondition.
package models
