package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// file is one file of an image's layer.
type file struct {
	// Path is the absolute path inside the image.
	Path string `json:"path"`
	// Source is the file on the host whose content it gets.
	Source string `json:"source"`
	Mode   int64  `json:"mode"`
}

// spec is one single-layer image.
type spec struct {
	// File is the tarball's name in the output directory.
	File string `json:"file"`
	// Refs are the names the image is imported under.
	Refs       []string `json:"refs"`
	Files      []file   `json:"files"`
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
	Env        []string `json:"env,omitempty"`
	User       string   `json:"user,omitempty"`
}

// epoch is every file's and the image's timestamp, so that the same inputs
// make the same image digest.
var epoch = time.Unix(0, 0).UTC()

// inputsDigest hashes the definition and the content of each source file,
// so that an image is written again exactly when it would differ.
func (s spec) inputsDigest() (string, error) {
	h := sha256.New()
	def, err := json.Marshal(s)
	if err != nil {
		return "", err
	}
	h.Write(def)
	for _, f := range s.Files {
		src, err := os.Open(f.Source)
		if err != nil {
			return "", fmt.Errorf("%s (for %s): %w", f.Source, f.Path, err)
		}
		fmt.Fprintf(h, "\n%s\n", f.Path)
		_, err = io.Copy(h, src)
		_ = src.Close()
		if err != nil {
			return "", fmt.Errorf("read %s: %w", f.Source, err)
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// writeIfChanged writes the image's tarball to path unless path.inputs
// says it was written from the same inputs. It reports whether it wrote.
func (s spec) writeIfChanged(path string) (bool, error) {
	digest, err := s.inputsDigest()
	if err != nil {
		return false, err
	}
	stamp := path + ".inputs"
	if b, err := os.ReadFile(stamp); err == nil && strings.TrimSpace(string(b)) == digest {
		if _, err := os.Stat(path); err == nil {
			return false, nil
		}
	}
	img, err := s.image()
	if err != nil {
		return false, err
	}
	refs := map[name.Reference]v1.Image{}
	for _, r := range s.Refs {
		ref, err := name.ParseReference(r)
		if err != nil {
			return false, fmt.Errorf("image name %q: %w", r, err)
		}
		refs[ref] = img
	}
	tmp := path + ".tmp"
	if err := tarball.MultiRefWriteToFile(tmp, refs); err != nil {
		_ = os.Remove(tmp)
		return false, fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return false, err
	}
	return true, os.WriteFile(stamp, []byte(digest+"\n"), 0o644)
}

// image assembles the image: its one layer on an empty base, and its
// configuration for linux/amd64.
func (s spec) image() (v1.Image, error) {
	layer, err := tarball.LayerFromOpener(s.layer, tarball.WithCompressionLevel(gzip.BestSpeed))
	if err != nil {
		return nil, fmt.Errorf("build layer: %w", err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return nil, fmt.Errorf("append layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Created = "linux", "amd64", v1.Time{Time: epoch}
	cf.Config.Entrypoint, cf.Config.Cmd, cf.Config.Env, cf.Config.User = s.Entrypoint, s.Cmd, s.Env, s.User
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("set configuration: %w", err)
	}
	return img, nil
}

// layer is the uncompressed tar stream of the image's files, with every
// parent directory before its entries. go-containerregistry opens it twice
// (digest, then content), so it is built in memory once per call.
func (s spec) layer() (io.ReadCloser, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	files := append([]file(nil), s.Files...)
	sort.Slice(files, func(i, j int) bool { return files[i].Path < files[j].Path })
	for _, f := range files {
		if !path.IsAbs(f.Path) || path.Clean(f.Path) != f.Path {
			return nil, fmt.Errorf("image path %q: must be absolute and clean", f.Path)
		}
		rel := strings.TrimPrefix(f.Path, "/")
		var parents []string
		for d := path.Dir(rel); d != "."; d = path.Dir(d) {
			parents = append([]string{d}, parents...)
		}
		for _, d := range parents {
			if dirs[d] {
				continue
			}
			dirs[d] = true
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
				return nil, err
			}
		}
		// Symbolic links are followed: the image gets the content.
		content, err := os.ReadFile(f.Source)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", f.Source, err)
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: rel, Mode: f.Mode, Size: int64(len(content)), ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(content); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if buf.Len() == 0 {
		return nil, errors.New("empty layer")
	}
	return io.NopCloser(&buf), nil
}
