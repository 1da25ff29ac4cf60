package safetensors

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// file builds a safetensors file from a header text and a data section length.
func file(header string, dataLen int) []byte {
	var b bytes.Buffer
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(header)))
	b.Write(n[:])
	b.WriteString(header)
	b.Write(make([]byte, dataLen))
	return b.Bytes()
}

func TestValidate(t *testing.T) {
	cases := map[string]struct {
		data    []byte
		want    Header
		wantErr string // substring; empty means valid
	}{
		"two tensors, metadata": {
			data: file(`{"__metadata__":{"format":"pt"},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]},"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}}`, 12),
			want: Header{
				Metadata: map[string]string{"format": "pt"},
				Tensors: []Tensor{
					{Name: "a", DType: "BF16", Shape: []uint64{2}, Begin: 0, End: 4},
					{Name: "b", DType: "F32", Shape: []uint64{2}, Begin: 4, End: 12},
				},
			},
		},
		"padded header, scalar and empty tensors": {
			data: file(`{"s":{"dtype":"I64","shape":[],"data_offsets":[0,8]},"e":{"dtype":"F16","shape":[0,3],"data_offsets":[8,8]},"f":{"dtype":"U8","shape":[1],"data_offsets":[8,9]}}   `, 9),
			want: Header{
				Tensors: []Tensor{
					{Name: "s", DType: "I64", Shape: []uint64{}, Begin: 0, End: 8},
					{Name: "e", DType: "F16", Shape: []uint64{0, 3}, Begin: 8, End: 8},
					{Name: "f", DType: "U8", Shape: []uint64{1}, Begin: 8, End: 9},
				},
			},
		},
		"sub-byte dtype": {
			data: file(`{"q":{"dtype":"F4","shape":[4],"data_offsets":[0,2]}}`, 2),
			want: Header{Tensors: []Tensor{{Name: "q", DType: "F4", Shape: []uint64{4}, Begin: 0, End: 2}}},
		},
		"empty header, empty data": {
			data: file(`{}`, 0),
			want: Header{},
		},
		"shorter than 8 bytes":       {data: []byte{1, 2, 3}, wantErr: "shorter than the 8-byte header length"},
		"header length past the end": {data: file(`{}`, 0)[:9], wantErr: "exceeds the 1 bytes after it"},
		"header length over the limit": {
			data:    append(binary.LittleEndian.AppendUint64(nil, MaxHeaderBytes+1), '{', '}'),
			wantErr: "exceeds the limit",
		},
		"not JSON":              {data: file(`{x}`, 0), wantErr: "header is not JSON"},
		"not an object":         {data: file(`[]`, 0), wantErr: "not a JSON object"},
		"trailing garbage":      {data: file(`{} x`, 0), wantErr: "content after the header"},
		"duplicate tensor":      {data: file(`{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}`, 2), wantErr: `key "a" appears twice`},
		"metadata not strings":  {data: file(`{"__metadata__":{"n":1}}`, 0), wantErr: "__metadata__ must be a map of strings"},
		"unknown dtype":         {data: file(`{"w":{"dtype":"F99","shape":[1],"data_offsets":[0,1]}}`, 1), wantErr: `tensor "w": unknown dtype "F99"`},
		"missing dtype":         {data: file(`{"w":{"shape":[1],"data_offsets":[0,1]}}`, 1), wantErr: `tensor "w": dtype is missing`},
		"missing shape":         {data: file(`{"w":{"dtype":"U8","data_offsets":[0,1]}}`, 1), wantErr: `tensor "w": shape is missing`},
		"missing offsets":       {data: file(`{"w":{"dtype":"U8","shape":[1]}}`, 1), wantErr: `tensor "w": data_offsets is missing`},
		"unknown field":         {data: file(`{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":1}}`, 1), wantErr: `tensor "w": json: unknown field "x"`},
		"negative dim":          {data: file(`{"w":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}}`, 1), wantErr: `tensor "w": shape[0] is negative`},
		"fractional dim":        {data: file(`{"w":{"dtype":"U8","shape":[1.5],"data_offsets":[0,1]}}`, 1), wantErr: `tensor "w"`},
		"three offsets":         {data: file(`{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}}`, 1), wantErr: `tensor "w": data_offsets has 3 values`},
		"begin after end":       {data: file(`{"w":{"dtype":"U8","shape":[1],"data_offsets":[2,1]}}`, 1), wantErr: `tensor "w": data_offsets begin 2 is after end 1`},
		"length differs":        {data: file(`{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}`, 4), wantErr: `tensor "w": data_offsets span 4 bytes, but F32[2] needs 8`},
		"shape overflows":       {data: file(`{"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}}`, 4), wantErr: `tensor "w": shape [4294967296 4294967296] overflows`},
		"sub-byte partial byte": {data: file(`{"q":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}}`, 2), wantErr: `tensor "q": 3 elements of F4 do not fill whole bytes`},
		"gap between":           {data: file(`{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"b":{"dtype":"U8","shape":[1],"data_offsets":[2,3]}}`, 3), wantErr: `gap of bytes [1, 2) between tensors "a" and "b"`},
		"gap at start":          {data: file(`{"b":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}`, 2), wantErr: `tensor "b" starts at 1`},
		"overlap":               {data: file(`{"a":{"dtype":"U16","shape":[1],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}`, 2), wantErr: `tensor "b" at [1, 2) overlaps tensor "a"`},
		"bytes after last":      {data: file(`{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}`, 3), wantErr: `2 bytes after the last tensor "a"`},
		"past the end":          {data: file(`{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}`, 1), wantErr: `tensor "a" ends at 2, past the data section's 1 bytes`},
		"data but no tensors":   {data: file(`{}`, 4), wantErr: "no tensors, but the data section has 4 bytes"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := Validate(bytes.NewReader(tc.data), int64(len(tc.data)))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Validate() error = %v, want one containing %q", err, tc.wantErr)
				}
				if !errors.Is(err, ErrInvalid) {
					t.Errorf("Validate() error %v does not wrap ErrInvalid", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Validate() error = %v", err)
			}
			// The data section is what follows the header, so its offset is
			// the file size less the data the tensors cover.
			tc.want.DataOffset = int64(len(tc.data))
			if n := len(got.Tensors); n > 0 {
				tc.want.DataOffset -= int64(got.Tensors[n-1].End)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Validate() (-want,+got):\n%s", diff)
			}
		})
	}
}

// shortReader fails every read, as a truncated or unreadable file would.
type shortReader struct{}

func (shortReader) ReadAt([]byte, int64) (int, error) { return 0, errors.New("disk on fire") }

func TestValidateReadError(t *testing.T) {
	_, err := Validate(shortReader{}, 100)
	if err == nil || errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "disk on fire") {
		t.Fatalf("Validate() error = %v, want the read error, not ErrInvalid", err)
	}
}
