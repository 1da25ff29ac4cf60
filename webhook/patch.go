package webhook

import (
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"gomodules.xyz/jsonpatch/v2"
	sigsjson "sigs.k8s.io/json"
)

// createPatch is the general form of podPatch, kept as its reference in the
// tests: the JSON patch that makes raw (the object as the API
// server sent it) carry the changes from before to after, where before is
// raw as this build decoded it.
//
// jsonpatch.CreatePatch(raw, after) would be wrong twice: fields this build
// does not know (a newer API server's) are missing from after and would be
// removed, and fields raw leaves out but Go marshals (resources: {}) would be
// assumed present. So the patch is the diff from before to after, rebased
// on raw: only what the webhook changed is touched, missing parents are
// added whole, unknown fields stay.
//
// The operations come in a stable order, for reviews and golden files: map
// keys sorted, and in an array first removals from the end (highest index
// first), then changes to elements, then additions.
func createPatch(raw []byte, before, after any) ([]jsonpatch.Operation, error) {
	a, err := toGeneric(before)
	if err != nil {
		return nil, err
	}
	b, err := toGeneric(after)
	if err != nil {
		return nil, err
	}
	r, err := decodeGeneric(raw)
	if err != nil {
		return nil, err
	}
	ops := []jsonpatch.Operation{}
	if !reflect.DeepEqual(a, b) {
		rebaseDiff(r, a, b, "", &ops)
	}
	return ops, nil
}

// rebaseDiff appends to ops what turns raw into raw-with-the-changes-from-a-
// to-b, at path.
func rebaseDiff(raw, a, b any, path string, ops *[]jsonpatch.Operation) {
	switch bv := b.(type) {
	case map[string]any:
		am, aok := a.(map[string]any)
		rm, rok := raw.(map[string]any)
		if !aok || !rok {
			replaceIfDifferent(raw, b, path, ops)
			return
		}
		for _, k := range slices.Sorted(maps.Keys(bv)) {
			v := bv[k]
			av, inA := am[k]
			if inA && reflect.DeepEqual(av, v) {
				continue
			}
			p := path + "/" + escapePointer(k)
			switch rv, inR := rm[k]; {
			case inR && inA:
				rebaseDiff(rv, av, v, p, ops)
			case inR:
				replaceIfDifferent(rv, v, p, ops)
			default:
				*ops = append(*ops, jsonpatch.NewOperation("add", p, v))
			}
		}
		for _, k := range slices.Sorted(maps.Keys(am)) {
			if _, inB := bv[k]; inB {
				continue
			}
			if _, inR := rm[k]; inR {
				*ops = append(*ops, jsonpatch.NewOperation("remove", path+"/"+escapePointer(k), nil))
			}
		}
	case []any:
		aa, aok := a.([]any)
		ra, rok := raw.([]any)
		if !aok || !rok || len(aa) != len(ra) {
			replaceIfDifferent(raw, b, path, ops)
			return
		}
		n := min(len(aa), len(bv))
		for i := len(aa) - 1; i >= n; i-- {
			*ops = append(*ops, jsonpatch.NewOperation("remove", path+"/"+strconv.Itoa(i), nil))
		}
		for i := range n {
			if !reflect.DeepEqual(aa[i], bv[i]) {
				rebaseDiff(ra[i], aa[i], bv[i], path+"/"+strconv.Itoa(i), ops)
			}
		}
		for i := n; i < len(bv); i++ {
			*ops = append(*ops, jsonpatch.NewOperation("add", path+"/"+strconv.Itoa(i), bv[i]))
		}
	default:
		replaceIfDifferent(raw, b, path, ops)
	}
}

func replaceIfDifferent(raw, b any, path string, ops *[]jsonpatch.Operation) {
	if !reflect.DeepEqual(raw, b) {
		*ops = append(*ops, jsonpatch.NewOperation("replace", path, b))
	}
}

// escapePointer escapes a JSON pointer token (RFC 6901).
func escapePointer(s string) string {
	if !strings.ContainsAny(s, "~/") {
		return s
	}
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

// diffPaths lists where after differs from before, for messages.
func diffPaths(before, after any) ([]jsonpatch.Operation, error) {
	a, err := json.Marshal(before)
	if err != nil {
		return nil, fmt.Errorf("marshal object: %w", err)
	}
	b, err := json.Marshal(after)
	if err != nil {
		return nil, fmt.Errorf("marshal object: %w", err)
	}
	ops, err := jsonpatch.CreatePatch(a, b)
	if err != nil {
		return nil, fmt.Errorf("diff object: %w", err)
	}
	slices.SortFunc(ops, func(x, y jsonpatch.Operation) int { return strings.Compare(x.Path, y.Path) })
	return ops, nil
}

func toGeneric(v any) (any, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("marshal object: %w", err)
	}
	return decodeGeneric(b)
}

// decodeGeneric keeps integers as integers: a float64 round trip would
// turn 1000000 into 1e+06, which an integer field refuses.
func decodeGeneric(b []byte) (any, error) {
	var out any
	if err := sigsjson.UnmarshalCaseSensitivePreserveInts(b, &out); err != nil {
		return nil, fmt.Errorf("decode object: %w", err)
	}
	return out, nil
}

// patchPaths lists the paths a patch touches, for messages.
func patchPaths(ops []jsonpatch.Operation, limit int) string {
	paths := make([]string, 0, min(len(ops), limit))
	for i, op := range ops {
		if i == limit {
			paths = append(paths, fmt.Sprintf("and %d more", len(ops)-limit))
			break
		}
		paths = append(paths, op.Path)
	}
	return strings.Join(paths, ", ")
}
