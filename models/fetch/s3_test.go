package fetch

import (
	"bytes"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/google/go-cmp/cmp"
	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
)

// newFakeS3 serves an in-process S3 (gofakes3) holding objects in bucket.
func newFakeS3(t *testing.T, bucket string, objects map[string][]byte) *httptest.Server {
	t.Helper()
	backend := s3mem.New()
	if err := backend.CreateBucket(bucket); err != nil {
		t.Fatal(err)
	}
	for key, data := range objects {
		if _, err := backend.PutObject(bucket, key, map[string]string{}, bytes.NewReader(data), int64(len(data)), nil); err != nil {
			t.Fatal(err)
		}
	}
	srv := httptest.NewServer(gofakes3.New(backend).Server())
	t.Cleanup(srv.Close)
	return srv
}

func TestFetchS3(t *testing.T) {
	data := randomBytes(50_000)
	srv := newFakeS3(t, "models", map[string][]byte{"llama/model.safetensors": data})
	cases := map[string]struct {
		key     string
		creds   bool
		want    Result
		wantErr string
	}{
		"ranged GETs": {key: "llama/model.safetensors", creds: true, want: Result{Size: 50_000, ReadBytes: 50_000}},
		"anonymous":   {key: "llama/model.safetensors", want: Result{Size: 50_000, ReadBytes: 50_000}},
		"missing key": {key: "llama/nope", creds: true, wantErr: "head s3://models/llama/nope"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			cfg := S3Config{Endpoint: srv.URL, PathStyle: true, HTTPClient: srv.Client()}
			if tc.creds {
				cfg.AccessKeyID, cfg.SecretAccessKey = "AKIDEXAMPLE", "secret"
			}
			src := NewS3(cfg, "models")
			dst := filepath.Join(t.TempDir(), "m")
			got, err := Fetch(t.Context(), src, tc.key, dst, Options{ChunkSize: 8 << 10, Concurrency: 4, SHA256: digest(data), Backoff: noBackoff})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Fetch() error = %v, want one containing %q", err, tc.wantErr)
				}
				if !IsPermanent(err) {
					t.Errorf("Fetch() error %v is not permanent", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Fetch() error = %v", err)
			}
			tc.want.SHA256 = digest(data)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Fetch() (-want,+got):\n%s", diff)
			}
			if b, _ := os.ReadFile(dst); !bytes.Equal(b, data) {
				t.Errorf("fetched object differs from the stored one")
			}
		})
	}
}

func TestS3RangeInput(t *testing.T) {
	// The request a chunk turns into: an inclusive byte range of the key.
	got := NewS3(S3Config{}, "b").rangeInput("k/x", 8, 15)
	want := &s3.GetObjectInput{Bucket: aws.String("b"), Key: aws.String("k/x"), Range: aws.String("bytes=8-15")}
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(s3.GetObjectInput{})); diff != "" {
		t.Errorf("rangeInput() (-want,+got):\n%s", diff)
	}
}
