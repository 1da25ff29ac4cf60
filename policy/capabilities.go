package policy

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
)

// Operators' Rego runs inside the webhook and the extender, with their
// network and their service accounts. A policy must decide from its input
// and data.partita alone, so the built-ins that reach outside the process
// are not there at all: a policy that calls one does not compile.
//
// The refused built-ins are:
//   - http.send: any HTTP request, from inside the cluster network;
//   - net.*: net.lookup_ip_addr resolves names (DNS requests); the CIDR
//     helpers are pure, but the whole namespace goes, so that the rule
//     reads as one line in docs/policy.md;
//   - opa.runtime: the process's environment variables and OPA's
//     configuration;
//   - json.match_schema, json.verify_schema: a schema's $ref may load a
//     remote URL or a local file.
//
// As a second lock, allow_net is empty, so no built-in (one a later OPA
// adds) may reach any host. Non-deterministic built-ins without side
// effects stay: time.now_ns (time windows), rand.intn, uuid.rfc4122 and the
// io.jwt signing and verifying ones; TestCapabilitiesReviewed fails when
// an OPA upgrade brings a non-deterministic built-in nobody has judged.

// RefusedBuiltin reports whether Partita's policies may not call the
// built-in name.
func RefusedBuiltin(name string) bool {
	switch name {
	case "http.send", "opa.runtime", "json.match_schema", "json.verify_schema":
		return true
	}
	return strings.HasPrefix(name, "net.")
}

// Capabilities returns the OPA capabilities policies compile with: this
// OPA version's, without the refused built-ins, and with no host allowed
// for network access. Each call returns a new value.
func Capabilities() *ast.Capabilities {
	c := ast.CapabilitiesForThisVersion()
	c.Builtins = slices.DeleteFunc(slices.Clone(c.Builtins), func(b *ast.Builtin) bool { return RefusedBuiltin(b.Name) })
	// Empty, not nil: nil would allow every host.
	c.AllowNet = []string{}
	return c
}

// undefinedFunction is how OPA's compiler reports a call to a function it
// does not know, a refused built-in included.
const undefinedFunction = "undefined function "

// explainRefused rewrites the compiler's "undefined function http.send"
// for a refused built-in into a message that says why it is refused and
// where to read more. Only the compiler's errors are returned then: OPA's
// wrapper ("bundle activation failed: ...") has its text fixed already.
// Other errors pass unchanged.
func explainRefused(err error) error {
	var errs ast.Errors
	if !errors.As(err, &errs) {
		return err
	}
	rewritten := false
	for _, e := range errs {
		name, ok := strings.CutPrefix(e.Message, undefinedFunction)
		if e.Code != ast.TypeErr || !ok || !RefusedBuiltin(name) {
			continue
		}
		e.Message = fmt.Sprintf("%s is not allowed: Partita's policies run without the built-ins that reach outside the process "+
			"(http.send, net.*, opa.runtime, json.match_schema, json.verify_schema); decide from input and data.partita only (docs/policy.md)", name)
		rewritten = true
	}
	if !rewritten {
		return err
	}
	return errs
}
