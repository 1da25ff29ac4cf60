package demo

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/ctl"
	"github.com/partita-dev/partita/devcluster"
	"github.com/partita-dev/partita/gpu"
	"github.com/partita-dev/partita/report"
)

// cluster is step 1: the cluster is up, and its nodes have GPUs that
// Partita's agent reports.
func (s *story) cluster(ctx context.Context) error {
	if err := s.c.Up(ctx); err != nil {
		return err
	}
	cfg, err := s.c.RESTConfig()
	if err != nil {
		return err
	}
	if s.cs, err = kubernetes.NewForConfig(cfg); err != nil {
		return fmt.Errorf("create client: %w", err)
	}
	scheme, err := ctl.Scheme()
	if err != nil {
		return err
	}
	if s.cl, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		return fmt.Errorf("create client: %w", err)
	}

	// The agent reports each node's devices in its GPUNode; wait for
	// every GPU node's.
	var gpuNodes report.NodesReport
	err = waitFor(ctx, waitTimeout, "Partita's agent reporting the GPUs of every GPU node", func(ctx context.Context) error {
		nodes, err := s.cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: v1alpha1.LabelGPUNode + "=true"})
		if err != nil {
			return err
		}
		cl, err := s.load(ctx, report.What{GPUNodes: true})
		if err != nil {
			return err
		}
		gpuNodes = report.Nodes(cl)
		reported := map[string]bool{}
		for _, n := range gpuNodes.Nodes {
			reported[n.Name] = n.GPUs > 0
		}
		for _, n := range nodes.Items {
			if !reported[n.Name] {
				return seen("node %s has no GPUs in its GPUNode yet", n.Name)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, n := range gpuNodes.Nodes {
		d := n.Devices[0]
		s.say("  %s: %d × %s, %s each, %d healthy", n.Name, n.GPUs, d.Model, gib(d.MemoryMiB), n.Healthy)
	}
	s.gpus = gpuNodes.Total.Healthy
	s.say("  %d GPUs in all. kwok simulates the nodes and their pods; everything else is real:", s.gpus)
	s.say("  kube-apiserver, kube-scheduler, and Partita's webhook, scheduler extender, node agent and model caches.")
	if s.gpus < minGPUs {
		return fmt.Errorf("the demo needs at least %d healthy GPUs and the cluster has %d: run 'partita dev up --name %s --nodes 4 --gpus-per-node 8'", minGPUs, s.gpus, s.c.Name())
	}
	// Team A may hold everything but one gang: at its limit it fills the
	// cluster, so team B's next gang needs reclaim.
	s.teamALimit = s.gpus - gangSize
	return nil
}

// teams is step 2: a parent queue and two leaf queues, one per team, with
// quotas and limits; and the namespaces they take work from.
func (s *story) teams(ctx context.Context) error {
	if err := s.reset(ctx); err != nil {
		return err
	}
	for _, ns := range []string{TeamA, TeamB} {
		if err := s.createNamespace(ctx, ns); err != nil {
			return err
		}
	}
	queues := []*v1alpha1.Queue{
		gpuQueue(ParentQueue, "", s.gpus, int(report.Unlimited)),
		gpuQueue(TeamA, ParentQueue, teamAQuota, s.teamALimit, TeamA),
		gpuQueue(TeamB, ParentQueue, teamBQuota, s.gpus, TeamB),
	}
	for _, q := range queues {
		if err := s.cl.Create(ctx, q); err != nil {
			return fmt.Errorf("create queue %s: %w", q.Name, err)
		}
	}
	for _, q := range []string{TeamA, TeamB} {
		if err := s.waitQueueKnown(ctx, q); err != nil {
			return err
		}
	}
	cl, err := s.load(ctx, report.What{Queues: true})
	if err != nil {
		return err
	}
	tw := newTable(s.opts.Out)
	tw.row("  QUEUE\tGPU QUOTA\tGPU LIMIT\tNAMESPACE\n")
	for _, q := range demoQueues(report.Queues(cl)) {
		ns := "-"
		if q.Leaf {
			ns = q.Name
		}
		tw.row("  %s%s\t%s\t%s\t%s\n", strings.Repeat("  ", q.Depth), q.Name, amount(q.QuotaMilli, "all"), amount(q.LimitMilli, "none"), ns)
	}
	if err := tw.flush(); err != nil {
		return err
	}
	s.say("  A quota is what a team deserves. Beyond it, a team may borrow GPUs that nobody uses,")
	s.say("  up to its limit; borrowed GPUs go back when a team below its fair share needs them.")
	return nil
}

// notebooksShare is step 3: pods asking for fractions of a GPU land on the
// same devices.
func (s *story) notebooksShare(ctx context.Context) error {
	var pods []*corev1.Pod
	var asks []string
	for i, f := range notebookFractions() {
		name := fmt.Sprintf("nb-%d", i+1)
		pods = append(pods, fractionPod(TeamA, name, roleNotebook, f))
		s.notebooks = append(s.notebooks, name)
		asks = append(asks, name+" "+f)
	}
	s.say("  team-a starts %d notebooks (annotation %s): %s", len(pods), v1alpha1.AnnotationGPUFraction, strings.Join(asks, ", "))
	// One after another, as people open notebooks: each is placed knowing
	// where the others are, so they pack onto as few devices as they can.
	for i, p := range pods {
		if err := s.createPods(ctx, p); err != nil {
			return err
		}
		if _, err := s.waitBound(ctx, TeamA, s.notebooks[i:i+1]); err != nil {
			return err
		}
	}
	cl, err := s.load(ctx, report.What{GPUNodes: true})
	if err != nil {
		return err
	}
	u := usageOf(report.Nodes(cl), isNotebook)
	s.say("  They run, and share devices (from each pod's %s<container> annotation, written at bind):", v1alpha1.AnnotationDevicesPrefix)
	for _, d := range u.devs {
		s.say("    %s GPU %d: %s (%s of 1 used)", d.node, d.index, strings.Join(d.slices, " + "), gpu.FormatMilli(d.usedMilli))
	}
	s.say("  %d notebooks asking for %s GPUs in all use %s.", u.pods, gpu.FormatMilli(u.milli), plural(u.devices, "GPU"))
	return nil
}

// gangStartsTogether is step 4: a PodGroup of gangSize waits until all its
// members exist, then starts all at once.
func (s *story) gangStartsTogether(ctx context.Context) error {
	const group = "train"
	if err := s.cl.Create(ctx, podGroup(TeamB, group, gangSize)); err != nil {
		return fmt.Errorf("create PodGroup %s/%s: %w", TeamB, group, err)
	}
	var members []*corev1.Pod
	var names []string
	for i := range gangSize {
		name := fmt.Sprintf("%s-%d", group, i)
		members = append(members, gangMember(TeamB, group, name, roleTrain))
		names = append(names, name)
	}
	s.say("  team-b submits PodGroup %s (minMember %d) and its pods, 1 GPU each; first %d of them.", group, gangSize, gangSize-1)
	if err := s.createPods(ctx, members[:gangSize-1]...); err != nil {
		return err
	}
	msg, err := s.waitCondition(ctx, TeamB, names[gangSize-2], v1alpha1.ReasonWaitingForMembers, fmt.Sprintf("%d exist", gangSize-1))
	if err != nil {
		return err
	}
	unbound, err := s.pods(ctx, TeamB, roleTrain)
	if err != nil {
		return err
	}
	for _, p := range unbound {
		if p.Spec.NodeName != "" || !gated(&p) {
			return fmt.Errorf("gang member %s started before the gang was complete (node %q)", p.Name, p.Spec.NodeName)
		}
	}
	s.say("  The %d wait, none bound; each says (condition %s): %s", len(unbound), v1alpha1.PodConditionAdmitted, msg)

	// Watch before the last member exists, to time each bind as it happens.
	w, err := s.cs.CoreV1().Pods(TeamB).Watch(ctx, metav1.ListOptions{LabelSelector: v1alpha1.LabelPodGroup + "=" + group})
	if err != nil {
		return fmt.Errorf("watch the gang's pods: %w", err)
	}
	defer w.Stop()
	last := members[gangSize-1]
	if err := s.createPods(ctx, last); err != nil {
		return err
	}
	created := time.Now()
	s.say("  Now the %dth pod, %s.", gangSize, last.Name)
	boundAt, err := watchBinds(ctx, w, gangSize)
	if err != nil {
		return fmt.Errorf("%w\n%s", err, s.describe(ctx, TeamB))
	}
	first, lastBind := spread(boundAt)
	pods, err := s.pods(ctx, TeamB, roleTrain)
	if err != nil {
		return err
	}
	lastPod, err := s.cs.CoreV1().Pods(TeamB).Get(ctx, last.Name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("get pod %s: %w", last.Name, err)
	}
	perNode := map[string]int{}
	for _, p := range pods {
		// kube-scheduler's own record: no member was scheduled before the
		// last one existed (both times are in whole seconds).
		c := podCondition(&p, corev1.PodScheduled)
		if c == nil || c.Status != corev1.ConditionTrue || c.LastTransitionTime.Before(&lastPod.CreationTimestamp) {
			return fmt.Errorf("gang member %s: PodScheduled %+v, want True at or after %s, when the last member was created", p.Name, c, lastPod.CreationTimestamp)
		}
		perNode[p.Spec.NodeName]++
	}
	s.say("  All %d bound within %.2fs of each other, %.1fs after the %dth pod was created; none before it existed.",
		len(boundAt), lastBind.Sub(first).Seconds(), lastBind.Sub(created).Seconds(), gangSize)
	s.say("  They run on %s.", countsByNode(perNode))
	var pg v1alpha1.PodGroup
	err = waitFor(ctx, waitTimeout, "PodGroup "+group+" Running", func(ctx context.Context) error {
		if err := s.cl.Get(ctx, client.ObjectKey{Namespace: TeamB, Name: group}, &pg); err != nil {
			return err
		}
		if pg.Status.Phase != v1alpha1.PodGroupRunning || pg.Status.Running != gangSize {
			return seen("phase %q, %d running", pg.Status.Phase, pg.Status.Running)
		}
		return nil
	})
	if err != nil {
		return err
	}
	s.say("  PodGroup %s: phase %s, %d running.", group, pg.Status.Phase, pg.Status.Running)
	return nil
}

// limits is step 5: a gang that could never fit team A's limit is refused
// at once; team A borrows idle GPUs up to its limit; one pod more waits.
func (s *story) limits(ctx context.Context) error {
	// 1. The webhook refuses what can never fit the limit.
	huge := s.teamALimit + gangSize
	s.say("  team-a submits a gang of %d × 1 GPU (annotation %s: %d); its limit is %d GPUs.", huge, v1alpha1.AnnotationMinMember, huge, s.teamALimit)
	err := s.createPods(ctx, gangMemberOfSize(TeamA, "huge", "huge-0", roleBatch, huge))
	switch {
	case err == nil:
		return fmt.Errorf("the webhook admitted a gang of %d GPUs into queue %s, whose limit is %d", huge, TeamA, s.teamALimit)
	case !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) && !strings.Contains(err.Error(), "denied the request"):
		return err
	case !strings.Contains(err.Error(), "limit"):
		return fmt.Errorf("the webhook refused the gang, but not for its limit: %w", err)
	}
	s.say("  Refused when it is submitted, rather than left waiting forever:")
	s.say("    %s", denial(err))

	// 2. Team A borrows what is idle, up to its limit.
	held, err := s.boundMilli(ctx, TeamA)
	if err != nil {
		return err
	}
	room := int64(s.teamALimit)*gpu.MilliPerGPU - held
	n := int(room / gpu.MilliPerGPU)
	cl, err := s.load(ctx, report.What{GPUNodes: true})
	if err != nil {
		return err
	}
	// Whole GPUs on the idle devices; if the notebooks spread over more
	// devices than they need, quarter-GPU pods fill the rest of the limit
	// on the devices they share.
	n = min(n, idleDevices(report.Nodes(cl)))
	quarters := int((room - int64(n)*gpu.MilliPerGPU) / (gpu.MilliPerGPU / 4))
	var pods []*corev1.Pod
	for i := range n {
		name := fmt.Sprintf("batch-%02d", i+1)
		pods = append(pods, wholeGPUPod(TeamA, name, roleBatch))
		s.batch = append(s.batch, name)
	}
	for i := range quarters {
		name := fmt.Sprintf("fill-%02d", i+1)
		pods = append(pods, fractionPod(TeamA, name, roleBatch, "0.25"))
		s.batch = append(s.batch, name)
	}
	s.say("  team-a starts %d batch pods of 1 GPU each, more than its quota of %d: the GPUs are idle.", n, teamAQuota)
	if quarters > 0 {
		s.say("  And %d of a quarter GPU, on the devices the notebooks share, to reach its limit.", quarters)
	}
	if err := s.createPods(ctx, pods...); err != nil {
		return err
	}
	if _, err := s.waitBound(ctx, TeamA, s.batch); err != nil {
		return err
	}
	s.batchBoundAt = time.Now()
	want := int64(s.teamALimit) * gpu.MilliPerGPU
	var q *v1alpha1.Queue
	err = waitFor(ctx, waitTimeout, fmt.Sprintf("queue %s's status showing %d GPUs allocated", TeamA, s.teamALimit), func(ctx context.Context) error {
		if q, err = s.getQueue(ctx, TeamA); err != nil {
			return err
		}
		if got := q.Status.Allocated[v1alpha1.ResourceGPU]; got.MilliValue() != want {
			return seen("allocated %s", got.String())
		}
		return nil
	})
	if err != nil {
		return err
	}
	alloc := q.Status.Allocated[v1alpha1.ResourceGPU]
	s.say("  All %d run. Queue %s now holds %s GPUs (status.allocated), %d beyond its quota.", len(s.batch), TeamA, gpu.FormatMilli(alloc.MilliValue()), s.teamALimit-teamAQuota)

	// 3. One more fits the limit on its own, not on top of what runs.
	s.waiting = fmt.Sprintf("batch-%02d", n+1)
	if err := s.createPods(ctx, wholeGPUPod(TeamA, s.waiting, roleBatch)); err != nil {
		return err
	}
	msg, err := s.waitCondition(ctx, TeamA, s.waiting, v1alpha1.ReasonWaitingForQuota, "at its limit")
	if err != nil {
		return err
	}
	s.say("  One more, %s, is accepted (alone it fits the limit) but waits (%s): %s", s.waiting, v1alpha1.ReasonWaitingForQuota, msg)
	s.say("  It will run when other team-a pods end.")
	return nil
}

