package dmem

import (
	"strings"
	"testing"
)

// FuzzParseCapacity: any file either parses into regions that MaxValue
// writes back as lines of the same form, or is refused; it never panics.
func FuzzParseCapacity(f *testing.F) {
	f.Add([]byte("drm/0000:3b:00.0/vram0 85899345920\n"))
	f.Add([]byte("a 1\nb 2\n\n"))
	f.Add([]byte("x\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		regions, err := ParseCapacity(data)
		if err != nil {
			return
		}
		limits := make([]Limit, len(regions))
		for i, r := range regions {
			if r.Bytes < 0 || r.Name == "" || strings.ContainsAny(r.Name, " \t\n") {
				t.Fatalf("ParseCapacity(%q) gave region %+v", data, r)
			}
			limits[i] = Limit{Region: r.Name, Bytes: r.Bytes}
		}
		back, err := ParseCapacity([]byte(MaxValue(limits)))
		if err != nil {
			t.Fatalf("MaxValue of parsed regions does not parse: %v", err)
		}
		if len(back) > len(regions) {
			t.Fatalf("round trip grew %d regions to %d", len(regions), len(back))
		}
		RegionFor(regions, "0000:3b:00.0")
	})
}
