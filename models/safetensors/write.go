package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
)

// Layout gives each tensor its offsets, one after the other from the start
// of the data section, in the order given, and returns them with the data
// section's length. It fails for an unknown dtype or a size that overflows.
func Layout(tensors []Tensor) ([]Tensor, uint64, error) {
	out := make([]Tensor, len(tensors))
	var at uint64
	for i, t := range tensors {
		if _, ok := t.DType.Bits(); !ok {
			return nil, 0, fmt.Errorf("%w: tensor %q: unknown dtype %q", ErrInvalid, t.Name, t.DType)
		}
		n, err := byteLen(t)
		if err != nil {
			return nil, 0, err
		}
		if at+n < at {
			return nil, 0, fmt.Errorf("%w: tensor %q overflows the data section", ErrInvalid, t.Name)
		}
		t.Begin, t.End = at, at+n
		at += n
		out[i] = t
	}
	return out, at, nil
}

// WriteHeader writes the 8-byte header length and the JSON header of a
// file holding tensors (offsets as Layout gives them) and meta (may be
// nil); the caller writes the data section after it. What it writes is
// what Validate accepts once the data is there.
func WriteHeader(w io.Writer, meta map[string]string, tensors []Tensor) error {
	var b bytes.Buffer
	b.WriteByte('{')
	if len(meta) > 0 {
		m, err := json.Marshal(meta)
		if err != nil {
			return fmt.Errorf("encode %s: %w", metadataKey, err)
		}
		b.WriteString(`"` + metadataKey + `":`)
		b.Write(m)
	}
	for i, t := range tensors {
		if i > 0 || len(meta) > 0 {
			b.WriteByte(',')
		}
		name, err := json.Marshal(t.Name)
		if err != nil {
			return fmt.Errorf("encode tensor name %q: %w", t.Name, err)
		}
		shape := t.Shape
		if shape == nil {
			shape = []uint64{}
		}
		entry, err := json.Marshal(struct {
			DType       DType     `json:"dtype"`
			Shape       []uint64  `json:"shape"`
			DataOffsets [2]uint64 `json:"data_offsets"`
		}{t.DType, shape, [2]uint64{t.Begin, t.End}})
		if err != nil {
			return fmt.Errorf("encode tensor %q: %w", t.Name, err)
		}
		b.Write(name)
		b.WriteByte(':')
		b.Write(entry)
	}
	b.WriteByte('}')
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(b.Len()))
	if _, err := w.Write(n[:]); err != nil {
		return err
	}
	_, err := w.Write(b.Bytes())
	return err
}