// reclaim is step 6: team B, below its fair share, submits a gang within
// its quota on a full cluster; team A's youngest pods make room.
func (s *story) reclaim(ctx context.Context) error {
	const group = "burst"
	if d := minRuntime + time.Second - time.Since(s.batchBoundAt); d > 0 {
		s.say("  (Partita does not evict what started less than %s ago on this dev cluster, 1 minute by default: waiting %.0fs.)", minRuntime, d.Seconds())
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
		}
	}
	if err := s.cl.Create(ctx, podGroup(TeamB, group, gangSize)); err != nil {
		return fmt.Errorf("create PodGroup %s/%s: %w", TeamB, group, err)
	}
	var pods []*corev1.Pod
	var names []string
	for i := range gangSize {
		name := fmt.Sprintf("%s-%d", group, i)
		pods = append(pods, gangMember(TeamB, group, name, roleBurst))
		names = append(names, name)
	}
	s.say("  The cluster is full. team-b submits a second gang, %s: %d × 1 GPU, which brings it to its quota of %d.", group, gangSize, teamBQuota)
	if err := s.createPods(ctx, pods...); err != nil {
		return err
	}
	submitted := time.Now()
	if _, err := s.waitBound(ctx, TeamB, names); err != nil {
		return err
	}
	took := time.Since(submitted)
	var evicted []corev1.Event
	err := waitFor(ctx, waitTimeout, "Preempted events on team-a's evicted pods", func(ctx context.Context) error {
		evs, err := s.eventsOf(ctx, TeamA, v1alpha1.ReasonPreempted)
		if err != nil {
			return err
		}
		if len(evs) == 0 {
			return seen("no %s event in namespace %s", v1alpha1.ReasonPreempted, TeamA)
		}
		evicted = evs
		return nil
	})
	if err != nil {
		return err
	}
	var victims []string
	for _, e := range evicted {
		if n := e.InvolvedObject.Name; !slices.Contains(victims, n) {
			victims = append(victims, n)
		}
	}
	for _, v := range victims {
		err := waitGone(ctx, "evicted pod "+TeamA+"/"+v, func(ctx context.Context) error {
			_, err := s.cs.CoreV1().Pods(TeamA).Get(ctx, v, metav1.GetOptions{})
			return err
		})
		if err != nil {
			return err
		}
	}
	example := evicted[len(evicted)-1]
	s.say("  Partita evicted %s of team-a's (it takes the most recently started first): %s", plural(len(victims), "pod"), strings.Join(victims, ", "))
	s.say("  Why (event %s on %s): %s", example.Reason, example.InvolvedObject.Name, example.Message)
	s.say("  team-b's gang %s runs: all %d bound %.1fs after it was submitted.", group, gangSize, took.Seconds())
	return nil
}

