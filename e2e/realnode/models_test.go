package realnode

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/devcluster"
	"github.com/partita-dev/partita/devcluster/realnode"
	"github.com/partita-dev/partita/internal/envtestutil"
)

const modelsNamespace = "models-e2e"

// testSafetensors is a valid safetensors file of one F16 tensor of n
// random elements; lie makes its header claim one element more.
func testSafetensors(t *testing.T, n int, lie bool) []byte {
	t.Helper()
	claimed := n
	if lie {
		claimed++
	}
	hdr := fmt.Sprintf(`{"__metadata__":{"format":"pt"},"w":{"dtype":"F16","shape":[%d],"data_offsets":[0,%d]}}`, claimed, 2*claimed)
	var b bytes.Buffer
	_ = binary.Write(&b, binary.LittleEndian, uint64(len(hdr)))
	b.WriteString(hdr)
	data := make([]byte, 2*n)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	b.Write(data)
	return b.Bytes()
}

// writeModelFiles puts files in the real node's file-roots directory (the
// chart's modelCache.fileRoots on the dev cluster) and returns its URI.
func writeModelFiles(t *testing.T, name string, files map[string][]byte) string {
	t.Helper()
	dir := filepath.Join(cluster.RealNode().ModelFilesDir(), name)
	for p, b := range files {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return "file://" + dir
}

func modelClient(t *testing.T) client.Client {
	t.Helper()
	cfg, err := cluster.RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	ctrllog.SetLogger(logr.Discard())
	c, err := client.New(cfg, client.Options{Scheme: envtestutil.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func createModel(ctx context.Context, t *testing.T, c client.Client, name, uri string) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: modelsNamespace}}
	if err := c.Create(ctx, ns); err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
	m := &v1alpha1.Model{ObjectMeta: metav1.ObjectMeta{Namespace: modelsNamespace, Name: name},
		Spec: v1alpha1.ModelSpec{Source: v1alpha1.ModelSource{URI: uri}}}
	if err := c.Create(ctx, m); err != nil {
		t.Fatalf("create Model %s: %v", name, err)
	}
	t.Cleanup(func() { _ = c.Delete(context.WithoutCancel(ctx), m) })
}

func modelPod(prefix, model string, args ...string) *corev1.Pod {
	p := samplePod(prefix, map[string]string{v1alpha1.AnnotationModel: model})
	p.Spec.Containers[0].Args = args
	return p
}

// hashes are the sample's "sha256 HEX PATH" lines, as PATH=HEX sorted.
func hashes(logs string) []string {
	var out []string
	for _, l := range strings.Split(logs, "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "sha256" {
			out = append(out, f[2]+"="+f[1])
		}
	}
	sort.Strings(out)
	return out
}

