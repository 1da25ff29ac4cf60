package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
	"k8s.io/utils/clock"

	"github.com/partita-dev/partita/nodeagent"
	"github.com/partita-dev/partita/nodeagent/interposer"
)

// interposerFlags are the flags of `partita interposer`.
type interposerFlags struct {
	source     string
	hostDir    string
	interval   time.Duration
	once       bool
	healthAddr string
	verbosity  int
}

func newInterposerCommand() *cobra.Command {
	f := &interposerFlags{}
	cmd := &cobra.Command{
		Use:   "interposer",
		Short: "Install HAMi-core (libvgpu.so) and its ld.so.preload on the node for hami-core slices, and keep them there",
		Long: `The interposer command copies the HAMi-core library at --source (in the chart,
a file of HAMi's published image, mounted as an image volume) into --host-dir as
` + interposer.LibraryName + `, and writes beside it ` + interposer.PreloadName + `, which names
` + interposer.ContainerLibrary + `. The agent bind-mounts both read-only into every
container of a hami-core slice (docs/guide/isolation.md).

It checks the files every --interval and puts back whatever was removed or
changed, and answers /readyz once they are in place. --once installs and exits.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runInterposer(cmd, f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.source, "source", "", "the HAMi-core library to install (required)")
	fl.StringVar(&f.hostDir, "host-dir", interposer.DefaultHostDir, "the host directory the agent mounts into hami-core containers (its --interposer-dir)")
	fl.DurationVar(&f.interval, "interval", time.Minute, "how often the installed files are checked and put back if changed")
	fl.BoolVar(&f.once, "once", false, "install and exit")
	fl.StringVar(&f.healthAddr, "health-addr", ":8083", "address of the /metrics, /healthz and /readyz endpoints")
	fl.IntVarP(&f.verbosity, "v", "v", 0, "log verbosity")
	return cmd
}

func runInterposer(cmd *cobra.Command, f *interposerFlags) error {
	log := textlogger.NewLogger(textlogger.NewConfig(textlogger.Verbosity(f.verbosity), textlogger.Output(cmd.ErrOrStderr())))
	klog.SetLogger(log)
	ctx := logr.NewContext(cmd.Context(), log)
	switch {
	case f.source == "":
		return errors.New("--source: name the HAMi-core library to install")
	case f.hostDir == "":
		return errors.New("--host-dir: name the host directory to install into")
	case f.interval <= 0:
		return fmt.Errorf("--interval %s: want a positive duration", f.interval)
	}
	if f.once {
		wrote, err := interposer.Install(f.source, f.hostDir)
		if err != nil {
			return err
		}
		log.Info("Installed the interposer", "source", f.source, "hostDir", f.hostDir, "changed", wrote)
		return nil
	}
	ready := func() error { return interposer.Check(f.hostDir) }
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		return nodeagent.Serve(gctx, f.healthAddr, nodeagent.Handler(nodeagent.NewMetrics(), ready))
	})
	g.Go(func() error {
		if err := interposer.Keep(gctx, f.source, f.hostDir, f.interval, clock.RealClock{}); err != nil {
			return err
		}
		// ctx ended: stop the server too.
		return gctx.Err()
	})
	if err := g.Wait(); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}
