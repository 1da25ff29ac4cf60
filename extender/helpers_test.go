package extender

import (
	"context"
	"errors"
	"maps"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/partita-dev/partita/api/v1alpha1"
)

func testScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = v1alpha1.AddToScheme(s)
	return s
}

// fakeClient is a pod store with the UID index preempt uses, and the plain
// Nodes n1, n2 and n3 that bind checks.
func fakeClient(pods ...*corev1.Pod) client.WithWatch {
	objs := make([]client.Object, 0, len(pods)+3)
	for _, p := range pods {
		objs = append(objs, p)
	}
	for _, n := range []string{"n1", "n2", "n3"} {
		objs = append(objs, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{corev1.LabelHostname: n}}})
	}
	return fakeClientWith(objs...)
}

// fakeClientWith is a store of exactly objs, with the pod UID index.
func fakeClientWith(objs ...client.Object) client.WithWatch {
	b := fake.NewClientBuilder().WithScheme(testScheme()).WithIndex(&corev1.Pod{}, IndexPodUID, podUIDIndex)
	for _, o := range objs {
		b = b.WithObjects(o.DeepCopyObject().(client.Object))
	}
	return b.Build()
}

// fakeBinder applies Bindings to a fake client as the API server does:
// spec.nodeName and the Binding's annotations, Conflict if already bound.
type fakeBinder struct {
	c client.Client
	// err, when set, fails every Binding; applied, when also set, applies
	// the Binding before failing (an answer lost on the way back).
	err     error
	applied bool

	lock     sync.Mutex
	bindings []*corev1.Binding
}

func (b *fakeBinder) Bind(ctx context.Context, binding *corev1.Binding) error {
	b.lock.Lock()
	b.bindings = append(b.bindings, binding.DeepCopy())
	b.lock.Unlock()
	if b.err != nil && !b.applied {
		return b.err
	}
	pod := &corev1.Pod{}
	if err := b.c.Get(ctx, client.ObjectKey{Namespace: binding.Namespace, Name: binding.Name}, pod); err != nil {
		return err
	}
	if binding.UID != "" && pod.UID != binding.UID {
		return apierrors.NewConflict(schema.GroupResource{Resource: "pods"}, pod.Name, errors.New("UID mismatch"))
	}
	if pod.Spec.NodeName != "" {
		return apierrors.NewConflict(schema.GroupResource{Resource: "pods"}, pod.Name, errors.New("pod is already assigned to node "+pod.Spec.NodeName))
	}
	pod.Spec.NodeName = binding.Target.Name
	if len(binding.Annotations) > 0 && pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	maps.Copy(pod.Annotations, binding.Annotations)
	if err := b.c.Update(ctx, pod); err != nil {
		return err
	}
	return b.err
}

func (b *fakeBinder) count() int {
	b.lock.Lock()
	defer b.lock.Unlock()
	return len(b.bindings)
}

// failingReader fails every read.
type failingReader struct{ client.Reader }

func (failingReader) Get(context.Context, client.ObjectKey, client.Object, ...client.GetOption) error {
	return errors.New("connection refused")
}

func clientKey(namespace, name string) client.ObjectKey {
	return client.ObjectKey{Namespace: namespace, Name: name}
}