// TestRealNodePodReadsItsModel: a pod that asks for a Model in the dev
// cluster's S3 store (--addons s3, versitygw) reads, at /models/NAME,
// files byte-identical to the source, read-only, and its
// container started only once the node's cache had them complete and
// verified; a second pod of the same model starts from the cache (one
// fetch per node: the cache's miss counter does not move); a model whose
// safetensors header lies about its offsets is never served: its pod
// waits with the reason, and the Model says Failed.
func TestRealNodePodReadsItsModel(t *testing.T) {
	needCluster(t)
	ctx := testContext(t, 5*time.Minute)
	c := modelClient(t)
	files := map[string][]byte{
		"config.json":                      []byte(`{"architectures":["LlamaForCausalLM"],"hidden_size":64}`),
		"model-00001-of-00002.safetensors": testSafetensors(t, 3<<20, false),
		"model-00002-of-00002.safetensors": testSafetensors(t, 1<<20, false),
		"tokenizer/tokenizer.json":         bytes.Repeat([]byte(`{"v":1}`), 1000),
	}
	var want []string
	for p, b := range files {
		sum := sha256.Sum256(b)
		want = append(want, p+"="+hex.EncodeToString(sum[:]))
	}
	sort.Strings(want)
	createS3Model(ctx, t, c, "tiny-llama", files)

	pod := waitRunning(ctx, t, createPod(ctx, t, modelsNamespace, modelPod("model", "tiny-llama", "--hash-dir", "/models/tiny-llama")))
	logs := waitLogLine(ctx, t, pod, "write /models/tiny-llama:")
	if got := hashes(logs); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("the container read (PATH=SHA256):\n%s\nwant the source's:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if !strings.Contains(logs, "write /models/tiny-llama: error:") || !strings.Contains(logs, "read-only file system") {
		t.Errorf("the model's directory took a write; log:\n%s", logs)
	}
	if got := envFromLog(logs, v1alpha1.EnvModelDir); got != "/models/tiny-llama" {
		t.Errorf("%s=%q, want /models/tiny-llama", v1alpha1.EnvModelDir, got)
	}
	m := &v1alpha1.Model{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: modelsNamespace, Name: "tiny-llama"}, m); err != nil {
		t.Fatal(err)
	}
	n := m.Status.ModelNode(realnode.NodeName)
	if n == nil || n.Phase != v1alpha1.ModelReady || n.LastTransitionTime == nil {
		t.Fatalf("Model status of %s = %+v, want Ready", realnode.NodeName, n)
	}
	started := pod.Status.ContainerStatuses[0].State.Running.StartedAt
	if started.Before(n.LastTransitionTime) {
		t.Errorf("the container started at %s, before the model was Ready on the node (%s)", started, n.LastTransitionTime)
	}
	if m.Status.Phase != v1alpha1.ModelReady || len(m.Status.Files) != len(files) {
		t.Errorf("Model status: phase %q, %d files; want Ready with %d", m.Status.Phase, len(m.Status.Files), len(files))
	}

	missesBefore := modelCacheMetric(ctx, t, "partita_model_cache_misses_total")
	originBefore := modelCacheMetric(ctx, t, "partita_model_origin_bytes_total")
	// How much later than an identical pod without a model a pod whose model
	// the node holds starts (docs/benchmarks.md, "Models"): each from its
	// creation to its container's start.
	plain := samplePod("plain", nil)
	plain.Spec.Containers[0].Args = []string{"--hash-dir", "/etc"}
	plainStart := time.Now()
	plainPod := waitRunning(ctx, t, createPod(ctx, t, modelsNamespace, plain))
	plainTook := time.Since(plainStart)
	modelStart := time.Now()
	pod2 := waitRunning(ctx, t, createPod(ctx, t, modelsNamespace, modelPod("model2", "tiny-llama", "--hash-dir", "/models/tiny-llama")))
	modelTook := time.Since(modelStart)
	t.Logf("MODELS start: a pod without a model ran %.2fs after its creation (container started %s after), one whose model the node holds %.2fs (%s): %+.2fs",
		plainTook.Seconds(), startedAfterCreation(plainPod), modelTook.Seconds(), startedAfterCreation(pod2), (modelTook - plainTook).Seconds())
	if got := hashes(waitLogLine(ctx, t, pod2, "write /models/tiny-llama:")); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("the second pod read:\n%s", strings.Join(got, "\n"))
	}
	if after := modelCacheMetric(ctx, t, "partita_model_cache_misses_total"); after != missesBefore {
		t.Errorf("the second pod's model was fetched again: misses %v -> %v", missesBefore, after)
	}
	if after := modelCacheMetric(ctx, t, "partita_model_origin_bytes_total"); after != originBefore {
		t.Errorf("the second pod's model read %v bytes from S3, want none", after-originBefore)
	}

	createModel(ctx, t, c, "liar", writeModelFiles(t, "liar", map[string][]byte{"model.safetensors": testSafetensors(t, 1000, true)}))
	bad := createPod(ctx, t, modelsNamespace, modelPod("liar", "liar"))
	poll(t, 2*time.Minute, "the liar's pod to wait with the reason", func() (bool, string) {
		evs, err := clientset.CoreV1().Events(modelsNamespace).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + bad.Name})
		if err != nil {
			return false, err.Error()
		}
		var seen []string
		for _, e := range evs.Items {
			seen = append(seen, e.Reason+": "+e.Message)
			if e.Reason == "FailedMount" && strings.Contains(e.Message, "invalid safetensors") {
				return true, ""
			}
		}
		return false, strings.Join(seen, "\n")
	})
	p, err := clientset.CoreV1().Pods(modelsNamespace).Get(ctx, bad.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Status.Phase != corev1.PodPending {
		t.Errorf("the liar's pod is %s, want Pending (never started)", p.Status.Phase)
	}
	// The extender's leader says the same on the pod.
	poll(t, time.Minute, "the liar's pod condition "+v1alpha1.PodConditionModelsReady, func() (bool, string) {
		p, err := clientset.CoreV1().Pods(modelsNamespace).Get(ctx, bad.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, c := range p.Status.Conditions {
			if c.Type == v1alpha1.PodConditionModelsReady {
				return c.Status == corev1.ConditionFalse && strings.Contains(c.Message, "invalid safetensors"), fmt.Sprintf("%+v", c)
			}
		}
		return false, fmt.Sprintf("conditions %+v", p.Status.Conditions)
	})
	lm := &v1alpha1.Model{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: modelsNamespace, Name: "liar"}, lm); err != nil {
		t.Fatal(err)
	}
	if ln := lm.Status.ModelNode(realnode.NodeName); ln == nil || ln.Phase != v1alpha1.ModelFailed || !strings.Contains(ln.Message, "invalid safetensors") {
		t.Errorf("the liar's status on %s = %+v, want Failed saying invalid safetensors", realnode.NodeName, ln)
	}

	// The cache's own token may write its node's entry, not another's.
	cachePod := waitComponent(ctx, t, "model-cache", 1)[0]
	_, tokenCfg := clientsetWithToken(t, podToken(t, &cachePod))
	ctrllog.SetLogger(logr.Discard())
	asCache, err := client.New(tokenCfg, client.Options{Scheme: envtestutil.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	entry := func(node string) error {
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": v1alpha1.GroupVersion.String(), "kind": "Model",
			"metadata": map[string]any{"name": "tiny-llama", "namespace": modelsNamespace},
			"status":   map[string]any{"nodes": []any{map[string]any{"name": node, "phase": "Ready"}}},
		}}
		//nolint:staticcheck // as the cache applies its entry
		return asCache.Status().Patch(ctx, u, client.Apply, client.FieldOwner("partita-model-cache/"+node), client.ForceOwnership, client.DryRunAll)
	}
	if err := entry(realnode.NodeName); err != nil {
		t.Errorf("the cache's token wrote its own node's entry: %v, want allowed", err)
	}
	if err := entry("someone-else"); err == nil || !strings.Contains(err.Error(), "may write only its own entry") {
		t.Errorf("the cache's token wrote another node's entry: %v, want refused by the own-node policy", err)
	}

	// Another namespace's model is refused at admission.
	_, err = clientset.CoreV1().Pods("default").Create(ctx, modelPod("steal", modelsNamespace+"/tiny-llama"), metav1.CreateOptions{})
	if err == nil || !strings.Contains(err.Error(), "a pod may only use the Models of its own namespace") {
		t.Errorf("a pod naming another namespace's model: %v, want refused", err)
	}
}

