package node

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/metrics"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/devcluster"
	"github.com/partita-dev/partita/internal/envtestutil"
	"github.com/partita-dev/partita/models/cache"
	"github.com/partita-dev/partita/models/fetch"
)

// The S3 benchmark's server is the dev cluster's S3 addon (versitygw),
// built by `make addon-bins`; the model is PARTITA_BENCH_MODEL_MIB MiB
// (default 2048) of safetensors shards of 512 MiB.
const benchBucket = "bench"

func startS3(b *testing.B) (endpoint string) {
	b.Helper()
	bin := filepath.Join(devcluster.DefaultOptions().AddonsDir, "s3-v1.8.0", "bin", "s3")
	if _, err := os.Stat(bin); err != nil {
		b.Skipf("no S3 server built (%v): make addon-bins", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	cmd := exec.Command(bin, "--access", "bench", "--secret", "benchsecret", "--port", addr, "--health", "/health", "--quiet", "posix", b.TempDir())
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	endpoint = "http://" + addr
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if resp, err := http.Get(endpoint + "/health"); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return endpoint
			}
		}
		if time.Now().After(deadline) {
			b.Fatal("the S3 server did not become healthy")
		}
	}
}

func benchS3Client(endpoint string) *s3.Client {
	return s3.New(s3.Options{Region: "us-east-1", BaseEndpoint: aws.String(endpoint), UsePathStyle: true,
		Credentials: credentials.NewStaticCredentialsProvider("bench", "benchsecret", "")})
}

// BenchmarkS3ToCache compares, on the same objects of the same server: one
// GET per file (single stream), 8 concurrent ranged GETs of 8 MiB read
// into memory and dropped (the raw ceiling), and the node's model cache
// filling an entry (ranged reads written in place, every file's SHA-256,
// the safetensors check, fsync).
func BenchmarkS3ToCache(b *testing.B) {
	mib := 2048
	if v := os.Getenv("PARTITA_BENCH_MODEL_MIB"); v != "" {
		mib, _ = strconv.Atoi(v)
	}
	endpoint := startS3(b)
	ctx := context.Background()
	s3c := benchS3Client(endpoint)
	if _, err := s3c.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(benchBucket)}); err != nil {
		b.Fatal(err)
	}
	const shard = 512
	var keys []string
	var sizes []int64
	for i := 0; i*shard < mib; i++ {
		n := min(shard, mib-i*shard)
		data := safetensorsFile(n<<20/4-64, false)
		key := fmt.Sprintf("llama/model-%05d.safetensors", i)
		if _, err := s3c.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(benchBucket), Key: aws.String(key), Body: bytes.NewReader(data)}); err != nil {
			b.Fatal(err)
		}
		keys, sizes = append(keys, key), append(sizes, int64(len(data)))
	}
	var total int64
	for _, s := range sizes {
		total += s
	}
	b.Run("single-stream", func(b *testing.B) {
		b.SetBytes(total)
		for b.Loop() {
			for _, k := range keys {
				out, err := s3c.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(benchBucket), Key: aws.String(k)})
				if err != nil {
					b.Fatal(err)
				}
				if _, err := io.CopyBuffer(io.Discard, out.Body, make([]byte, 1<<20)); err != nil {
					b.Fatal(err)
				}
				_ = out.Body.Close()
			}
		}
	})
	b.Run("ranged-raw", func(b *testing.B) {
		b.SetBytes(total)
		src := fetch.NewS3(fetch.S3Config{Endpoint: endpoint, PathStyle: true, AccessKeyID: "bench", SecretAccessKey: "benchsecret"}, benchBucket)
		for b.Loop() {
			for i, k := range keys {
				rangedRead(b, src, k, sizes[i], 8, 8<<20)
			}
		}
	})
	b.Run("ranged-to-disk", func(b *testing.B) {
		b.SetBytes(total)
		src := fetch.NewS3(fetch.S3Config{Endpoint: endpoint, PathStyle: true, AccessKeyID: "bench", SecretAccessKey: "benchsecret"}, benchBucket)
		for b.Loop() {
			dir := b.TempDir()
			for i, k := range keys {
				f, err := os.Create(filepath.Join(dir, filepath.Base(k)))
				if err != nil {
					b.Fatal(err)
				}
				rangedWrite(b, src, k, sizes[i], 8, 8<<20, f)
				if err := f.Sync(); err != nil {
					b.Fatal(err)
				}
				_ = f.Close()
			}
		}
	})
	b.Run("cache", func(b *testing.B) {
		b.SetBytes(total)
		_, c := envtestutil.Start(b)
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}}); err != nil {
			b.Fatal(err)
		}
		if err := c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "s3"}}); err != nil {
			b.Fatal(err)
		}
		m := &v1alpha1.Model{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "llama"},
			Spec: v1alpha1.ModelSpec{Source: v1alpha1.ModelSource{URI: "s3://" + benchBucket + "/llama", Endpoint: endpoint, SecretRef: &corev1.LocalObjectReference{Name: "s3"}}}}
		if err := c.Create(ctx, m); err != nil {
			b.Fatal(err)
		}
		secret := map[string][]byte{v1alpha1.ModelSecretAccessKeyID: []byte("bench"), v1alpha1.ModelSecretSecretAccessKey: []byte("benchsecret")}
		// The heap's peak while filling, against the buffers' bound (16 ×
		// 8 MiB): streaming must not hold the model in memory.
		peak := sampleHeapPeak(b)
		i := 0
		for b.Loop() {
			b.StopTimer()
			dir := b.TempDir()
			kc, err := cache.New(dir, 64<<30)
			if err != nil {
				b.Fatal(err)
			}
			svc, err := New(ctx, Config{NodeName: "n1", Cache: kc, Client: c, StateDir: filepath.Join(dir, "state"),
				Fetch: fetch.Options{ChunkSize: 8 << 20, Concurrency: 8, Pool: fetch.NewPool(16, 8<<20)}, Log: logr.Discard()})
			if err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			if _, err := svc.Publish(ctx, PublishRequest{VolumeID: fmt.Sprint("v", i), Namespace: "team-a", Model: "llama", Secret: secret}); err != nil {
				b.Fatal(err)
			}
			i++
		}
		b.ReportMetric(float64(peak())/(1<<20), "peak-heap-MiB")
	})
}

