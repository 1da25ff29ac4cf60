package safetensors

import (
	"bytes"
	"encoding/binary"
	"testing"
)

// FuzzValidate feeds hostile files: Validate must not panic, must allocate no
// more than the file's size for the header, and a file it accepts must satisfy
// the invariants it promises.
func FuzzValidate(f *testing.F) {
	f.Add(file(`{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, 8))
	f.Add(file(`{"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},"b":{"dtype":"I8","shape":[1],"data_offsets":[0,1]}}  `, 1))
	f.Add(file(`{}`, 0))
	f.Add(binary.LittleEndian.AppendUint64(nil, 1<<63))
	f.Add(append(binary.LittleEndian.AppendUint64(nil, 2), "{}"...))
	f.Fuzz(func(t *testing.T, data []byte) {
		h, err := Validate(bytes.NewReader(data), int64(len(data)))
		if err != nil {
			return
		}
		if h.DataOffset < 8 || h.DataOffset > int64(len(data)) {
			t.Fatalf("DataOffset %d outside the file of %d bytes", h.DataOffset, len(data))
		}
		at := uint64(0)
		for _, tn := range h.Tensors {
			if tn.Begin != at {
				t.Fatalf("tensor %q begins at %d, want %d", tn.Name, tn.Begin, at)
			}
			at = tn.End
		}
		if want := uint64(int64(len(data)) - h.DataOffset); at != want {
			t.Fatalf("tensors end at %d, data section is %d bytes", at, want)
		}
	})
}
