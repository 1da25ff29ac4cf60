// Command images builds the container images that the dev cluster's real
// node runs (`partita dev up --real-node`, docs/real-node.md), without Docker
// and without a registry: each image is one layer of locally built binaries,
// written with go-containerregistry as a tarball that `ctr images import`
// loads into the node's containerd.
//
//	go run ./hack/images --partita bin/partita --programs bin/images/programs \
//	    --cluster-bin ~/.cache/partita/bin/k8s-v1.37.2 --out bin/images
//
// `make images` runs it. An image whose inputs (its files and its
// definition) have not changed since the last run is not written again.
// The names are those of devcluster/realnode (Images): Partita's
// own image localhost/partita/partita:dev, the sample workload
// localhost/partita/sample:dev, the hami-core tests' stand-in for HAMi's
// image localhost/partita/interposer-test:dev (a preload library and a
// probe, built with gcc from hack/images/preload-test), and for the
// cluster's own parts the names
// their upstream images carry (registry.k8s.io/kube-scheduler:v1.37.2,
// registry.k8s.io/coredns/coredns:v1.15.0, registry.k8s.io/pause:3.10.2), so
// the chart's default kube-scheduler image and containerd's pinned sandbox
// image resolve to them without a pull.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/partita-dev/partita/devcluster/realnode"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("images", flag.ContinueOnError)
	partita := fs.String("partita", "bin/partita", "the partita binary (make build)")
	programs := fs.String("programs", "bin/images/programs", "directory with the static sample and pause binaries, and the preload test's library (libpreload-test.so) and probe")
	clusterBin := fs.String("cluster-bin", "", "the cluster binaries (make cluster-bins): kube-scheduler, coredns")
	out := fs.String("out", "bin/images", "directory to write <name>.tar into")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *clusterBin == "" {
		return fmt.Errorf("--cluster-bin is required (the directory 'make cluster-bins' prints)")
	}
	libs, err := sharedLibraries(*partita)
	if err != nil {
		return err
	}
	probeLibs, err := sharedLibraries(filepath.Join(*programs, "probe"))
	if err != nil {
		return err
	}
	specs := catalog(*partita, libs, *programs, probeLibs, *clusterBin)
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", *out, err)
	}
	for _, s := range specs {
		path := filepath.Join(*out, s.File)
		wrote, err := s.writeIfChanged(path)
		if err != nil {
			return fmt.Errorf("image %s: %w", s.Refs[0], err)
		}
		state := "up to date"
		if wrote {
			state = "written"
		}
		fmt.Printf("images: %-45s %s (%s)\n", s.Refs[0], path, state)
	}
	return nil
}

// catalog is every image the real node loads, in realnode.Images order.
// partitaLibs and probeLibs are the host's libraries that partita and the
// probe load (sharedLibraries).
func catalog(partita string, partitaLibs []string, programs string, probeLibs []string, clusterBin string) []spec {
	path := "PATH=/usr/local/bin:/usr/bin:/bin"
	partitaFiles := []file{{Path: "/usr/local/bin/partita", Source: partita, Mode: 0o755}}
	for _, l := range partitaLibs {
		partitaFiles = append(partitaFiles, file{Path: l, Source: l, Mode: 0o755})
	}
	interposerFiles := []file{
		{Path: realnode.InterposerTestLibrary, Source: filepath.Join(programs, "libpreload-test.so"), Mode: 0o644},
		{Path: realnode.InterposerTestProbe, Source: filepath.Join(programs, "probe"), Mode: 0o755},
	}
	for _, l := range probeLibs {
		interposerFiles = append(interposerFiles, file{Path: l, Source: l, Mode: 0o755})
	}
	byName := map[string]spec{
		realnode.ImagePartita.File: {
			// As the Dockerfile's: the binary on distroless cc (glibc for
			// go-nvml's cgo), user 65532; the agent's DaemonSet overrides
			// the user where it needs root.
			Files: partitaFiles, Entrypoint: []string{"/usr/local/bin/partita"}, User: "65532:65532", Env: []string{path},
		},
		realnode.ImageSample.File: {
			Files:      []file{{Path: "/sample", Source: filepath.Join(programs, "sample"), Mode: 0o755}},
			Entrypoint: []string{"/sample"}, User: "65532:65532", Env: []string{path},
		},
		realnode.ImagePause.File: {
			Files:      []file{{Path: "/pause", Source: filepath.Join(programs, "pause"), Mode: 0o755}},
			Entrypoint: []string{"/pause"}, User: "65535:65535",
		},
		realnode.ImageKubeScheduler.File: {
			// The upstream image's layout: the chart runs `kube-scheduler`
			// by name.
			Files: []file{{Path: "/usr/local/bin/kube-scheduler", Source: filepath.Join(clusterBin, "kube-scheduler"), Mode: 0o755}},
			Env:   []string{path},
		},
		realnode.ImageCoreDNS.File: {
			Files:      []file{{Path: "/coredns", Source: filepath.Join(clusterBin, "coredns"), Mode: 0o755}},
			Entrypoint: []string{"/coredns"}, User: "65532:65532",
		},
		realnode.ImageInterposerTest.File: {
			// The probe runs as root by default: the tests show that
			// even root cannot change the preload file.
			Files: interposerFiles, Entrypoint: []string{realnode.InterposerTestProbe}, Env: []string{path},
		},
	}
	var specs []spec
	for _, img := range realnode.Images {
		s := byName[img.File]
		s.File, s.Refs = img.File, []string{img.Ref}
		specs = append(specs, s)
	}
	return specs
}
