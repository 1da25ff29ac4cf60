package devcluster

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/partita-dev/partita/helm"
	"github.com/partita-dev/partita/internal/durable"
)

// PartitaNamespace is the namespace of Partita's ServiceAccounts in the dev
// cluster, as a chart installed with `--namespace partita-system` would
// have them.
const PartitaNamespace = "partita-system"

// ChartRelease is the release name the chart's RBAC is rendered with; its
// ServiceAccounts are partita-webhook, partita-extender and partita-agent.
const ChartRelease = "partita"

// tokenLifetime is what the dev cluster asks for each ServiceAccount token.
// `partita dev up` renews the tokens, and the processes re-read their token
// file, so a cluster that outlives a token needs only another `up`.
const tokenLifetime = 30 * 24 * 60 * 60

// devWebhookRegistration is what the dev cluster's webhook needs beyond the
// chart's RBAC, because outside a cluster it does what helm does in one
// (--dev-register): create its webhook configurations the first time,
// install the admission policies and their bindings (helm's job in a
// cluster; the chart's ServiceAccount has no right to them), and send
// dry-run pods into namespace default to see the API server apply them.
const devWebhookRegistration = `apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: partita-dev-webhook-register
rules:
- apiGroups: [admissionregistration.k8s.io]
  resources: [mutatingwebhookconfigurations, validatingwebhookconfigurations]
  verbs: [create]
- apiGroups: [admissionregistration.k8s.io]
  resources: [validatingadmissionpolicies, validatingadmissionpolicybindings, mutatingadmissionpolicies, mutatingadmissionpolicybindings]
  verbs: [create]
- apiGroups: [admissionregistration.k8s.io]
  resources: [validatingadmissionpolicies, validatingadmissionpolicybindings, mutatingadmissionpolicies, mutatingadmissionpolicybindings]
  resourceNames: [partita-pods, partita-void, partita-seal]
  verbs: [get, update, delete]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: partita-dev-webhook-register
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: partita-dev-webhook-register}
subjects:
- {kind: ServiceAccount, name: partita-webhook, namespace: partita-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: partita-dev-webhook-probe
  namespace: default
rules:
- apiGroups: [""]
  resources: [pods]
  verbs: [create]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: partita-dev-webhook-probe
  namespace: default
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: partita-dev-webhook-probe}
subjects:
- {kind: ServiceAccount, name: partita-webhook, namespace: partita-system}
`

// devModelCacheNodes is what the model caches of the simulated nodes (one
// host process, `partita model-cache --simulate-nodes`) need beyond the
// chart's model-cache RBAC: to list the nodes they serve.
const devModelCacheNodes = `apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: partita-dev-model-cache-nodes
rules:
- apiGroups: [""]
  resources: [nodes]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: partita-dev-model-cache-nodes
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: partita-dev-model-cache-nodes}
subjects:
- {kind: ServiceAccount, name: partita-model-cache, namespace: partita-system}
`

// ServiceAccountKubeconfig is the kubeconfig that authenticates as the
// named ServiceAccount of PartitaNamespace with a token (see
// ensureIdentities).
func (c *Cluster) ServiceAccountKubeconfig(sa string) string {
	return filepath.Join(c.Dir(), "partita", "kubeconfig-"+sa+".yaml")
}

func (c *Cluster) tokenFile(sa string) string {
	return filepath.Join(c.Dir(), "partita", "tokens", sa+".token")
}

// RBACManifest renders the chart's ServiceAccounts and RBAC for the dev
// cluster with the cached helm binary, and the policy that ties each
// agent's writes to its own node. The scheduler's are left out: the dev
// cluster's kube-scheduler is kwokctl's, with its own credentials. The one
// agent serves every simulated node with a token bound to no node, which
// the policy allows only with agent.simulatedFleet (a token bound to a
// node, such as a real node's agent pod has, still writes only its own).
//
// The model cache's identity (ServiceAccount, ClusterRole and binding) is
// taken from its template, without its DaemonSet, CSIDriver and the
// policy that ties a cache's writes to the node its pod's token names: the
// one host process serving every simulated node has a token bound to no
// node.
func (c *Cluster) RBACManifest(ctx context.Context) ([]byte, error) {
	render := func(args ...string) ([]byte, error) {
		return helm.Template(ctx, helm.TemplateOptions{
			Helm: filepath.Join(c.opts.BinDir, "helm"), Release: ChartRelease, Namespace: PartitaNamespace,
			KubeVersion: K8sVersion, Args: append(args,
				"--set", "scheduler.mode=default", "--set", "agent.simulatedFleet=true", "--set", "gpuBackend="+string(c.Backend()),
				"--set", ShowOnlyClientAuth),
		})
	}
	rbac, err := render("--show-only", "templates/rbac.yaml", "--show-only", "templates/agent-policy.yaml")
	if err != nil {
		return nil, err
	}
	mc, err := render("--show-only", "templates/model-cache.yaml", "--set", "modelCache.peers.enabled=false")
	if err != nil {
		return nil, err
	}
	ids, err := keepKinds(mc, "ServiceAccount", "ClusterRole", "ClusterRoleBinding")
	if err != nil {
		return nil, fmt.Errorf("the chart's model cache: %w", err)
	}
	return append(append(rbac, "\n---\n"...), ids...), nil
}

