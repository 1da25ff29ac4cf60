// Package version reports the build's version, stamped at link time.
package version

// Version is set with -ldflags "-X github.com/partita-dev/partita/internal/version.Version=...".
// It is a var only because the linker can set nothing else; nothing writes it at run time.
var Version = "dev"

// Get returns the build's version.
func Get() string { return Version }
