package v1alpha1

import (
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Model keys (docs/models.md).
const (
	// AnnotationModel on a pod names the Models (of the pod's namespace,
	// comma-separated) whose files its containers read at /models/NAME.
	AnnotationModel = "partita.dev/model"
	// ModelCSIDriver is the CSI driver of the node's model cache: the
	// webhook gives a pod that asks for a model one inline volume of it per
	// model, and the kubelet starts the pod's containers only once the
	// cache has published the model's complete, verified files.
	ModelCSIDriver = "models.partita.dev"
	// ModelVolumeAttribute is the inline volume's attribute that names the
	// Model (in the pod's namespace: the driver reads the namespace from the
	// kubelet, never from the volume).
	ModelVolumeAttribute = "model"
	// ModelMountRoot is where a pod's containers find its models.
	ModelMountRoot = "/models"
	// EnvModelDir is set in every container of a pod that asks for models:
	// the model's directory when it asks for one, else ModelMountRoot.
	EnvModelDir = "PARTITA_MODEL_DIR"
	// PodConditionModelsReady is the pod condition the extender's leader
	// keeps on a bound pod that asks for models: False with what it waits
	// for, True once its node holds every model.
	PodConditionModelsReady = "partita.dev/ModelsReady"
	// ModelVolumePrefix starts the names of the volumes the webhook adds.
	ModelVolumePrefix = "partita-model-"
	// ModelSecretAccessKeyID and ModelSecretSecretAccessKey are the keys of
	// an s3 source's Secret; ModelSecretToken is an http(s) source's bearer
	// token.
	ModelSecretAccessKeyID     = "AWS_ACCESS_KEY_ID"
	ModelSecretSecretAccessKey = "AWS_SECRET_ACCESS_KEY"
	ModelSecretSessionToken    = "AWS_SESSION_TOKEN"
	ModelSecretToken           = "token"
)

// ModelSource says where a model's files are.
type ModelSource struct {
	// URI is s3://BUCKET/PREFIX (every object under the prefix), an
	// http(s):// URL of one file, or of a directory (ending in "/") with
	// files listing what is under it, or file:///PATH, a file or a
	// directory on the node (a local disk or an NFS mount).
	// +kubebuilder:validation:MinLength=8
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:Pattern=`^(s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?|https?://[^\s]+|file:///[^\s]*)$`
	// +required
	URI string `json:"uri"`
	// Endpoint is the URL of an S3-compatible store (MinIO, SeaweedFS,
	// Ceph); empty means AWS's. Only for s3:// sources.
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:Pattern=`^https?://[^\s]+$`
	// +optional
	Endpoint string `json:"endpoint,omitempty"`
	// Region of the bucket (default us-east-1).
	// +kubebuilder:validation:MaxLength=64
	// +optional
	Region string `json:"region,omitempty"`
	// SecretRef names a Secret of the Model's namespace with the keys
	// AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and optionally
	// AWS_SESSION_TOKEN) for s3://, or token (sent as a bearer token) for
	// http(s)://. The kubelet hands it to the node's model cache only for
	// the pod it mounts the model into; the cache never reads Secrets.
	// +optional
	SecretRef *corev1.LocalObjectReference `json:"secretRef,omitempty"`
	// Files are the paths under an http(s) directory URI to fetch (HTTP has
	// no listing).
	// +kubebuilder:validation:MaxItems=1000
	// +kubebuilder:validation:items:MaxLength=1024
	// +listType=set
	// +optional
	Files []string `json:"files,omitempty"`
}

// ModelSpec is what a Model holds.
type ModelSpec struct {
	// +required
	Source ModelSource `json:"source"`
	// Include keeps only the files whose path under the source matches one
	// of these globs (path.Match: '*' does not cross '/'); empty keeps all.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=1024
	// +listType=atomic
	// +optional
	Include []string `json:"include,omitempty"`
	// SHA256 pins files' digests (lower-case hex) by their path under the
	// source: a file that hashes otherwise fails the model, and is never
	// served.
	// +kubebuilder:validation:MaxProperties=1000
	// +optional
	SHA256 map[string]string `json:"sha256,omitempty"`
	// Prefetch warms nodes ahead of demand: that many of the nodes the
	// selector matches fetch the model before any pod asks for it there.
	// A Model with a secretRef is fetched only with a pod (its Secret
	// reaches a node only then): its requests wait, and say so.
	// +optional
	Prefetch *ModelPrefetch `json:"prefetch,omitempty"`
}

// ModelPrefetch says which nodes to warm, and how many.
type ModelPrefetch struct {
	// NodeSelector selects the nodes (by their labels); empty selects every
	// node.
	// +optional
	NodeSelector *metav1.LabelSelector `json:"nodeSelector,omitempty"`
	// Count is how many of them should hold the model.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	// +required
	Count int32 `json:"count"`
}

// ModelPhase is where a model, or its copy on one node, stands.
// +kubebuilder:validation:Enum=Pending;Fetching;Ready;Failed
type ModelPhase string

// Model phases.
const (
	// ModelPending: no node holds or fetches it yet.
	ModelPending ModelPhase = "Pending"
	// ModelFetching: a node is fetching it.
	ModelFetching ModelPhase = "Fetching"
	// ModelReady: at least one node holds it complete and verified.
	ModelReady ModelPhase = "Ready"
	// ModelFailed: every node that tried failed; see the message.
	ModelFailed ModelPhase = "Failed"
)

// ModelFile is one file of a model as fetched and verified.
type ModelFile struct {
	// Path under the model's directory.
	// +kubebuilder:validation:MaxLength=1024
	// +required
	Path string `json:"path"`
	// +required
	Size int64 `json:"size"`
	// SHA256 of the file's bytes, lower-case hex.
	// +kubebuilder:validation:MaxLength=64
	// +optional
	SHA256 string `json:"sha256,omitempty"`
}

// ModelNodeStatus is one node's copy of a model.
type ModelNodeStatus struct {
	// Name of the node.
	// +kubebuilder:validation:MaxLength=253
	// +required
	Name string `json:"name"`
	// +required
	Phase ModelPhase `json:"phase"`
	// Bytes held on the node so far.
	// +optional
	Bytes int64 `json:"bytes,omitempty"`
	// Total bytes of the model's files.
	// +optional
	Total int64 `json:"total,omitempty"`
	// Version is the node cache's key for what it holds: a digest of the
	// source's files, their sizes and versions.
	// +kubebuilder:validation:MaxLength=200
	// +optional
	Version string `json:"version,omitempty"`
	// Message says what the node is doing or why it failed.
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Message string `json:"message,omitempty"`
	// LastTransitionTime is when Phase last changed.
	// +optional
	LastTransitionTime *metav1.Time `json:"lastTransitionTime,omitempty"`
	// Peer is where the other nodes' caches fetch this copy from, while it
	// is Ready: they read a model from a peer before its source.
	// +optional
	Peer *ModelPeer `json:"peer,omitempty"`
}

// ModelPeer is a node cache's endpoint for its peers.
type ModelPeer struct {
	// URL of the cache's peer server, e.g. https://10.0.3.7:8484.
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:Pattern=`^https://[^\s/]+$`
	// +required
	URL string `json:"url"`
	// CertSHA256 is the SHA-256 of the server's certificate (DER, lower-case
	// hex), which peers pin: the certificate is the cache's own, made at
	// its start.
	// +kubebuilder:validation:Pattern=`^[0-9a-f]{64}$`
	// +required
	CertSHA256 string `json:"certSHA256"`
}

// ModelStatus is what the node caches report, and its summary.
type ModelStatus struct {
	// Phase sums up the nodes: Ready when one holds the model, else
	// Fetching when one fetches it, else Failed when every one that tried
	// failed, else Pending.
	// +optional
	Phase ModelPhase `json:"phase,omitempty"`
	// Size of the model's files in bytes.
	// +optional
	Size int64 `json:"size,omitempty"`
	// Files as last verified by a node.
	// +kubebuilder:validation:MaxItems=1000
	// +listType=map
	// +listMapKey=path
	// +optional
	Files []ModelFile `json:"files,omitempty"`
	// Nodes that hold or fetch the model, each written by its node's cache.
	// +kubebuilder:validation:MaxItems=5000
	// +listType=map
	// +listMapKey=name
	// +optional
	Nodes []ModelNodeStatus `json:"nodes,omitempty"`
	// Conditions: Ready, with a reason a person can act on when False.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Model is a set of weight files (safetensors and what comes with them) that
// pods ask for with the annotation partita.dev/model: each node's model cache
// fetches it once, verifies it and serves it read-only at /models/NAME.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=mdl
// +kubebuilder:printcolumn:name="Source",type=string,JSONPath=`.spec.source.uri`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Size",type=integer,JSONPath=`.status.size`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Model struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec ModelSpec `json:"spec"`
	// +optional
	Status ModelStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// ModelList is a list of Models.
type ModelList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Model `json:"items"`
}

// Model condition types and reasons.
const (
	ModelConditionReady = "Ready"

	ModelReasonReady       = "Ready"
	ModelReasonFetching    = "Fetching"
	ModelReasonNotFetched  = "NotFetched"
	ModelReasonFetchFailed = "FetchFailed"
)

// ModelNode returns the status of node's copy, or nil.
func (s *ModelStatus) ModelNode(node string) *ModelNodeStatus {
	for i := range s.Nodes {
		if s.Nodes[i].Name == node {
			return &s.Nodes[i]
		}
	}
	return nil
}

// ModelNamesOf reads partita.dev/model from a pod's annotations: the names,
// trimmed, without empties or duplicates. It does not validate them (the
// webhook refuses bad ones); a name of another namespace is skipped.
func ModelNamesOf(annotations map[string]string) []string {
	raw, ok := annotations[AnnotationModel]
	if !ok {
		return nil
	}
	var out []string
	for _, n := range strings.Split(raw, ",") {
		n = strings.TrimSpace(n)
		if n == "" || strings.Contains(n, "/") || slices.Contains(out, n) {
			continue
		}
		out = append(out, n)
	}
	return out
}
