package report

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/dra"
	"github.com/partita-dev/partita/gpu"
)

// Cluster is what the views read from the API server, fetched once per
// command so that every number in one output comes from the same moment.
type Cluster struct {
	// GPUNodes are every GPUNode.
	GPUNodes []v1alpha1.GPUNode
	// Nodes are every Node; the fit check matches a pod's node selector and
	// affinity against their labels. Empty when the reader may not list them.
	Nodes []corev1.Node
	// NodesForbidden is set when the reader may not list Nodes, so that a
	// view grouped by node labels can say why it knows none.
	NodesForbidden bool
	// Topologies are every Topology (What.Topologies).
	Topologies []v1alpha1.Topology
	// Pods are every pod that may hold or wait for GPUs.
	Pods []corev1.Pod
	// Queues are every Queue.
	Queues []v1alpha1.Queue
	// PodGroups are the PodGroups of the namespaces read.
	PodGroups []v1alpha1.PodGroup
	// Events are the events of the namespaces read.
	Events []corev1.Event
	// Models are the Models of the namespaces read (with PodGroups and
	// events): where a pod's models are, for why. Empty when the reader may
	// not list them.
	Models []v1alpha1.Model
	// ResourceClaims are every ResourceClaim (read with GPUNodes): with the
	// dra GPU backend, what pods hold and why kube-scheduler cannot place
	// one. Empty when the reader may not list them.
	ResourceClaims []resourceapi.ResourceClaim
	// ResourceClaimTemplates and DeviceClasses are every template and
	// class (read with GPUNodes): what pods that ask for GPUs through claims
	// of any driver ask for (dra.PodDemand). Empty when the reader may not
	// list them.
	ResourceClaimTemplates []resourceapi.ResourceClaimTemplate
	DeviceClasses          []resourceapi.DeviceClass
	// Ledger, when set, is gpu.BuildLedger(GPUNodes, Pods), built once by
	// a caller that asks many questions of the same objects (the console
	// answers why for every waiting workload of one snapshot). The views
	// only read it. Nil: each view builds its own.
	Ledger *gpu.Ledger
	// GPUClasses are the DeviceClasses whose devices are GPUs, as the
	// extender's --gpu-device-classes says; dra.DefaultGPUClasses when nil.
	GPUClasses dra.GPUClasses
}

// gpuClasses is c.GPUClasses or the default.
func (c *Cluster) gpuClasses() dra.GPUClasses {
	if c.GPUClasses == nil {
		return dra.DefaultGPUClasses
	}
	return c.GPUClasses
}

// ledger is c.Ledger, or the ledger of c's objects.
func (c *Cluster) ledger() *gpu.Ledger {
	if c.Ledger != nil {
		return c.Ledger
	}
	return gpu.BuildLedger(c.GPUNodes, c.Pods)
}

// What says which objects Load reads.
type What struct {
	// GPUNodes reads GPUNodes and Nodes.
	GPUNodes bool
	// Queues reads Queues.
	Queues bool
	// Topologies reads Topologies.
	Topologies bool
	// PodGroupsAndEvents reads PodGroups and Events of Namespace.
	PodGroupsAndEvents bool
	// Namespace limits PodGroups and Events; "" reads all namespaces.
	// Pods are always read in all namespaces: the ledger and the queues
	// count every pod.
	Namespace string
}

