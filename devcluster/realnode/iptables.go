package realnode

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"sort"
	"strings"
)

// The chains kubelet and kube-proxy (KUBE-) and the CNI plugins (CNI-)
// make; nothing else on a host without another Kubernetes node uses them.
var ownedChainPrefixes = []string{"KUBE-", "CNI-"}

var iptablesFamilies = []struct{ save, restore string }{
	{"iptables-save", "iptables-restore"},
	{"ip6tables-save", "ip6tables-restore"},
}

// removeIPTablesRules deletes the node's chains and every rule that jumps
// to them, table by table, and leaves every other rule as it was. Each
// table is rewritten whole by iptables-restore, atomically.
func removeIPTablesRules(ctx context.Context) error {
	var errs []error
	for _, fam := range iptablesFamilies {
		if _, err := exec.LookPath(fam.save); err != nil {
			continue
		}
		out, err := exec.CommandContext(ctx, fam.save).Output()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", fam.save, err))
			continue
		}
		for _, table := range splitTables(out) {
			kept, changed := withoutOwnedChains(table)
			if !changed {
				continue
			}
			cmd := exec.CommandContext(ctx, fam.restore, "-w")
			cmd.Stdin = strings.NewReader(kept)
			if b, err := cmd.CombinedOutput(); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w: %s", fam.restore, err, b))
			}
		}
	}
	return errors.Join(errs...)
}

// splitTables cuts iptables-save output into one "*table ... COMMIT" text
// per table.
func splitTables(out []byte) []string {
	var tables []string
	var cur []string
	for _, line := range strings.Split(string(out), "\n") {
		switch {
		case strings.HasPrefix(line, "*"):
			cur = []string{line}
		case line == "COMMIT" && cur != nil:
			tables = append(tables, strings.Join(append(cur, line), "\n")+"\n")
			cur = nil
		case cur != nil && !strings.HasPrefix(line, "#"):
			cur = append(cur, line)
		}
	}
	return tables
}

func owned(chain string) bool {
	for _, p := range ownedChainPrefixes {
		if strings.HasPrefix(chain, p) {
			return true
		}
	}
	return false
}

// withoutOwnedChains drops the owned chains' declarations, their rules and
// the rules that jump or go to them; it reports whether anything went.
func withoutOwnedChains(table string) (string, bool) {
	var kept []string
	changed := false
	for _, line := range strings.Split(strings.TrimRight(table, "\n"), "\n") {
		if ruleIsOwned(line) {
			changed = true
			continue
		}
		kept = append(kept, line)
	}
	return strings.Join(kept, "\n") + "\n", changed
}

func ruleIsOwned(line string) bool {
	fields := strings.Fields(line)
	if len(fields) == 0 {
		return false
	}
	if strings.HasPrefix(fields[0], ":") {
		return owned(strings.TrimPrefix(fields[0], ":"))
	}
	if fields[0] != "-A" && fields[0] != "-I" {
		return false
	}
	if len(fields) > 1 && owned(fields[1]) {
		return true
	}
	for i := 2; i+1 < len(fields); i++ {
		if (fields[i] == "-j" || fields[i] == "-g" || fields[i] == "--jump" || fields[i] == "--goto") && owned(fields[i+1]) {
			return true
		}
	}
	return false
}

// IPTablesRules is the host's IPv4 and IPv6 rules in a form two moments can
// be compared in: no comments, no counters, lines sorted per table, and no
// table that holds only its built-in chains with policy ACCEPT (iptables-nft
// creates such a table on first use; it filters nothing).
func IPTablesRules(ctx context.Context) (string, error) {
	var b strings.Builder
	for _, fam := range iptablesFamilies {
		if _, err := exec.LookPath(fam.save); err != nil {
			continue
		}
		out, err := exec.CommandContext(ctx, fam.save).Output()
		if err != nil {
			return "", fmt.Errorf("%s: %w", fam.save, err)
		}
		b.WriteString(normalizeRules(fam.save, out))
	}
	return b.String(), nil
}

// normalizeRules is IPTablesRules for one iptables-save output.
func normalizeRules(family string, out []byte) string {
	var b strings.Builder
	for _, table := range splitTables(out) {
		lines := strings.Split(strings.TrimRight(table, "\n"), "\n")
		name := lines[0]
		var body []string
		empty := true
		for _, l := range lines[1 : len(lines)-1] {
			if strings.HasPrefix(l, ":") {
				f := strings.Fields(l)
				if len(f) >= 2 && (f[1] != "ACCEPT" || !builtinChain(f[0][1:])) {
					empty = false
				}
				if len(f) >= 2 {
					l = f[0] + " " + f[1]
				}
			} else {
				empty = false
			}
			body = append(body, l)
		}
		if empty {
			continue
		}
		sort.Strings(body)
		fmt.Fprintf(&b, "%s %s\n%s\n", family, name, strings.Join(body, "\n"))
	}
	return b.String()
}

func builtinChain(c string) bool {
	switch c {
	case "INPUT", "OUTPUT", "FORWARD", "PREROUTING", "POSTROUTING":
		return true
	}
	return false
}

// OwnedIPTablesRules lists the host's rules that belong to a Kubernetes
// node (KUBE- and CNI- chains and jumps to them), for tests and errors.
func OwnedIPTablesRules(ctx context.Context) ([]string, error) {
	var found []string
	for _, fam := range iptablesFamilies {
		if _, err := exec.LookPath(fam.save); err != nil {
			continue
		}
		out, err := exec.CommandContext(ctx, fam.save).Output()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", fam.save, err)
		}
		for _, line := range bytes.Split(out, []byte("\n")) {
			if ruleIsOwned(string(line)) {
				found = append(found, fam.save+": "+string(line))
			}
		}
	}
	return found, nil
}
