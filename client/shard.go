package client

import (
	"context"
	"fmt"

	"github.com/weightcache/weightcache/internal/backend/host"
	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/plan"
	"github.com/weightcache/weightcache/internal/scatter"
)

// loadShardFromDisk loads this engine's tensor-parallel slice of every
// tensor, sliced by the plan file, else the architecture's built-in plan,
// exactly as a daemon serves it, so that a fallback hands the engine the
// same tensors a hit would.
func loadShardFromDisk(ctx context.Context, ckpt *checkpoint.Checkpoint, fp checkpoint.Fingerprint, planFile string) (*Weights, error) {
	var p *plan.Plan
	var err error
	if planFile != "" {
		p, err = plan.Load(planFile)
	} else {
		p, err = plan.ForArchitecture(ckpt.Architecture)
	}
	if err != nil {
		return nil, err
	}
	m, err := plan.ReadModel(ckpt.Dir)
	if err != nil {
		return nil, err
	}
	be, err := host.New("host")
	if err != nil {
		return nil, err
	}
	res, err := scatter.Load(ctx, scatter.Config{
		Checkpoint: ckpt, DType: fp.DType, Plan: p, Model: m, TPSize: fp.TPSize,
		Targets: []scatter.Target{{Backend: be, TPRank: fp.TPRank}},
	})
	if err != nil {
		return nil, err
	}
	rk := res.Ranks[0]
	// The mappings keep the memory; the segments' own descriptors go.
	defer func() {
		for _, s := range rk.Segments {
			_ = s.Free()
		}
	}()
	w := &Weights{}
	for i, s := range rk.Segments {
		f, err := s.Export()
		if err != nil {
			w.Close()
			return nil, fmt.Errorf("segment %d: %w", i, err)
		}
		b, err := host.Map(f, s.Size())
		_ = f.Close()
		if err != nil {
			w.Close()
			return nil, err
		}
		w.maps = append(w.maps, b)
	}
	w.list = make([]Tensor, len(rk.Tensors))
	for i, t := range rk.Tensors {
		seg := w.maps[t.Segment]
		w.list[i] = Tensor{Name: t.Name, DType: t.DType, Shape: t.Shape, NBytes: t.NBytes, Data: seg[t.Offset : t.Offset+t.NBytes : t.Offset+t.NBytes]}
	}
	return w, nil
}
