package extender

import (
	"encoding/json"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
)

// kube-scheduler sends filter and prioritize a pod and hundreds of node names
// for every GPU pod, and reads back as many names and scores. encoding/json
// spends most of a request's time on those names (reflection for each one,
// and a validation pass over the whole body before decoding), several times
// the verbs' own work. The functions below read and write the names by hand
// and leave everything else to encoding/json; whenever the body is not in
// the plain form kube-scheduler writes, they step aside and encoding/json
// decides, so the result is always what encoding/json would give
// (FuzzExtenderArgsCodec checks that).

// decodeExtenderArgs decodes a filter or prioritize body as
// json.Unmarshal into extenderv1.ExtenderArgs would.
func decodeExtenderArgs(verb string, body []byte) (*extenderv1.ExtenderArgs, error) {
	if args, ok := fastExtenderArgs(body); ok {
		return args, nil
	}
	return decodeArgs[extenderv1.ExtenderArgs](verb, body)
}

// fastExtenderArgs decodes body when it is a JSON object whose keys are
// plain ASCII and appear once, with NodeNames (if set) an array of plain
// ASCII strings. It reports false for anything else.
func fastExtenderArgs(body []byte) (*extenderv1.ExtenderArgs, bool) {
	p := jsonReader{b: body}
	p.space()
	if !p.eat('{') {
		return nil, false
	}
	out := &extenderv1.ExtenderArgs{}
	var seenPod, seenNodes, seenNames bool
	p.space()
	if !p.eat('}') {
		for {
			p.space()
			key, ok := p.plainString()
			if !ok {
				return nil, false
			}
			p.space()
			if !p.eat(':') {
				return nil, false
			}
			p.space()
			start := p.i
			if !p.skipValue() {
				return nil, false
			}
			val := body[start:p.i]
			null := string(val) == "null"
			switch {
			case strings.EqualFold(key, "Pod"):
				if seenPod {
					return nil, false
				}
				seenPod = true
				if !null {
					out.Pod = &corev1.Pod{}
					if json.Unmarshal(val, out.Pod) != nil {
						return nil, false
					}
				}
			case strings.EqualFold(key, "Nodes"):
				if seenNodes {
					return nil, false
				}
				seenNodes = true
				if !null {
					out.Nodes = &corev1.NodeList{}
					if json.Unmarshal(val, out.Nodes) != nil {
						return nil, false
					}
				}
			case strings.EqualFold(key, "NodeNames"):
				if seenNames {
					return nil, false
				}
				seenNames = true
				if !null {
					names, ok := plainStringArray(val)
					if !ok {
						return nil, false
					}
					out.NodeNames = &names
				}
			default:
				if !json.Valid(val) {
					return nil, false
				}
			}
			p.space()
			if p.eat(',') {
				continue
			}
			if p.eat('}') {
				break
			}
			return nil, false
		}
	}
	p.space()
	return out, p.i == len(body)
}

// plainStringArray reads a JSON array of plain strings.
func plainStringArray(b []byte) ([]string, bool) {
	p := jsonReader{b: b}
	if !p.eat('[') {
		return nil, false
	}
	out := []string{}
	p.space()
	if p.eat(']') {
		return out, p.i == len(b)
	}
	for {
		p.space()
		s, ok := p.plainString()
		if !ok {
			return nil, false
		}
		out = append(out, s)
		p.space()
		if p.eat(',') {
			continue
		}
		if p.eat(']') {
			return out, p.i == len(b)
		}
		return nil, false
	}
}

// jsonReader reads JSON tokens from b, from position i.
type jsonReader struct {
	b []byte
	i int
}

func (p *jsonReader) space() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *jsonReader) eat(c byte) bool {
	if p.i < len(p.b) && p.b[p.i] == c {
		p.i++
		return true
	}
	return false
}

// plainString reads a string of printable ASCII without escapes.
func (p *jsonReader) plainString() (string, bool) {
	if !p.eat('"') {
		return "", false
	}
	start := p.i
	for p.i < len(p.b) {
		c := p.b[p.i]
		switch {
		case c == '"':
			s := string(p.b[start:p.i])
			p.i++
			return s, true
		case c < 0x20 || c > 0x7e || c == '\\':
			return "", false
		}
		p.i++
	}
	return "", false
}

// skipValue moves past one value without checking it; encoding/json checks
// what the caller keeps. Strings are skipped with their escapes, objects
// and arrays by depth.
func (p *jsonReader) skipValue() bool {
	if p.i >= len(p.b) {
		return false
	}
	depth := 0
	for p.i < len(p.b) {
		switch c := p.b[p.i]; c {
		case '"':
			p.i++
			for p.i < len(p.b) && p.b[p.i] != '"' {
				if p.b[p.i] == '\\' {
					p.i++
				}
				p.i++
			}
			if p.i >= len(p.b) {
				return false
			}
			p.i++
		case '{', '[':
			depth++
			p.i++
		case '}', ']':
			if depth == 0 {
				return true
			}
			depth--
			p.i++
		case ',', ' ', '\t', '\n', '\r':
			if depth == 0 {
				return true
			}
			p.i++
		default:
			p.i++
		}
		if depth == 0 && p.i > 0 && (p.b[p.i-1] == '"' || p.b[p.i-1] == '}' || p.b[p.i-1] == ']') {
			return true
		}
	}
	return depth == 0
}

// encodeFilterResult is json.Marshal(r) for the result of a filter on node
// names; false for one on whole nodes.
func encodeFilterResult(r *extenderv1.ExtenderFilterResult) ([]byte, bool) {
	if r.Nodes != nil {
		return nil, false
	}
	n := 128
	if r.NodeNames != nil {
		n += 24 * len(*r.NodeNames)
	}
	b := make([]byte, 0, n)
	b = append(b, `{"Nodes":null,"NodeNames":`...)
	if r.NodeNames == nil || *r.NodeNames == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i, s := range *r.NodeNames {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, s)
		}
		b = append(b, ']')
	}
	b = append(b, `,"FailedNodes":`...)
	b = appendFailedNodes(b, r.FailedNodes)
	b = append(b, `,"FailedAndUnresolvableNodes":`...)
	b = appendFailedNodes(b, r.FailedAndUnresolvableNodes)
	b = append(b, `,"Error":`...)
	b = appendJSONString(b, r.Error)
	return append(b, '}'), true
}

// encodeHostPriorityList is json.Marshal(l).
func encodeHostPriorityList(l extenderv1.HostPriorityList) []byte {
	if l == nil {
		return []byte("null")
	}
	b := make([]byte, 0, 2+40*len(l))
	b = append(b, '[')
	for i, hp := range l {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"Host":`...)
		b = appendJSONString(b, hp.Host)
		b = append(b, `,"Score":`...)
		b = strconv.AppendInt(b, hp.Score, 10)
		b = append(b, '}')
	}
	return append(b, ']')
}

// appendFailedNodes writes a map with its keys sorted, as encoding/json does.
func appendFailedNodes(b []byte, m extenderv1.FailedNodesMap) []byte {
	if m == nil {
		return append(b, "null"...)
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	b = append(b, '{')
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, k)
		b = append(b, ':')
		b = appendJSONString(b, m[k])
	}
	return append(b, '}')
}

// appendJSONString appends s as encoding/json writes it: plain printable
// ASCII as it is, anything else (escapes, HTML-sensitive <, > and &, UTF-8)
// through encoding/json itself.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s)
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}
