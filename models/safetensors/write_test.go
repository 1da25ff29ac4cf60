package safetensors

import (
	"bytes"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestWriteHeaderIsWhatValidateReads(t *testing.T) {
	cases := map[string]struct {
		meta    map[string]string
		tensors []Tensor
	}{
		"layers with metadata": {
			meta: map[string]string{"format": "pt"},
			tensors: []Tensor{
				{Name: "model.layers.0.weight", DType: "BF16", Shape: []uint64{16, 8}},
				{Name: "model.layers.0.bias", DType: "F32", Shape: []uint64{8}},
				{Name: "scalar", DType: "F16"},
			},
		},
		"one tensor, no metadata": {
			tensors: []Tensor{{Name: `a "quoted" name`, DType: "U8", Shape: []uint64{3}}},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			laid, n, err := Layout(tc.tensors)
			if err != nil {
				t.Fatal(err)
			}
			var b bytes.Buffer
			if err := WriteHeader(&b, tc.meta, laid); err != nil {
				t.Fatal(err)
			}
			b.Write(make([]byte, n))
			h, err := Validate(bytes.NewReader(b.Bytes()), int64(b.Len()))
			if err != nil {
				t.Fatalf("Validate: %v", err)
			}
			if diff := cmp.Diff(laid, h.Tensors, cmp.Transformer("byName", func(ts []Tensor) map[string]Tensor {
				m := map[string]Tensor{}
				for _, t := range ts {
					if t.Shape == nil {
						t.Shape = []uint64{}
					}
					m[t.Name] = t
				}
				return m
			})); diff != "" {
				t.Errorf("tensors (-written +read):\n%s", diff)
			}
			if diff := cmp.Diff(tc.meta, h.Metadata); diff != "" {
				t.Errorf("metadata (-written +read):\n%s", diff)
			}
		})
	}
}

func TestLayoutRefusesUnknownDTypes(t *testing.T) {
	if _, _, err := Layout([]Tensor{{Name: "w", DType: "F12", Shape: []uint64{4}}}); !errors.Is(err, ErrInvalid) {
		t.Errorf("Layout of an unknown dtype: %v, want an error wrapping ErrInvalid", err)
	}
}
