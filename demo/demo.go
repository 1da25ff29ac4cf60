// Package demo tells Partita's story on a dev cluster, step by step, in words
// a newcomer understands: two teams with queues, notebooks that share GPUs,
// replicas placed where their model is cached, a gang that starts all at
// once, limits, reclaim, and what it all adds up to. Every claim it prints
// is read back from the cluster: each step creates objects, then polls the
// API server until what it is about to say is true, and fails with what it
// last saw when that does not happen in time.
//
// It imports the dev cluster (package devcluster) and the reports that
// `kubectl partita` and the console show (package report), which it reuses
// for its tables rather than counting on its own; nothing imports it but cmd/partita. The console
// is one of the dev cluster's host processes (cmd/partita starts it with
// the cluster); the demo prints its URL.
package demo

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"time"

	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/devcluster"
	"github.com/partita-dev/partita/report"
)

// The queues and namespaces the demo owns. Every run deletes and recreates
// them, so it can run again on the same cluster.
const (
	// ParentQueue is the parent of the teams' queues.
	ParentQueue = "research"
	// TeamA is team A's queue and namespace: notebooks and batch work.
	TeamA = "team-a"
	// TeamB is team B's queue and namespace: training gangs.
	TeamB = "team-b"
)

// The demo's numbers. The teams' quotas and limits derive from the
// cluster's GPUs (32 on the default dev cluster) in Run.
const (
	// minGPUs is the smallest cluster the story works on: a gang of
	// gangSize, the notebooks, and room for team A to borrow.
	minGPUs = 24
	// gangSize is the number of 1-GPU members of each training gang.
	gangSize = 8
	// teamAQuota and teamBQuota are the deserved GPUs of the teams.
	teamAQuota = 8
	teamBQuota = 2 * gangSize
	// minRuntime is the dev cluster's --preempt-min-runtime: the extender
	// evicts nothing admitted more recently (cmd/partita/dev_processes.go).
	minRuntime = 5 * time.Second
	// waitTimeout bounds each wait for the cluster to do what the demo
	// says it does.
	waitTimeout = 60 * time.Second
)

// notebookFractions are the GPU fractions the notebooks ask for, in the
// order they are created: 2 GPUs in all.
func notebookFractions() []string { return []string{"0.5", "0.25", "0.5", "0.25", "0.25", "0.25"} }

// Options configure Run.
type Options struct {
	// Out receives the story.
	Out io.Writer
	// PartitaBinary is the partita binary that runs the demo; the hints at
	// the end name the kubectl plugin next to it.
	PartitaBinary string
	// ConsoleURL, when set, returns the URL (with its token) of the
	// console the dev cluster runs, which the demo prints once the cluster
	// is up and again at the end.
	ConsoleURL func() (string, error)
}

// story is one run of the demo: the clients, and what the earlier steps
// learnt that the later ones need.
type story struct {
	c    *devcluster.Cluster
	cs   kubernetes.Interface
	cl   client.Client
	opts Options

	// gpus counts the cluster's healthy GPUs.
	gpus int
	// teamALimit is team A's GPU limit: what the cluster has beside one
	// gang, so that team A at its limit fills the cluster.
	teamALimit int
	// notebooks are the names of the notebook pods.
	notebooks []string
	// batch are team A's 1-GPU pods that borrow idle GPUs.
	batch []string
	// batchBoundAt is when the last of them was bound: reclaim waits until
	// it is older than minRuntime.
	batchBoundAt time.Time
	// waiting is the pod left waiting on purpose, for `why`.
	waiting string
}

// Run brings the cluster up if needed and tells the story. It leaves the
// cluster running, with the demo's workloads, for the user to look at.
func Run(ctx context.Context, c *devcluster.Cluster, opts Options) error {
	if opts.Out == nil {
		opts.Out = io.Discard
	}
	s := &story{c: c, opts: opts}
	start := time.Now()
	steps := []struct {
		title string
		run   func(context.Context) error
	}{
		{"A local Kubernetes cluster with simulated GPU nodes", s.cluster},
		{"Two teams share the cluster through queues", s.teams},
		{"Notebooks share GPUs: team-a's notebooks ask for a quarter or half of a GPU", s.notebooksShare},
		{"Models: a replica starts where its weights already are", s.models},
		{"A training gang of 8 starts all at once, or not at all", s.gangStartsTogether},
		{"Limits: team-a borrows idle GPUs up to its limit, and no further", s.limits},
		{"Reclaim: team-b wants its share back", s.reclaim},
		{"Where everything runs", s.summary},
	}
	consoleURL := ""
	for i, st := range steps {
		s.say("")
		s.say("Step %d. %s", i+1, st.title)
		stepStart := time.Now()
		if err := st.run(ctx); err != nil {
			return fmt.Errorf("demo step %d (%s): %w", i+1, st.title, err)
		}
		if i > 0 {
			s.say("  (step took %.1fs)", time.Since(stepStart).Seconds())
		}
		// The cluster's console runs once the cluster is up, so the rest
		// of the story can be watched in a browser as it happens.
		if i == 0 && opts.ConsoleURL != nil {
			var err error
			if consoleURL, err = opts.ConsoleURL(); err != nil {
				return fmt.Errorf("the dev cluster's console: %w", err)
			}
			s.say("")
			s.say("The Partita console (open it to watch the story live): %s", consoleURL)
		}
	}
	s.say("")
	s.say("The demo took %.0fs.", time.Since(start).Seconds())
	if err := s.next(ctx); err != nil {
		return err
	}
	if consoleURL != "" {
		s.say("")
		s.say("The Partita console keeps serving with the cluster (until 'partita dev down'):")
		s.say("  %s", consoleURL)
	}
	return nil
}

// say writes one line of the story.
func (s *story) say(format string, args ...any) {
	_, _ = fmt.Fprintf(s.opts.Out, format+"\n", args...)
}

// load reads the cluster for the ctl views.
func (s *story) load(ctx context.Context, what report.What) (*report.Cluster, error) {
	return report.Load(ctx, s.cl, what)
}

// pluginDir is where `make build` links kubectl-partita: beside partita.
func (s *story) pluginDir() string {
	if s.opts.PartitaBinary == "" {
		return "bin"
	}
	return filepath.Dir(s.opts.PartitaBinary)
}
