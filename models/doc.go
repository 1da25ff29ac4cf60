// Package models is the home of model files for pods (issue 27; design
// section 12): a Model's files fetched once per node into a cache and served
// read-only at /models/NAME. This package holds no code; its subpackages are
// the building blocks, each usable and tested on its own:
//
//   - safetensors: Validate checks a file's header and that its tensors tile
//     the data section exactly, before a model may be called Ready.
//   - fetch: Fetch streams one file from a Source (File, HTTP, S3) into place
//     with concurrent ranged reads, a bounded buffer pool, a resume journal,
//     retries with backoff and a SHA-256 check.
//   - cache: the node's cache directory: single-flight fills, an LRU size
//     limit that never evicts pinned entries, and an index kept across
//     restarts.
//
// Not wired yet: the Model CRD, the agent driving fetch and cache (one entry
// per model version, include globs, credentials from the secretRef), the CSI
// node plugin that mounts an entry into a pod, pinning from pods, placement
// and prefetch. Nothing here reads flags or the API server.
package models
