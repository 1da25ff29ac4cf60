package policy

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"maps"
	"path"
	"slices"
	"strings"
)

// defaultBundleFS holds the default bundle and its Rego unit tests.
//
//go:embed rego/*.rego
var defaultBundleFS embed.FS

// Bundle is a policy: Rego modules by file name ("admission.rego").
type Bundle map[string]string

// testSuffix marks a Rego unit-test module; the engine never loads one.
const testSuffix = "_test.rego"

// DefaultBundle returns the policy Partita ships, without its tests.
func DefaultBundle() Bundle {
	return readEmbedded(false)
}

// defaultBundleWithTests returns the default bundle and its Rego unit tests.
func defaultBundleWithTests() Bundle {
	return readEmbedded(true)
}

func readEmbedded(withTests bool) Bundle {
	out := Bundle{}
	entries, err := fs.ReadDir(defaultBundleFS, "rego")
	if err != nil {
		// The directory is embedded at build time; it cannot be missing.
		panic("policy: read embedded bundle: " + err.Error())
	}
	for _, e := range entries {
		if !withTests && strings.HasSuffix(e.Name(), testSuffix) {
			continue
		}
		b, err := defaultBundleFS.ReadFile(path.Join("rego", e.Name()))
		if err != nil {
			panic("policy: read embedded bundle: " + err.Error())
		}
		out[e.Name()] = string(b)
	}
	return out
}

// Overlay returns b with files laid over it: a file replaces the module of
// the same name, a new name adds a module, and an empty file removes the
// module of that name. b is not changed.
func (b Bundle) Overlay(files map[string]string) Bundle {
	out := maps.Clone(b)
	if out == nil {
		out = Bundle{}
	}
	for name, src := range files {
		if strings.TrimSpace(src) == "" {
			delete(out, name)
			continue
		}
		out[name] = src
	}
	return out
}

// Names returns the module names, sorted.
func (b Bundle) Names() []string {
	return slices.Sorted(maps.Keys(b))
}

// Version is a short digest of the bundle's names and sources: equal
// bundles have equal versions.
func (b Bundle) Version() string {
	h := sha256.New()
	for _, name := range b.Names() {
		h.Write([]byte(name))
		h.Write([]byte{0})
		h.Write([]byte(b[name]))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))[:12]
}