// summary is step 7: where everything runs, per device and per queue, and
// what whole-GPU allocation would have needed for the same pods.
func (s *story) summary(ctx context.Context) error {
	// The admission loop writes queue status after each change: wait until
	// it matches the pods, so the table is the settled state.
	err := waitFor(ctx, waitTimeout, "the queues' status matching their running pods", func(ctx context.Context) error {
		for _, name := range []string{TeamA, TeamB} {
			q, err := s.getQueue(ctx, name)
			if err != nil {
				return err
			}
			held, err := s.boundMilli(ctx, name)
			if err != nil {
				return err
			}
			if got := q.Status.Allocated[v1alpha1.ResourceGPU]; got.MilliValue() != held {
				return seen("queue %s: status.allocated %s, its pods hold %s", name, got.String(), gpu.FormatMilli(held))
			}
			if _, ok := q.Status.FairShare[v1alpha1.ResourceGPU]; !ok {
				return seen("queue %s: no fair share in its status", name)
			}
			if name == TeamA && q.Status.PendingWorkloads != 1 {
				return seen("queue %s: %d pending workloads in its status, want 1 (%s)", name, q.Status.PendingWorkloads, s.waiting)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	cl, err := s.load(ctx, report.What{GPUNodes: true, Queues: true})
	if err != nil {
		return err
	}
	nodes := report.Nodes(cl)
	s.say("  Every GPU and who holds it (nb-*, batch-*: team-a; train-*, burst-*: team-b):")
	if err := writeDeviceMap(s.opts.Out, nodes); err != nil {
		return err
	}
	s.say("")
	s.say("  The queues (as 'kubectl partita queues' shows them):")
	if err := ctl.WriteQueues(indent(s.opts.Out), report.QueuesReport{Queues: demoQueues(report.Queues(cl))}, ctl.OutputTable); err != nil {
		return err
	}
	s.say("")
	nb := usageOf(nodes, isNotebook)
	all := usageOf(nodes, isDemo)
	s.say("  With whole-GPU allocation, from the pods running now:")
	s.say("    the %d notebooks ask for %s GPUs and use %s here; whole-GPU allocation would have taken %s (%s as many).",
		nb.pods, gpu.FormatMilli(nb.milli), plural(nb.devices, "GPU"), plural(nb.whole, "GPU"), times(nb.whole, nb.devices))
	line := fmt.Sprintf("    all %d running pods hold %s here; whole-GPU allocation would need %s",
		all.pods, plural(all.devices, "GPU"), plural(all.whole, "GPU"))
	if over := all.whole - s.gpus; over > 0 {
		line += fmt.Sprintf(", %d more than the cluster has: %s would not run", over, plural(over, "pod"))
	}
	s.say("%s.", line)
	return nil
}

// next is the end: what to try on the cluster the demo leaves running.
func (s *story) next(ctx context.Context) error {
	cl, err := s.load(ctx, report.What{GPUNodes: true, Queues: true, PodGroupsAndEvents: true, Namespace: TeamA})
	if err != nil {
		return err
	}
	why, err := report.Why(cl, TeamA, s.waiting, time.Now())
	if err != nil {
		return err
	}
	if !why.Waiting {
		return fmt.Errorf("pod %s/%s was left to wait, but %s", TeamA, s.waiting, why.Summary)
	}
	name := ""
	if s.c.Name() != devcluster.DefaultName {
		name = " --name " + s.c.Name()
	}
	s.say("")
	s.say("The cluster keeps running. Look around:")
	s.say("  export KUBECONFIG=%s", s.c.KubeconfigPath())
	s.say("  export PATH=%s:%s:$PATH   # kubectl partita, and kubectl", s.pluginDir(), s.c.BinDir())
	tw := newTable(s.opts.Out)
	tw.row("  kubectl partita nodes\t# every GPU and its slices\n")
	tw.row("  kubectl partita queues\t# quotas, limits, fair shares\n")
	tw.row("  kubectl partita why %s -n %s\t# the pod left waiting on purpose\n", s.waiting, TeamA)
	for _, f := range why.Findings {
		// The gate and the events say again what the other checks explain.
		if f.Status == report.StatusOK || f.Check == report.CheckGates || f.Check == report.CheckEvents {
			continue
		}
		tw.row("    %s %s: %s\n", f.Status, f.Check, f.Message)
	}
	tw.row("  kubectl get queues,podgroups -A\n")
	tw.row("  bin/partita dev demo%s\t# the story again, from the start\n", name)
	tw.row("  bin/partita dev down%s\t# stop the cluster and delete its files\n", name)
	if err := tw.flush(); err != nil {
		return err
	}
	return nil
}

// reset deletes what an earlier run left: the namespaces with their pods,
// PodGroups and events, then the queues. It waits until they are gone, so
// the new ones start from nothing.
func (s *story) reset(ctx context.Context) error {
	var found []string
	for _, ns := range []string{TeamA, TeamB} {
		_, err := s.cs.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("get namespace %s: %w", ns, err)
		}
		found = append(found, "namespace "+ns)
		// Pods of simulated nodes end at once; without this the namespace
		// waits for them one by one.
		if err := s.cs.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}, metav1.ListOptions{}); err != nil {
			return fmt.Errorf("delete the pods of %s: %w", ns, err)
		}
		if err := s.cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete namespace %s: %w", ns, err)
		}
	}
	for _, q := range []string{TeamA, TeamB, ParentQueue} {
		err := s.cl.Delete(ctx, &v1alpha1.Queue{ObjectMeta: metav1.ObjectMeta{Name: q}})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("delete queue %s: %w", q, err)
		}
		found = append(found, "queue "+q)
	}
	if len(found) == 0 {
		return nil
	}
	s.say("  Removing what the last run of the demo left: %s", strings.Join(found, ", "))
	for _, ns := range []string{TeamA, TeamB} {
		err := waitGone(ctx, "namespace "+ns, func(ctx context.Context) error {
			_, err := s.cs.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
			return err
		})
		if err != nil {
			return err
		}
	}
	for _, q := range []string{TeamA, TeamB, ParentQueue} {
		if err := waitGone(ctx, "queue "+q, func(ctx context.Context) error { _, err := s.getQueue(ctx, q); return err }); err != nil {
			return err
		}
	}
	return nil
}

