package realnode

// Image is one container image the real node loads from a tarball that
// `make images` writes (hack/images).
type Image struct {
	// Ref is the name containerd knows it by.
	Ref string
	// File is the tarball's name in the images directory.
	File string
}

// The images of the real node. Partita's and the sample's are named under
// localhost/ (never pulled: the tag is not latest and pull policies are
// IfNotPresent); the cluster's own parts carry their upstream names, so
// the chart's default kube-scheduler image and containerd's pinned sandbox
// image need no override and no registry.
var (
	ImagePartita       = Image{Ref: "localhost/partita/partita:dev", File: "partita.tar"}
	ImageSample        = Image{Ref: "localhost/partita/sample:dev", File: "sample.tar"}
	ImagePause         = Image{Ref: "registry.k8s.io/pause:3.10.2", File: "pause.tar"}
	ImageKubeScheduler = Image{Ref: "registry.k8s.io/kube-scheduler:" + K8sVersion, File: "kube-scheduler.tar"}
	ImageCoreDNS       = Image{Ref: "registry.k8s.io/coredns/coredns:" + CoreDNSVersion, File: "coredns.tar"}
	// ImageInterposerTest stands in for HAMi's image on the real node: a
	// preload library of the project's own (hack/images/preload-test) at
	// InterposerTestLibrary, which the chart installs as the node's
	// interposer, and the dynamically linked probe its tests run at
	// InterposerTestProbe.
	ImageInterposerTest = Image{Ref: "localhost/partita/interposer-test:dev", File: "interposer-test.tar"}
)

// Images lists every image the node loads.
var Images = []Image{ImagePartita, ImageSample, ImagePause, ImageKubeScheduler, ImageCoreDNS, ImageInterposerTest}

// The files of ImageInterposerTest. The library sits where HAMi's image
// keeps HAMi-core, without the version suffix.
const (
	InterposerTestLibrary = "/k8s-vgpu/lib/nvidia/libvgpu.so"
	InterposerTestProbe   = "/usr/local/bin/probe"
)

// K8sVersion is the release of kubelet and kube-proxy (the cluster
// binaries'); devcluster.K8sVersion is the same.
const K8sVersion = "v1.37.2"

// CoreDNSVersion is the CoreDNS release e2e/clusterbins/build.sh installs.
const CoreDNSVersion = "v1.15.0"
