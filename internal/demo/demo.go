// Package demo tells Partita's story on a dev cluster, step by step, in words
// a newcomer understands. Every claim it prints is read back from the cluster.
package demo

import (
	"context"
	"fmt"
	"io"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/internal/devcluster"
)

// Namespace is where the demo's workloads run.
const Namespace = "partita-demo"

// Run brings the cluster up if needed and runs the demo's steps.
func Run(ctx context.Context, c *devcluster.Cluster, out io.Writer) error {
	say := func(format string, args ...any) { _, _ = fmt.Fprintf(out, format+"\n", args...) }

	say("Step 1. A local Kubernetes cluster with simulated GPU nodes")
	if err := c.Up(ctx); err != nil {
		return err
	}
	cs, err := c.Clientset()
	if err != nil {
		return err
	}
	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: v1alpha1.LabelGPUNode + "=true"})
	if err != nil {
		return fmt.Errorf("list GPU nodes: %w", err)
	}
	for _, n := range nodes.Items {
		say("  node %s: %s x %s (%s MiB each), ready=%t", n.Name, n.Labels[v1alpha1.LabelNVIDIAGPUCount],
			n.Labels[v1alpha1.LabelNVIDIAGPUProduct], n.Labels[v1alpha1.LabelNVIDIAGPUMemory], devcluster.NodeReady(&n))
	}

	say("")
	say("Step 2. A Job runs on a simulated GPU node")
	job, err := runSampleJob(ctx, cs)
	if err != nil {
		return err
	}
	pods, err := cs.CoreV1().Pods(Namespace).List(ctx, metav1.ListOptions{LabelSelector: "job-name=" + job.Name})
	if err != nil {
		return fmt.Errorf("list pods of job %s: %w", job.Name, err)
	}
	for _, p := range pods.Items {
		say("  pod %s ran on node %s and ended %s", p.Name, p.Spec.NodeName, p.Status.Phase)
	}
	took := job.Status.CompletionTime.Sub(job.Status.StartTime.Time)
	say("  job %s/%s completed: %d of %d pods succeeded in %.1fs", Namespace, job.Name, job.Status.Succeeded, ptr.Deref(job.Spec.Completions, 1), took.Seconds())

	say("")
	say("The cluster keeps running. Look around with:")
	say("  export KUBECONFIG=%s", c.KubeconfigPath())
	say("  export PATH=%s:$PATH   # kubectl, built with the cluster", c.BinDir())
	say("  kubectl get nodes -L nvidia.com/gpu.product,nvidia.com/gpu.count")
	say("  kubectl get queues,podgroups,gpunodes")
	say("Stop it with: bin/partita dev down --name %s", c.Name())
	return nil
}

// runSampleJob (re)creates the sample Job and waits for it to complete.
func runSampleJob(ctx context.Context, cs kubernetes.Interface) (*batchv1.Job, error) {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("create namespace %s: %w", Namespace, err)
	}
	name := "hello-gpu"
	// A previous demo's Job would report its old result: start afresh.
	bg := metav1.DeletePropagationBackground
	if err := cs.BatchV1().Jobs(Namespace).Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: &bg}); err != nil && !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("delete previous job %s: %w", name, err)
	}
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: Namespace},
		Spec: batchv1.JobSpec{
			Completions:  ptr.To[int32](2),
			Parallelism:  ptr.To[int32](2),
			BackoffLimit: ptr.To[int32](0),
			Template: corev1.PodTemplateSpec{
				Spec: corev1.PodSpec{
					RestartPolicy: corev1.RestartPolicyNever,
					NodeSelector:  map[string]string{v1alpha1.LabelGPUNode: "true"},
					Containers: []corev1.Container{{
						Name:    "hello",
						Image:   "busybox",
						Command: []string{"echo", "hello from a GPU node"},
					}},
				},
			},
		},
	}
	var err error
	for attempt := 0; attempt < 50; attempt++ {
		_, err = cs.BatchV1().Jobs(Namespace).Create(ctx, job, metav1.CreateOptions{})
		if !apierrors.IsAlreadyExists(err) {
			break
		}
		time.Sleep(200 * time.Millisecond) // the old Job is still being deleted
	}
	if err != nil {
		return nil, fmt.Errorf("create job %s: %w", name, err)
	}
	return devcluster.WaitJobComplete(ctx, cs, Namespace, name, 90*time.Second)
}
