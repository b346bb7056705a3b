package backend

import "testing"

func TestPack(t *testing.T) {
	tests := []struct {
		name   string
		sizes  []int64
		max    int64
		places []Placement
		segs   []int64
	}{
		{"empty", nil, 1024, []Placement{}, nil},
		{"aligned offsets", []int64{10, 300, 1}, 4096, []Placement{{0, 0}, {0, 256}, {0, 768}}, []int64{1024}},
		{"spills to next segment", []int64{600, 600}, 1024, []Placement{{0, 0}, {1, 0}}, []int64{768, 768}},
		{"oversized item alone", []int64{10, 5000, 10}, 1024, []Placement{{0, 0}, {1, 0}, {2, 0}}, []int64{256, 5120, 256}},
		{"zero sized", []int64{0, 0}, 1024, []Placement{{0, 0}, {0, 0}}, []int64{256}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			places, segs, err := Pack(tt.sizes, tt.max)
			if err != nil {
				t.Fatal(err)
			}
			if len(places) != len(tt.places) {
				t.Fatalf("places = %v, want %v", places, tt.places)
			}
			for i := range places {
				if places[i] != tt.places[i] {
					t.Fatalf("places = %v, want %v", places, tt.places)
				}
			}
			if len(segs) != len(tt.segs) {
				t.Fatalf("segs = %v, want %v", segs, tt.segs)
			}
			for i := range segs {
				if segs[i] != tt.segs[i] {
					t.Fatalf("segs = %v, want %v", segs, tt.segs)
				}
			}
		})
	}
	if _, _, err := Pack([]int64{-1}, 1024); err == nil {
		t.Error("negative size accepted")
	}
	if _, _, err := Pack([]int64{1}, 10); err == nil {
		t.Error("segment size below alignment accepted")
	}
}