// keepKinds returns the documents of a YAML stream whose kind is one of
// kinds.
func keepKinds(stream []byte, kinds ...string) ([]byte, error) {
	var out []byte
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(stream)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read YAML: %w", err)
		}
		var meta struct {
			Kind string `json:"kind"`
		}
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			return nil, fmt.Errorf("read YAML: %w", err)
		}
		if slices.Contains(kinds, meta.Kind) {
			out = append(append(out, "\n---\n"...), doc...)
		}
	}
}

// ensureIdentities gives each host process that names a ServiceAccount the
// chart's identity: it creates Partita's namespace, applies the chart's
// RBAC (and what the dev webhook needs to register itself), and writes a
// kubeconfig with a fresh token (TokenRequest) for each ServiceAccount. The
// processes then run with exactly the permissions a chart install gives
// them, so a missing or excessive permission shows in the tests. Without
// applyRBAC (mode chart: helm installed the RBAC) it only writes the tokens.
func (c *Cluster) ensureIdentities(ctx context.Context, cfg *rest.Config, procs []HostProcess, applyRBAC bool) error {
	var accounts []string
	for _, p := range procs {
		if p.ServiceAccount != "" {
			accounts = append(accounts, p.ServiceAccount)
		}
	}
	if len(accounts) == 0 {
		return nil
	}
	cs, err := c.Clientset()
	if err != nil {
		return err
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: PartitaNamespace}}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", PartitaNamespace, err)
	}
	if applyRBAC {
		manifest, err := c.RBACManifest(ctx)
		if err != nil {
			return fmt.Errorf("render the chart's RBAC: %w", err)
		}
		manifest = append(append(manifest, "\n---\n"...), devWebhookRegistration...)
		if err := Apply(ctx, cfg, append(append(manifest, "\n---\n"...), devModelCacheNodes...)); err != nil {
			return fmt.Errorf("apply the chart's RBAC: %w", err)
		}
	}
	admin, err := clientcmd.LoadFromFile(c.KubeconfigPath())
	if err != nil {
		return fmt.Errorf("read the admin kubeconfig: %w", err)
	}
	for _, sa := range accounts {
		tr, err := cs.CoreV1().ServiceAccounts(PartitaNamespace).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
			Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](tokenLifetime)},
		}, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("request a token for ServiceAccount %s/%s: %w", PartitaNamespace, sa, err)
		}
		if err := os.MkdirAll(filepath.Dir(c.tokenFile(sa)), 0o700); err != nil {
			return fmt.Errorf("create token directory: %w", err)
		}
		// Written in place of the old one: running processes re-read it.
		if err := durable.WriteFile(c.tokenFile(sa), []byte(tr.Status.Token), 0o600); err != nil {
			return fmt.Errorf("write token of %s: %w", sa, err)
		}
		kc, err := serviceAccountKubeconfig(admin, sa, c.tokenFile(sa))
		if err != nil {
			return err
		}
		if err := clientcmd.WriteToFile(*kc, c.ServiceAccountKubeconfig(sa)); err != nil {
			return fmt.Errorf("write kubeconfig of %s: %w", sa, err)
		}
	}
	return nil
}

// serviceAccountKubeconfig is admin's current cluster with a token file as
// the only credential.
func serviceAccountKubeconfig(admin *clientcmdapi.Config, sa, tokenFile string) (*clientcmdapi.Config, error) {
	ctxName := admin.CurrentContext
	kctx, ok := admin.Contexts[ctxName]
	if !ok {
		return nil, fmt.Errorf("admin kubeconfig has no current context %q", ctxName)
	}
	cluster, ok := admin.Clusters[kctx.Cluster]
	if !ok {
		return nil, fmt.Errorf("admin kubeconfig has no cluster %q", kctx.Cluster)
	}
	user := "system:serviceaccount:" + PartitaNamespace + ":" + sa
	out := clientcmdapi.NewConfig()
	out.Clusters[kctx.Cluster] = cluster.DeepCopy()
	out.AuthInfos[user] = &clientcmdapi.AuthInfo{TokenFile: tokenFile}
	out.Contexts[sa] = &clientcmdapi.Context{Cluster: kctx.Cluster, AuthInfo: user, Namespace: PartitaNamespace}
	out.CurrentContext = sa
	return out, nil
}

// Apply creates or updates every object of a multi-document YAML manifest
// with server-side apply, as `kubectl apply --server-side` would.
func Apply(ctx context.Context, cfg *rest.Config, manifest []byte) error {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return fmt.Errorf("create discovery client: %w", err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("create dynamic client: %w", err)
	}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(manifest)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read manifest: %w", err)
		}
		var obj unstructured.Unstructured
		if err := yaml.Unmarshal(doc, &obj.Object); err != nil {
			return fmt.Errorf("decode manifest: %w", err)
		}
		if len(obj.Object) == 0 {
			continue // a comment-only document
		}
		gvk := obj.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return fmt.Errorf("map %s: %w", gvk, err)
		}
		data, err := obj.MarshalJSON()
		if err != nil {
			return fmt.Errorf("encode %s %s: %w", gvk.Kind, obj.GetName(), err)
		}
		ri := dyn.Resource(m.Resource).Namespace(obj.GetNamespace())
		if _, err := ri.Patch(ctx, obj.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{FieldManager: "partita-dev", Force: ptr.To(true)}); err != nil {
			return fmt.Errorf("apply %s %s: %w", gvk.Kind, obj.GetName(), err)
		}
	}
}
