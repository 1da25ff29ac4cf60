// Package safetensors checks that a safetensors file is whole and self-consistent
// before a model that holds it is called Ready.
//
// The format: an 8-byte little-endian header length N, N bytes of a JSON object
// mapping tensor names to {dtype, shape, data_offsets} (plus an optional
// "__metadata__" map of strings), then the data section. Offsets are relative to
// the start of the data section. Validate reads only the header; it never reads
// tensor data.
package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"sort"
)

// MaxHeaderBytes bounds the JSON header, as the reference implementation does, so
// a hostile length cannot make Validate allocate more than this.
const MaxHeaderBytes = 100 << 20

// metadataKey is the one key of the header that is not a tensor.
const metadataKey = "__metadata__"

// ErrInvalid is wrapped by every error that says the file is not valid
// safetensors (as opposed to an error reading it).
var ErrInvalid = errors.New("invalid safetensors")

// DType is a tensor element type as the header spells it.
type DType string

// dtypeBits is the element size in bits of every dtype the format knows. Some
// are narrower than a byte (F4, F6_*), so sizes are kept in bits.
var dtypeBits = map[DType]uint64{
	"BOOL": 8, "U8": 8, "I8": 8,
	"F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
	"F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
	"I16": 16, "U16": 16, "F16": 16, "BF16": 16,
	"I32": 32, "U32": 32, "F32": 32,
	"I64": 64, "U64": 64, "F64": 64, "C64": 64,
}

// Bits returns the element size in bits and whether the dtype is known.
func (d DType) Bits() (uint64, bool) {
	b, ok := dtypeBits[d]
	return b, ok
}

// Tensor is one tensor of a header. Begin and End are byte offsets into the
// data section.
type Tensor struct {
	Name  string
	DType DType
	Shape []uint64
	Begin uint64
	End   uint64
}

// Header is what Validate learnt from a valid file.
type Header struct {
	// Metadata is the optional "__metadata__" map; nil when absent.
	Metadata map[string]string
	// Tensors are sorted by Begin (then by name, for empty tensors).
	Tensors []Tensor
	// DataOffset is where the data section starts in the file: 8 + header length.
	DataOffset int64
}

// Validate reads the header of the safetensors file r of size bytes and checks
// that its tensors cover the data section exactly, each as long as its dtype and
// shape say. It returns an error wrapping ErrInvalid that names the tensor at
// fault, or the read error.
func Validate(r io.ReaderAt, size int64) (Header, error) {
	if size < 8 {
		return Header{}, fmt.Errorf("%w: file is %d bytes, shorter than the 8-byte header length", ErrInvalid, size)
	}
	var lenBuf [8]byte
	if _, err := r.ReadAt(lenBuf[:], 0); err != nil {
		return Header{}, fmt.Errorf("read header length: %w", err)
	}
	n := binary.LittleEndian.Uint64(lenBuf[:])
	if n > MaxHeaderBytes {
		return Header{}, fmt.Errorf("%w: header length %d exceeds the limit of %d bytes", ErrInvalid, n, MaxHeaderBytes)
	}
	if n > uint64(size-8) {
		return Header{}, fmt.Errorf("%w: header length %d exceeds the %d bytes after it", ErrInvalid, n, size-8)
	}
	// Allocation is bounded by both MaxHeaderBytes and the file's own size.
	raw := make([]byte, n)
	if _, err := r.ReadAt(raw, 8); err != nil {
		return Header{}, fmt.Errorf("read header: %w", err)
	}
	h, err := parseHeader(raw)
	if err != nil {
		return Header{}, err
	}
	h.DataOffset = 8 + int64(n)
	if err := checkLayout(h.Tensors, uint64(size-h.DataOffset)); err != nil {
		return Header{}, err
	}
	return h, nil
}

// tensorJSON is one tensor entry; pointers tell a missing field from a zero one.
type tensorJSON struct {
	DType       *string   `json:"dtype"`
	Shape       *[]int64  `json:"shape"`
	DataOffsets *[]uint64 `json:"data_offsets"`
}

// parseHeader decodes the JSON object token by token so that duplicate keys and
// trailing content are refused instead of silently resolved.
func parseHeader(raw []byte) (Header, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	tok, err := dec.Token()
	if err != nil {
		return Header{}, fmt.Errorf("%w: header is not JSON: %w", ErrInvalid, err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return Header{}, fmt.Errorf("%w: header is not a JSON object", ErrInvalid)
	}
	var h Header
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return Header{}, fmt.Errorf("%w: header is not JSON: %w", ErrInvalid, err)
		}
		name, ok := tok.(string)
		if !ok {
			return Header{}, fmt.Errorf("%w: header key is not a string", ErrInvalid)
		}
		if seen[name] {
			return Header{}, fmt.Errorf("%w: key %q appears twice in the header", ErrInvalid, name)
		}
		seen[name] = true
		if name == metadataKey {
			var md map[string]string
			if err := dec.Decode(&md); err != nil {
				return Header{}, fmt.Errorf("%w: %s must be a map of strings: %w", ErrInvalid, metadataKey, err)
			}
			if md == nil {
				md = map[string]string{}
			}
			h.Metadata = md
			continue
		}
		t, err := decodeTensor(dec, name)
		if err != nil {
			return Header{}, err
		}
		h.Tensors = append(h.Tensors, t)
	}
	if _, err := dec.Token(); err != nil { // the closing '}'
		return Header{}, fmt.Errorf("%w: header is not JSON: %w", ErrInvalid, err)
	}
	// Writers pad the header with spaces for alignment; anything else after
	// the object is not ours to ignore.
	rest := raw[dec.InputOffset():]
	if len(bytes.TrimRight(rest, " \t\r\n")) != 0 {
		return Header{}, fmt.Errorf("%w: content after the header's JSON object", ErrInvalid)
	}
	return h, nil
}

