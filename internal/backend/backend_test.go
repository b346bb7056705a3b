package backend

import (
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"
)

// TestPack runs testdata/pack_vectors.json, which the Python publisher
// runs too: both must lay a published layout out as the daemon expects.
func TestPack(t *testing.T) {
	data, err := os.ReadFile("testdata/pack_vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Alignment  int64
		MaxSegment int64 `json:"default_max_segment"`
		Packs      []struct {
			Name       string
			Sizes      []int64
			MaxSegment int64 `json:"max_segment"`
			Placements [][2]int64
			Segments   []int64
			Reason     string
		}
	}
	if err := json.Unmarshal(data, &file); err != nil {
		t.Fatal(err)
	}
	if file.Alignment != Alignment || file.MaxSegment != DefaultMaxSegment {
		t.Errorf("pinned alignment %d and segment size %d, backend has %d and %d", file.Alignment, file.MaxSegment, Alignment, DefaultMaxSegment)
	}
	for _, v := range file.Packs {
		t.Run(v.Name, func(t *testing.T) {
			places, segs, err := Pack(v.Sizes, v.MaxSegment)
			if v.Reason != "" {
				if err == nil || !strings.Contains(err.Error(), v.Reason) {
					t.Fatalf("Pack err = %v, want one with %q", err, v.Reason)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got [][2]int64
			for _, p := range places {
				got = append(got, [2]int64{int64(p.Segment), p.Offset})
			}
			if !slices.Equal(got, v.Placements) || !slices.Equal(segs, v.Segments) {
				t.Errorf("Pack = %v, %v, want %v, %v", got, segs, v.Placements, v.Segments)
			}
		})
	}
}
