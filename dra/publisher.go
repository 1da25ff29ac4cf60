package dra

import (
	"context"
	"fmt"
	"sync"

	"github.com/go-logr/logr"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
)

// Publisher keeps the ResourceSlices of the nodes one process serves, one
// pool per node (named after it, spec.nodeName set, owned by the Node so
// that deleting the node deletes them), each kept by its own controller of
// k8s.io/dynamic-resource-allocation/resourceslice. It is what a fleet agent
// uses for simulated nodes, which have no kubelet to register a plugin with;
// a real node's agent publishes through its kubelet plugin (Plugin).
type Publisher struct {
	client kubernetes.Interface
	lock   sync.Mutex
	nodes  map[string]*published
}

type published struct {
	controller *resourceslice.Controller
	cancel     context.CancelFunc
	// last is what was handed to the controller, to skip updates that
	// change nothing.
	last []resourceapi.Device
}

// NewPublisher returns a publisher that writes through client.
func NewPublisher(client kubernetes.Interface) *Publisher {
	return &Publisher{client: client, nodes: map[string]*published{}}
}

// Publish makes node's pool hold devices. The controller writes in the
// background (retrying, repairing slices someone else changed) until
// Release or ctx ends.
func (p *Publisher) Publish(ctx context.Context, node string, nd NodeDevices) error {
	res := Resources(node, nd)
	want := res.Pools[node].Slices[0].Devices
	p.lock.Lock()
	defer p.lock.Unlock()
	if n, ok := p.nodes[node]; ok {
		if resourceslice.DevicesDeepEqual(n.last, want) {
			return nil
		}
		n.controller.Update(res)
		n.last = want
		return nil
	}
	log := logr.FromContextOrDiscard(ctx).WithValues("node", node)
	cctx, cancel := context.WithCancel(klog.NewContext(context.WithoutCancel(ctx), log.WithName("resourceslices")))
	c, err := resourceslice.StartController(cctx, resourceslice.Options{
		DriverName: DriverName,
		KubeClient: p.client,
		Owner:      &resourceslice.Owner{APIVersion: "v1", Kind: "Node", Name: node},
		Resources:  res,
		ErrorHandler: func(_ context.Context, err error, msg string) {
			log.Error(err, "Could not publish ResourceSlices", "detail", msg)
		},
	})
	if err != nil {
		cancel()
		return fmt.Errorf("publish ResourceSlices of %s: %w", node, err)
	}
	p.nodes[node] = &published{controller: c, cancel: cancel, last: want}
	log.V(2).Info("Publishing ResourceSlices", "devices", len(want))
	return nil
}

// Release stops publishing node and deletes its slices (a node that is no
// longer served must not keep devices kube-scheduler would allocate).
func (p *Publisher) Release(ctx context.Context, node string) error {
	p.lock.Lock()
	n, ok := p.nodes[node]
	delete(p.nodes, node)
	p.lock.Unlock()
	if ok {
		n.controller.Stop()
		n.cancel()
	}
	return DeleteSlices(ctx, p.client, node)
}

// Stop stops every controller and leaves the slices in place: the next
// agent takes them over.
func (p *Publisher) Stop() {
	p.lock.Lock()
	defer p.lock.Unlock()
	for name, n := range p.nodes {
		n.controller.Stop()
		n.cancel()
		delete(p.nodes, name)
	}
}

// DeleteSlices deletes Partita's ResourceSlices of node.
func DeleteSlices(ctx context.Context, client kubernetes.Interface, node string) error {
	sel := fields.AndSelectors(
		fields.OneTermEqualSelector(resourceapi.ResourceSliceSelectorDriver, DriverName),
		fields.OneTermEqualSelector(resourceapi.ResourceSliceSelectorNodeName, node),
	).String()
	err := client.ResourceV1().ResourceSlices().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{FieldSelector: sel})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete ResourceSlices of %s: %w", node, err)
	}
	return nil
}