// sampleHeapPeak samples the live heap every 5 ms until the benchmark ends
// and returns a function that reads the peak so far.
func sampleHeapPeak(b *testing.B) func() uint64 {
	var mu sync.Mutex
	var peak uint64
	done := make(chan struct{})
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	go func() {
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				metrics.Read(s)
				mu.Lock()
				peak = max(peak, s[0].Value.Uint64())
				mu.Unlock()
			}
		}
	}()
	b.Cleanup(func() { close(done) })
	return func() uint64 {
		mu.Lock()
		defer mu.Unlock()
		return peak
	}
}

// rangedRead reads key in chunks with n concurrent ranged GETs, into
// memory only.
func rangedRead(b *testing.B, src *fetch.S3, key string, size int64, n int, chunk int64) {
	rangedWrite(b, src, key, size, n, chunk, nil)
}

// rangedWrite is rangedRead that writes each chunk at its offset of f
// (when f is set): the disk's share of a fill, without its checks.
func rangedWrite(b *testing.B, src *fetch.S3, key string, size int64, n int, chunk int64, f *os.File) {
	work := make(chan int64)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, chunk)
			for off := range work {
				p := buf[:min(chunk, size-off)]
				if err := src.ReadRange(context.Background(), key, off, p); err != nil {
					errs <- err
					return
				}
				if f != nil {
					if _, err := f.WriteAt(p, off); err != nil {
						errs <- err
						return
					}
				}
			}
		}()
	}
	for off := int64(0); off < size; off += chunk {
		work <- off
	}
	close(work)
	wg.Wait()
	select {
	case err := <-errs:
		b.Fatal(err)
	default:
	}
}
