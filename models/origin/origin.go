// Package origin turns a Model's source into something to fetch from: the
// fetch.Source for its URI and credentials, the list of its files (after the
// include globs), and the version of that list, which names the model's entry
// in a node's cache. It reads no Secret itself: the caller hands it the
// Secret's data (the kubelet's, for the one pod being mounted).
package origin

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/url"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/models/fetch"
)

// File is one file of a model: what to ask the source for, where it goes
// under the model's directory, and what it should be.
type File struct {
	Name   string // for the Source: a key, a URL, a path
	Path   string // under the model's directory, slash-separated
	Size   int64
	ETag   string
	SHA256 string // pinned by the Model, if it is
}

// Resolved is a model ready to fetch.
type Resolved struct {
	Source fetch.Source
	Files  []File
	// Version names this content: it changes when the source's files, their
	// sizes or versions, the include globs or the pinned digests do.
	Version string
}

// Size is the bytes of every file.
func (r *Resolved) Size() int64 {
	var n int64
	for _, f := range r.Files {
		n += f.Size
	}
	return n
}

// Options are what the caller provides besides the Model.
type Options struct {
	// Secret is the data of the Model's secretRef, if it has one.
	Secret map[string][]byte
	// HTTPClient is used for http(s) and S3 sources; nil means the default.
	HTTPClient *http.Client
	// FileRoots are the node's directories that file:// sources may name
	// (a model store, an NFS mount); none means file:// is refused. The
	// cache runs as root: a Model must not read the node's other files.
	FileRoots []string
	// Namespace of the Model: it is part of the version, so that a copy
	// fetched with one namespace's credentials never serves another's pods.
	Namespace string
}

// Source builds the fetch.Source for spec and returns the root to list (a
// key prefix, a path) or, for http(s), the URLs of its files.
func Source(spec v1alpha1.ModelSpec, opts Options) (fetch.Source, string, error) {
	uri := spec.Source.URI
	u, err := url.Parse(uri)
	if err != nil {
		return nil, "", fmt.Errorf("source %q: %w", uri, err)
	}
	if spec.Source.Endpoint != "" && u.Scheme != "s3" {
		return nil, "", fmt.Errorf("source %q: an endpoint is only for s3:// sources", uri)
	}
	switch u.Scheme {
	case "s3":
		if u.Host == "" {
			return nil, "", fmt.Errorf("source %q: no bucket", uri)
		}
		cfg := fetch.S3Config{
			Endpoint:   spec.Source.Endpoint,
			Region:     spec.Source.Region,
			PathStyle:  spec.Source.Endpoint != "", // what S3-compatible servers expect
			HTTPClient: opts.HTTPClient,
		}
		if opts.Secret != nil {
			cfg.AccessKeyID = string(opts.Secret[v1alpha1.ModelSecretAccessKeyID])
			cfg.SecretAccessKey = string(opts.Secret[v1alpha1.ModelSecretSecretAccessKey])
			cfg.SessionToken = string(opts.Secret[v1alpha1.ModelSecretSessionToken])
			if cfg.AccessKeyID == "" || cfg.SecretAccessKey == "" {
				return nil, "", fmt.Errorf("source %q: secret %s has no %s and %s", uri, secretName(spec), v1alpha1.ModelSecretAccessKeyID, v1alpha1.ModelSecretSecretAccessKey)
			}
		}
		return fetch.NewS3(cfg, u.Host), strings.TrimPrefix(u.Path, "/"), nil
	case "http", "https":
		h := &fetch.HTTP{Client: opts.HTTPClient}
		if opts.Secret != nil {
			tok := string(opts.Secret[v1alpha1.ModelSecretToken])
			if tok == "" {
				return nil, "", fmt.Errorf("source %q: secret %s has no %s", uri, secretName(spec), v1alpha1.ModelSecretToken)
			}
			h.Header = http.Header{"Authorization": {"Bearer " + tok}}
		}
		return h, uri, nil
	case "file":
		if u.Host != "" {
			return nil, "", fmt.Errorf("source %q: a file:// URI names a path on the node (file:///PATH), not a host", uri)
		}
		if u.Path == "" || !path.IsAbs(u.Path) {
			return nil, "", fmt.Errorf("source %q: no absolute path", uri)
		}
		p, err := underRoots(path.Clean(u.Path), opts.FileRoots)
		if err != nil {
			return nil, "", fmt.Errorf("source %q: %w", uri, err)
		}
		return fetch.File{}, p, nil
	}
	return nil, "", fmt.Errorf("source %q: scheme %q: want s3, http, https or file", uri, u.Scheme)
}

func secretName(spec v1alpha1.ModelSpec) string {
	if spec.Source.SecretRef == nil {
		return ""
	}
	return spec.Source.SecretRef.Name
}

