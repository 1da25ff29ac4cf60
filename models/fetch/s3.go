package fetch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"
)

// S3Config says how to reach one bucket. Credentials are static because they
// come from a Secret the agent reads, not from the node's environment.
type S3Config struct {
	// Endpoint is the S3 endpoint URL; empty means AWS's own for Region.
	Endpoint string
	// Region defaults to us-east-1 (what most S3-compatible servers expect).
	Region          string
	AccessKeyID     string
	SecretAccessKey string
	SessionToken    string
	// PathStyle addresses buckets as endpoint/bucket (MinIO, Ceph and most
	// servers that are not AWS) instead of bucket.endpoint.
	PathStyle bool
	// HTTPClient defaults to the SDK's.
	HTTPClient *http.Client
}

// S3 reads objects of one bucket with ranged GETs (aws-sdk-go-v2).
type S3 struct {
	client *s3.Client
	bucket string
}

var _ Source = (*S3)(nil)
var _ Streamer = (*S3)(nil)

// NewS3 returns a source for bucket.
func NewS3(cfg S3Config, bucket string) *S3 {
	region := cfg.Region
	if region == "" {
		region = "us-east-1"
	}
	opts := s3.Options{
		Region:       region,
		UsePathStyle: cfg.PathStyle,
		// Fetch retries with its own backoff; SDK retries on top would
		// multiply the attempts.
		RetryMaxAttempts: 1,
		// Servers that are not AWS often lack the newer checksums; a ranged
		// read has no whole-object checksum anyway, and Fetch checks SHA-256.
		RequestChecksumCalculation:                aws.RequestChecksumCalculationWhenRequired,
		ResponseChecksumValidation:                aws.ResponseChecksumValidationWhenRequired,
		DisableLogOutputChecksumValidationSkipped: true,
	}
	if cfg.AccessKeyID != "" {
		opts.Credentials = credentials.NewStaticCredentialsProvider(cfg.AccessKeyID, cfg.SecretAccessKey, cfg.SessionToken)
	} else {
		opts.Credentials = aws.AnonymousCredentials{}
	}
	if cfg.Endpoint != "" {
		opts.BaseEndpoint = aws.String(cfg.Endpoint)
	}
	if cfg.HTTPClient != nil {
		opts.HTTPClient = cfg.HTTPClient
	}
	return &S3{client: s3.New(opts), bucket: bucket}
}

// Stat sends HeadObject; the tag is the object's ETag.
func (s *S3) Stat(ctx context.Context, key string) (int64, string, error) {
	out, err := s.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(key)})
	if err != nil {
		return 0, "", fmt.Errorf("head s3://%s/%s: %w", s.bucket, key, classifyS3(err))
	}
	if out.ContentLength == nil {
		return 0, "", Permanent(fmt.Errorf("head s3://%s/%s: no Content-Length", s.bucket, key))
	}
	return *out.ContentLength, aws.ToString(out.ETag), nil
}

// ReadRange sends GetObject with a Range and checks the Content-Range.
func (s *S3) ReadRange(ctx context.Context, key string, off int64, p []byte) error {
	if len(p) == 0 {
		return nil
	}
	last := off + int64(len(p)) - 1
	out, err := s.client.GetObject(ctx, s.rangeInput(key, off, last))
	if err != nil {
		return fmt.Errorf("get s3://%s/%s range %d-%d: %w", s.bucket, key, off, last, classifyS3(err))
	}
	defer func() { _ = out.Body.Close() }()
	var a, b int64
	var total string
	cr := aws.ToString(out.ContentRange)
	if _, err := fmt.Sscanf(cr, "bytes %d-%d/%s", &a, &b, &total); err != nil || a != off || b != last {
		return Permanent(fmt.Errorf("get s3://%s/%s range %d-%d: server answered Content-Range %q", s.bucket, key, off, last, cr))
	}
	if _, err := io.ReadFull(out.Body, p); err != nil {
		return fmt.Errorf("get s3://%s/%s range %d-%d: read body: %w", s.bucket, key, off, last, err)
	}
	return nil
}

func (s *S3) rangeInput(key string, off, last int64) *s3.GetObjectInput {
	return &s3.GetObjectInput{
		Bucket: aws.String(s.bucket),
		Key:    aws.String(key),
		Range:  aws.String(fmt.Sprintf("bytes=%d-%d", off, last)),
	}
}

// Open sends one GetObject for the whole object.
func (s *S3) Open(ctx context.Context, key string) (io.ReadCloser, error) {
	out, err := s.client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(key)})
	if err != nil {
		return nil, fmt.Errorf("get s3://%s/%s: %w", s.bucket, key, classifyS3(err))
	}
	return out.Body, nil
}

// classifyS3 marks the errors that a retry cannot fix as permanent.
func classifyS3(err error) error {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		switch ae.ErrorCode() {
		case "NoSuchKey", "NoSuchBucket", "NotFound", "AccessDenied", "Forbidden",
			"InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidRange", "InvalidBucketName":
			return Permanent(err)
		}
	}
	return err
}