// createNamespace creates a namespace and waits for its default service
// account: the API server refuses pods in a namespace until
// kube-controller-manager has made it.
func (s *story) createNamespace(ctx context.Context, ns string) error {
	if _, err := s.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create namespace %s: %w", ns, err)
	}
	return waitFor(ctx, waitTimeout, "the default service account of namespace "+ns, func(ctx context.Context) error {
		_, err := s.cs.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		return err
	})
}

// boundMilli is what the bound, unfinished pods of namespace hold, in
// milli-GPUs.
func (s *story) boundMilli(ctx context.Context, namespace string) (int64, error) {
	list, err := s.cs.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, fmt.Errorf("list pods of %s: %w", namespace, err)
	}
	var m int64
	for i := range list.Items {
		p := &list.Items[i]
		if p.Spec.NodeName != "" && p.DeletionTimestamp == nil && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			m += podMilli(p)
		}
	}
	return m, nil
}

// watchBinds reads w until want pods are bound and returns when each was
// first seen bound.
func watchBinds(ctx context.Context, w watch.Interface, want int) (map[string]time.Time, error) {
	boundAt := map[string]time.Time{}
	timeout := time.After(waitTimeout)
	for len(boundAt) < want {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-timeout:
			return nil, fmt.Errorf("the gang did not start within %s: %d of %d members bound", waitTimeout, len(boundAt), want)
		case ev, ok := <-w.ResultChan():
			if !ok {
				return nil, errors.New("the watch on the gang's pods ended early")
			}
			p, isPod := ev.Object.(*corev1.Pod)
			if !isPod || p.Spec.NodeName == "" {
				continue
			}
			if _, ok := boundAt[p.Name]; !ok {
				boundAt[p.Name] = time.Now()
			}
		}
	}
	return boundAt, nil
}

// spread is the first and the last of times.
func spread(times map[string]time.Time) (first, last time.Time) {
	for _, t := range times {
		if first.IsZero() || t.Before(first) {
			first = t
		}
		if t.After(last) {
			last = t
		}
	}
	return first, last
}

// countsByNode writes "gpu-node-1 (5), gpu-node-2 (3)".
func countsByNode(m map[string]int) string {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	sort.Strings(names)
	parts := make([]string, 0, len(names))
	for _, n := range names {
		parts = append(parts, fmt.Sprintf("%s (%d)", n, m[n]))
	}
	return strings.Join(parts, ", ")
}

// denial is the webhook's message without the API server's preamble
// ("admission webhook "..." denied the request: ").
func denial(err error) string {
	msg := err.Error()
	if _, after, ok := strings.Cut(msg, "denied the request: "); ok {
		return after
	}
	return msg
}