func decodeTensor(dec *json.Decoder, name string) (Tensor, error) {
	var tj tensorJSON
	// A fresh decoder per value would lose the stream position, so decode the
	// raw value first and then decode it strictly.
	var rawVal json.RawMessage
	if err := dec.Decode(&rawVal); err != nil {
		return Tensor{}, fmt.Errorf("%w: tensor %q: %w", ErrInvalid, name, err)
	}
	vd := json.NewDecoder(bytes.NewReader(rawVal))
	vd.DisallowUnknownFields()
	if err := vd.Decode(&tj); err != nil {
		return Tensor{}, fmt.Errorf("%w: tensor %q: %w", ErrInvalid, name, err)
	}
	switch {
	case tj.DType == nil:
		return Tensor{}, fmt.Errorf("%w: tensor %q: dtype is missing", ErrInvalid, name)
	case tj.Shape == nil:
		return Tensor{}, fmt.Errorf("%w: tensor %q: shape is missing", ErrInvalid, name)
	case tj.DataOffsets == nil:
		return Tensor{}, fmt.Errorf("%w: tensor %q: data_offsets is missing", ErrInvalid, name)
	}
	t := Tensor{Name: name, DType: DType(*tj.DType)}
	if _, ok := t.DType.Bits(); !ok {
		return Tensor{}, fmt.Errorf("%w: tensor %q: unknown dtype %q", ErrInvalid, name, *tj.DType)
	}
	t.Shape = make([]uint64, len(*tj.Shape))
	for i, d := range *tj.Shape {
		if d < 0 {
			return Tensor{}, fmt.Errorf("%w: tensor %q: shape[%d] is negative (%d)", ErrInvalid, name, i, d)
		}
		t.Shape[i] = uint64(d)
	}
	offs := *tj.DataOffsets
	if len(offs) != 2 {
		return Tensor{}, fmt.Errorf("%w: tensor %q: data_offsets has %d values, want [begin, end]", ErrInvalid, name, len(offs))
	}
	t.Begin, t.End = offs[0], offs[1]
	if t.Begin > t.End {
		return Tensor{}, fmt.Errorf("%w: tensor %q: data_offsets begin %d is after end %d", ErrInvalid, name, t.Begin, t.End)
	}
	want, err := byteLen(t)
	if err != nil {
		return Tensor{}, err
	}
	if got := t.End - t.Begin; got != want {
		return Tensor{}, fmt.Errorf("%w: tensor %q: data_offsets span %d bytes, but %s%v needs %d", ErrInvalid, name, got, t.DType, t.Shape, want)
	}
	return t, nil
}

// byteLen is product(shape) × element size, refusing overflow and sub-byte
// tensors that do not end on a byte boundary.
func byteLen(t Tensor) (uint64, error) {
	elems := uint64(1)
	for _, d := range t.Shape {
		hi, lo := bits.Mul64(elems, d)
		if hi != 0 {
			return 0, fmt.Errorf("%w: tensor %q: shape %v overflows", ErrInvalid, t.Name, t.Shape)
		}
		elems = lo
	}
	b, _ := t.DType.Bits()
	hi, total := bits.Mul64(elems, b)
	if hi != 0 || total/8 > math.MaxInt64 {
		return 0, fmt.Errorf("%w: tensor %q: shape %v overflows", ErrInvalid, t.Name, t.Shape)
	}
	if total%8 != 0 {
		return 0, fmt.Errorf("%w: tensor %q: %d elements of %s do not fill whole bytes", ErrInvalid, t.Name, elems, t.DType)
	}
	return total / 8, nil
}

// checkLayout sorts the tensors and checks that they tile [0, dataLen) with no
// gap and no overlap.
func checkLayout(ts []Tensor, dataLen uint64) error {
	sort.Slice(ts, func(i, j int) bool {
		if ts[i].Begin != ts[j].Begin {
			return ts[i].Begin < ts[j].Begin
		}
		// Empty tensors share an offset with their neighbour; order them first
		// so the non-empty one that follows still starts where they end.
		if (ts[i].End == ts[i].Begin) != (ts[j].End == ts[j].Begin) {
			return ts[i].End == ts[i].Begin
		}
		return ts[i].Name < ts[j].Name
	})
	var at uint64
	prev := ""
	for _, t := range ts {
		switch {
		case t.Begin > at && prev == "":
			return fmt.Errorf("%w: tensor %q starts at %d, leaving bytes [0, %d) of the data section unused", ErrInvalid, t.Name, t.Begin, t.Begin)
		case t.Begin > at:
			return fmt.Errorf("%w: gap of bytes [%d, %d) between tensors %q and %q", ErrInvalid, at, t.Begin, prev, t.Name)
		case t.Begin < at:
			return fmt.Errorf("%w: tensor %q at [%d, %d) overlaps tensor %q, which ends at %d", ErrInvalid, t.Name, t.Begin, t.End, prev, at)
		}
		at = t.End
		prev = t.Name
	}
	switch {
	case at < dataLen && prev == "":
		return fmt.Errorf("%w: no tensors, but the data section has %d bytes", ErrInvalid, dataLen)
	case at < dataLen:
		return fmt.Errorf("%w: data section has %d bytes after the last tensor %q", ErrInvalid, dataLen-at, prev)
	case at > dataLen:
		return fmt.Errorf("%w: tensor %q ends at %d, past the data section's %d bytes", ErrInvalid, prev, at, dataLen)
	}
	return nil
}
