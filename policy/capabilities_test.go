package policy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
)

// TestCapabilitiesReviewed: every non-deterministic built-in of this OPA
// version (the ones that may reach outside the process) is either refused
// or judged harmless here. An OPA upgrade that adds one fails this test
// until someone decides which it is.
func TestCapabilitiesReviewed(t *testing.T) {
	// No side effect: they read the clock or draw random numbers.
	harmless := map[string]bool{
		"time.now_ns": true, "rand.intn": true, "uuid.rfc4122": true,
		"io.jwt.decode_verify": true, "io.jwt.encode_sign": true, "io.jwt.encode_sign_raw": true,
	}
	for _, b := range ast.CapabilitiesForThisVersion().Builtins {
		if b.Nondeterministic && !RefusedBuiltin(b.Name) && !harmless[b.Name] {
			t.Errorf("built-in %s is non-deterministic and neither refused nor judged harmless: decide in capabilities.go", b.Name)
		}
	}
	caps := Capabilities()
	if caps.AllowNet == nil || len(caps.AllowNet) != 0 {
		t.Errorf("allow_net = %#v, want an empty list (nil allows every host)", caps.AllowNet)
	}
	for _, b := range caps.Builtins {
		if RefusedBuiltin(b.Name) {
			t.Errorf("capabilities still hold %s", b.Name)
		}
	}
	// The default bundle needs nothing refused.
	e := newTestEngine(t)
	if e.Version() != DefaultBundle().Version() {
		t.Errorf("the default bundle is not in force")
	}
}

// TestEngineRefusesBuiltinsThatReachOut: a policy that calls a refused
// built-in does not compile, the error names it and says why, and the
// policy in force stays.
func TestEngineRefusesBuiltinsThatReachOut(t *testing.T) {
	rule := func(body string) Bundle {
		return DefaultBundle().Overlay(map[string]string{"site.rego": "package partita.admission\n\ndeny contains msg if {\n\t" + body + "\n}\n"})
	}
	cases := map[string]struct {
		bundle  Bundle
		refused string // "" compiles
	}{
		"http.send": {
			bundle:  rule(`resp := http.send({"method": "GET", "url": "http://169.254.169.254/latest/meta-data/"})` + "\n\tmsg := resp.raw_body"),
			refused: "http.send",
		},
		"net.lookup_ip_addr": {
			bundle:  rule(`addrs := net.lookup_ip_addr("kubernetes.default.svc")` + "\n\tcount(addrs) > 0\n\tmsg := \"found\""),
			refused: "net.lookup_ip_addr",
		},
		"net.cidr_contains, pure but in net.*": {
			bundle:  rule(`net.cidr_contains("10.0.0.0/8", "10.1.2.3")` + "\n\tmsg := \"in\""),
			refused: "net.cidr_contains",
		},
		"opa.runtime": {
			bundle:  rule(`msg := opa.runtime().env.HOME`),
			refused: "opa.runtime",
		},
		"json.match_schema": {
			bundle:  rule(`[ok, _] := json.match_schema({}, {"$ref": "file:///var/run/secrets/kubernetes.io/serviceaccount/token"})` + "\n\tnot ok\n\tmsg := \"x\""),
			refused: "json.match_schema",
		},
		"in the quota package too": {
			bundle: DefaultBundle().Overlay(map[string]string{"site.rego": "package partita.quota\n\ndeny contains msg if {\n\t" +
				`http.send({"method": "POST", "url": "https://example.com", "body": input})` + "\n\tmsg := \"x\"\n}\n"}),
			refused: "http.send",
		},
		"time.now_ns stays": {
			bundle: rule(`time.weekday(time.now_ns()) == "Never"` + "\n\tmsg := \"never\""),
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			e := newTestEngine(t)
			before := e.Version()
			_, err := e.Load(t.Context(), tc.bundle, "ConfigMap partita-system/site")
			if tc.refused == "" {
				if err != nil {
					t.Fatalf("Load() = %v, want it to compile", err)
				}
				return
			}
			if !IsCompile(err) {
				t.Fatalf("Load() = %v, want a compile error", err)
			}
			for _, want := range []string{tc.refused + " is not allowed", "site.rego:", "docs/policy.md"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("Load() error %q does not say %q", err, want)
				}
			}
			if e.Version() != before {
				t.Errorf("version in force = %s, want %s (the last good one)", e.Version(), before)
			}
			if err := e.Check(t.Context(), tc.bundle, "test"); err == nil || !strings.Contains(err.Error(), tc.refused+" is not allowed") {
				t.Errorf("Check() = %v, want the same refusal", err)
			}
		})
	}
}

// TestRunTestsRefusesBuiltinsThatReachOut: `partita policy test` compiles
// with the same capabilities, so a test suite cannot pass with a policy
// the engine would refuse.
func TestRunTestsRefusesBuiltinsThatReachOut(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"site.rego":      "package partita.admission\n\ndeny contains msg if {\n\tresp := http.send({\"method\": \"GET\", \"url\": \"http://example.com\"})\n\tmsg := resp.body.reason\n}\n",
		"site_test.rego": "package partita.site_test\n\ntest_nothing if { true }\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	_, err := RunTests(t.Context(), TestOptions{Paths: []string{dir}})
	if err == nil || !strings.Contains(err.Error(), "http.send is not allowed") {
		t.Fatalf("RunTests() = %v, want the refusal of http.send", err)
	}
}