// modelCacheMetric reads one counter of the real node's model cache.
func modelCacheMetric(ctx context.Context, t *testing.T, name string) float64 {
	t.Helper()
	pods := waitComponent(ctx, t, "model-cache", 1)
	status, body := plainGet(ctx, t, fmt.Sprintf("http://%s:8083/metrics", pods[0].Status.PodIP))
	if status != 200 {
		t.Fatalf("model cache metrics: %d %s", status, body)
	}
	return metrics(body)[name]
}

// plainGet is one HTTP GET from the host, for a pod's plain metrics port.
func plainGet(ctx context.Context, t *testing.T, url string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// createS3Model puts files under tiny-llama/ of a new bucket of the dev
// cluster's S3 store, copies the store's keys into a Secret of the test's
// namespace and creates a Model of them with that secretRef.
func createS3Model(ctx context.Context, t *testing.T, c client.Client, name string, files map[string][]byte) {
	t.Helper()
	sec, err := clientset.CoreV1().Secrets(devcluster.PartitaNamespace).Get(ctx, devcluster.S3SecretName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the S3 addon's Secret: %v", err)
	}
	endpoint := string(sec.Data["endpoint"])
	s3c := s3.New(s3.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(endpoint), UsePathStyle: true,
		Credentials: credentials.NewStaticCredentialsProvider(string(sec.Data[v1alpha1.ModelSecretAccessKeyID]), string(sec.Data[v1alpha1.ModelSecretSecretAccessKey]), ""),
	})
	bucket := "e2e-" + strings.ToLower(randomName(6))
	if _, err := s3c.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(bucket)}); err != nil {
		t.Fatalf("create bucket %s at %s: %v", bucket, endpoint, err)
	}
	for p, b := range files {
		if _, err := s3c.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String(name + "/" + p), Body: bytes.NewReader(b)}); err != nil {
			t.Fatalf("put %s: %v", p, err)
		}
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: modelsNamespace}}
	if err := c.Create(ctx, ns); err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
	creds := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: modelsNamespace, Name: "s3-" + name}, Data: map[string][]byte{
		v1alpha1.ModelSecretAccessKeyID: sec.Data[v1alpha1.ModelSecretAccessKeyID], v1alpha1.ModelSecretSecretAccessKey: sec.Data[v1alpha1.ModelSecretSecretAccessKey]}}
	if err := c.Create(ctx, creds); err != nil {
		t.Fatal(err)
	}
	m := &v1alpha1.Model{ObjectMeta: metav1.ObjectMeta{Namespace: modelsNamespace, Name: name},
		Spec: v1alpha1.ModelSpec{Source: v1alpha1.ModelSource{URI: "s3://" + bucket + "/" + name, Endpoint: endpoint,
			SecretRef: &corev1.LocalObjectReference{Name: creds.Name}}}}
	if err := c.Create(ctx, m); err != nil {
		t.Fatalf("create Model %s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = c.Delete(context.WithoutCancel(ctx), m)
		_ = c.Delete(context.WithoutCancel(ctx), creds)
	})
}

func randomName(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)[:n]
}

// startedAfterCreation is how long after its creation the pod's container
// started, as the kubelet reports it (second resolution).
func startedAfterCreation(p *corev1.Pod) time.Duration {
	if len(p.Status.ContainerStatuses) == 0 || p.Status.ContainerStatuses[0].State.Running == nil {
		return -1
	}
	return p.Status.ContainerStatuses[0].State.Running.StartedAt.Sub(p.CreationTimestamp.Time)
}