// Load reads the objects what names, and every pod.
func Load(ctx context.Context, r client.Reader, what What) (*Cluster, error) {
	c := &Cluster{}
	if what.GPUNodes {
		var gns v1alpha1.GPUNodeList
		if err := r.List(ctx, &gns); err != nil {
			return nil, listError("GPUNodes", err)
		}
		c.GPUNodes = gns.Items
		var nodes corev1.NodeList
		// A user who may not list Nodes still gets the fit check, without
		// node selectors: Forbidden is not fatal here.
		if err := r.List(ctx, &nodes); err != nil && !apierrors.IsForbidden(err) {
			return nil, listError("Nodes", err)
		} else if err != nil {
			c.NodesForbidden = true
		}
		c.Nodes = nodes.Items
		var claims resourceapi.ResourceClaimList
		// Claims matter only with the dra backend; a cluster without
		// resource.k8s.io or a reader who may not list them does without.
		if err := r.List(ctx, &claims); err != nil && !apierrors.IsForbidden(err) && !meta.IsNoMatchError(err) {
			return nil, listError("ResourceClaims", err)
		}
		c.ResourceClaims = claims.Items
		var templates resourceapi.ResourceClaimTemplateList
		if err := r.List(ctx, &templates); err != nil && !apierrors.IsForbidden(err) && !meta.IsNoMatchError(err) {
			return nil, listError("ResourceClaimTemplates", err)
		}
		c.ResourceClaimTemplates = templates.Items
		var classes resourceapi.DeviceClassList
		if err := r.List(ctx, &classes); err != nil && !apierrors.IsForbidden(err) && !meta.IsNoMatchError(err) {
			return nil, listError("DeviceClasses", err)
		}
		c.DeviceClasses = classes.Items
	}
	if what.Queues {
		var qs v1alpha1.QueueList
		if err := r.List(ctx, &qs); err != nil {
			return nil, listError("Queues", err)
		}
		c.Queues = qs.Items
	}
	if what.Topologies {
		var ts v1alpha1.TopologyList
		if err := r.List(ctx, &ts); meta.IsNoMatchError(err) {
			// Partita's other CRDs may well be there, from before Topology.
			return nil, fmt.Errorf("list Topologies: the cluster does not serve topologies.partita.dev: Partita's CRDs predate Topology (apply crds/ or upgrade the chart): %w", err)
		} else if err != nil {
			return nil, listError("Topologies", err)
		}
		c.Topologies = ts.Items
	}
	if what.PodGroupsAndEvents {
		var pgs v1alpha1.PodGroupList
		if err := r.List(ctx, &pgs, client.InNamespace(what.Namespace)); err != nil {
			return nil, listError("PodGroups", err)
		}
		c.PodGroups = pgs.Items
		var evs corev1.EventList
		if err := r.List(ctx, &evs, client.InNamespace(what.Namespace)); err != nil {
			return nil, listError("Events", err)
		}
		c.Events = evs.Items
		var models v1alpha1.ModelList
		if err := r.List(ctx, &models, client.InNamespace(what.Namespace)); err != nil && !apierrors.IsForbidden(err) && !meta.IsNoMatchError(err) {
			return nil, listError("Models", err)
		}
		c.Models = models.Items
	}
	var pods corev1.PodList
	if err := r.List(ctx, &pods); err != nil {
		return nil, listError("Pods", err)
	}
	c.Pods = pods.Items
	return c, nil
}

// ErrNoCRDs says the cluster does not serve Partita's API.
var ErrNoCRDs = errors.New("the cluster does not serve partita.dev/v1alpha1: Partita's CRDs are not installed (the Helm chart and 'partita dev up' install them)")

// listError names what could not be listed and turns the REST mapper's
// "no matches for kind" into ErrNoCRDs, which says what to do.
func listError(what string, err error) error {
	if meta.IsNoMatchError(err) {
		return fmt.Errorf("list %s: %w (%w)", what, ErrNoCRDs, err)
	}
	return fmt.Errorf("list %s: %w", what, err)
}

// MostGPUsOnANode implements dra.GPUCounter: the most devices one
// GPUNode lists (other drivers' GPUs included).
func (c *Cluster) MostGPUsOnANode() int {
	most := 0
	for i := range c.GPUNodes {
		most = max(most, len(c.GPUNodes[i].Status.Devices))
	}
	return most
}

// Claim finds a ResourceClaim (dra.ClaimSource).
func (c *Cluster) Claim(namespace, name string) (*resourceapi.ResourceClaim, bool) {
	for i := range c.ResourceClaims {
		if rc := &c.ResourceClaims[i]; rc.Namespace == namespace && rc.Name == name {
			return rc, true
		}
	}
	return nil, false
}

// Template finds a ResourceClaimTemplate (dra.ClaimSource).
func (c *Cluster) Template(namespace, name string) (*resourceapi.ResourceClaimTemplate, bool) {
	for i := range c.ResourceClaimTemplates {
		if t := &c.ResourceClaimTemplates[i]; t.Namespace == namespace && t.Name == name {
			return t, true
		}
	}
	return nil, false
}

// ExtendedResourceClass finds the DeviceClass that backs an extended
// resource (dra.ClaimSource).
func (c *Cluster) ExtendedResourceClass(name corev1.ResourceName) (string, bool) {
	for _, dc := range c.DeviceClasses {
		if dc.Spec.ExtendedResourceName != nil && *dc.Spec.ExtendedResourceName == string(name) {
			return dc.Name, true
		}
	}
	return "", false
}
