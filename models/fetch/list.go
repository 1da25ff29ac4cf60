package fetch

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// Object is one file a Lister found: its name for the Source (a key, a path),
// its path under the listed root, its size and version tag.
type Object struct {
	Name string
	Rel  string
	Size int64
	ETag string
}

// Lister is a Source that can list the files under a root (a key prefix, a
// directory). HTTP has none: a model names its files.
type Lister interface {
	List(ctx context.Context, root string) ([]Object, error)
}

var (
	_ Lister = (*S3)(nil)
	_ Lister = File{}
)

// maxListed bounds a listing, so that a prefix with millions of objects
// fails clearly instead of filling memory.
const maxListed = 10_000

// List returns every object under prefix (ListObjectsV2, paginated), sorted by
// key. A prefix that does not end in "/" is taken as a directory: "llama"
// lists llama/..., not llama-2/....
func (s *S3) List(ctx context.Context, prefix string) ([]Object, error) {
	if prefix != "" && !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	var out []Object
	p := s3.NewListObjectsV2Paginator(s.client, &s3.ListObjectsV2Input{Bucket: aws.String(s.bucket), Prefix: aws.String(prefix)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("list s3://%s/%s: %w", s.bucket, prefix, classifyS3(err))
		}
		for _, o := range page.Contents {
			key := aws.ToString(o.Key)
			if strings.HasSuffix(key, "/") {
				continue // a "directory" marker
			}
			out = append(out, Object{Name: key, Rel: strings.TrimPrefix(key, prefix), Size: aws.ToInt64(o.Size), ETag: aws.ToString(o.ETag)})
			if len(out) > maxListed {
				return nil, Permanent(fmt.Errorf("list s3://%s/%s: more than %d objects", s.bucket, prefix, maxListed))
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// List returns the regular files under root (root itself when it is a file),
// sorted by path. Symbolic links are not followed, so that a model cannot
// serve files from outside its directory.
func (File) List(_ context.Context, root string) ([]Object, error) {
	fi, err := os.Lstat(root)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			err = Permanent(err)
		}
		return nil, fmt.Errorf("list %s: %w", root, err)
	}
	if fi.Mode().IsRegular() {
		return []Object{{Name: root, Rel: filepath.Base(root), Size: fi.Size(), ETag: fileTag(fi)}}, nil
	}
	if !fi.IsDir() {
		return nil, Permanent(fmt.Errorf("list %s: neither a regular file nor a directory", root))
	}
	var out []Object
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		out = append(out, Object{Name: p, Rel: filepath.ToSlash(rel), Size: info.Size(), ETag: fileTag(info)})
		if len(out) > maxListed {
			return Permanent(fmt.Errorf("more than %d files", maxListed))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", root, err)
	}
	return out, nil
}

func fileTag(fi fs.FileInfo) string {
	return fmt.Sprintf("%d-%d", fi.ModTime().UnixNano(), fi.Size())
}