// Resolve lists the model's files at its source and keeps those the include
// globs match. It fails when nothing is left, when a file's path could
// escape the model's directory, or when a pinned digest names no file.
func Resolve(ctx context.Context, spec v1alpha1.ModelSpec, opts Options) (*Resolved, error) {
	src, root, err := Source(spec, opts)
	if err != nil {
		return nil, fetch.Permanent(err)
	}
	for _, g := range spec.Include {
		if _, err := path.Match(g, ""); err != nil {
			return nil, fmt.Errorf("include glob %q: %w", g, err)
		}
	}
	objects, err := list(ctx, spec, src, root)
	if err != nil {
		return nil, err
	}
	r := &Resolved{Source: src}
	pinned := map[string]bool{}
	for _, o := range objects {
		if !fs.ValidPath(o.Rel) || o.Rel == "." {
			return nil, fetch.Permanent(fmt.Errorf("source %q holds %q, a path that is not inside the model's directory", spec.Source.URI, o.Rel))
		}
		if !included(spec.Include, o.Rel) {
			continue
		}
		sum := strings.ToLower(spec.SHA256[o.Rel])
		if sum != "" {
			pinned[o.Rel] = true
		}
		r.Files = append(r.Files, File{Name: o.Name, Path: o.Rel, Size: o.Size, ETag: o.ETag, SHA256: sum})
	}
	if len(r.Files) == 0 {
		return nil, fetch.Permanent(fmt.Errorf("source %q: no files (after include %v)", spec.Source.URI, spec.Include))
	}
	var missing []string
	for p := range spec.SHA256 {
		if !pinned[p] {
			missing = append(missing, p)
		}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return nil, fetch.Permanent(fmt.Errorf("sha256 pins %s, which the source (after include) does not hold", strings.Join(missing, ", ")))
	}
	r.Version = version(opts.Namespace, spec, r.Files)
	return r, nil
}

// list asks the source for its files. An s3 prefix that lists nothing may be
// one object; an http(s) URI is one file, or a directory with spec files.
func list(ctx context.Context, spec v1alpha1.ModelSpec, src fetch.Source, root string) ([]fetch.Object, error) {
	if h, ok := src.(*fetch.HTTP); ok {
		return listHTTP(ctx, spec, h, root)
	}
	if len(spec.Source.Files) > 0 {
		return nil, fetch.Permanent(fmt.Errorf("source %q: files are only for http(s) directory URIs; use include to choose files", spec.Source.URI))
	}
	l, ok := src.(fetch.Lister)
	if !ok {
		return nil, fmt.Errorf("source %q cannot be listed", spec.Source.URI)
	}
	objects, err := l.List(ctx, root)
	if err != nil {
		return nil, err
	}
	if len(objects) == 0 && root != "" && !strings.HasSuffix(root, "/") {
		size, etag, err := src.Stat(ctx, root)
		if err != nil {
			return nil, fmt.Errorf("source %q: nothing under the prefix, and not an object: %w", spec.Source.URI, err)
		}
		return []fetch.Object{{Name: root, Rel: path.Base(root), Size: size, ETag: etag}}, nil
	}
	return objects, nil
}

func listHTTP(ctx context.Context, spec v1alpha1.ModelSpec, h *fetch.HTTP, uri string) ([]fetch.Object, error) {
	var names, rels []string
	if strings.HasSuffix(uri, "/") {
		if len(spec.Source.Files) == 0 {
			return nil, fetch.Permanent(fmt.Errorf("source %q: a directory URL needs files (HTTP has no listing)", uri))
		}
		for _, f := range spec.Source.Files {
			if !fs.ValidPath(f) || f == "." {
				return nil, fetch.Permanent(fmt.Errorf("source file %q: not a relative path inside the directory", f))
			}
			segs := strings.Split(f, "/")
			for i, s := range segs {
				segs[i] = url.PathEscape(s)
			}
			names = append(names, uri+strings.Join(segs, "/"))
			rels = append(rels, f)
		}
	} else {
		if len(spec.Source.Files) > 0 {
			return nil, fetch.Permanent(fmt.Errorf("source %q: files need a directory URL (ending in /)", uri))
		}
		u, err := url.Parse(uri)
		if err != nil {
			return nil, fetch.Permanent(err)
		}
		base := path.Base(u.Path)
		if base == "/" || base == "." {
			return nil, fetch.Permanent(fmt.Errorf("source %q: names no file", uri))
		}
		names, rels = []string{uri}, []string{base}
	}
	out := make([]fetch.Object, 0, len(names))
	for i, n := range names {
		size, etag, err := h.Stat(ctx, n)
		if err != nil {
			return nil, err
		}
		out = append(out, fetch.Object{Name: n, Rel: rels[i], Size: size, ETag: etag})
	}
	return out, nil
}

func included(globs []string, rel string) bool {
	if len(globs) == 0 {
		return true
	}
	for _, g := range globs {
		if ok, _ := path.Match(g, rel); ok {
			return true
		}
	}
	return false
}

// version digests everything that decides the model's bytes. The "m-" prefix
// and 40 hex digits make a cache key.
func version(namespace string, spec v1alpha1.ModelSpec, files []File) string {
	h := sha256.New()
	write := func(parts ...string) {
		for _, p := range parts {
			_, _ = fmt.Fprintf(h, "%d:%s;", len(p), p)
		}
	}
	write(namespace, spec.Source.URI, spec.Source.Endpoint)
	for _, f := range files {
		write(f.Path, fmt.Sprint(f.Size), f.ETag, f.SHA256)
	}
	return "m-" + hex.EncodeToString(h.Sum(nil))[:40]
}

// IsPermanent says whether err cannot be fixed by trying again with the same
// Model and credentials.
func IsPermanent(err error) bool {
	return fetch.IsPermanent(err) || errors.Is(err, fs.ErrNotExist)
}

// underRoots returns p with its symbolic links resolved, if it lies in one
// of roots (resolved too); else an error that names them.
func underRoots(p string, roots []string) (string, error) {
	if len(roots) == 0 {
		return "", errors.New("this node's model cache reads no local files (its --file-roots is empty)")
	}
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		return "", fetch.Permanent(err)
	}
	for _, r := range roots {
		rr, err := filepath.EvalSymlinks(r)
		if err != nil {
			continue
		}
		if rel, err := filepath.Rel(rr, real); err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
			return real, nil
		}
	}
	return "", fmt.Errorf("%s is outside the directories this node's model cache may read (%s)", p, strings.Join(roots, ", "))
}
