package launcher

import (
	"fmt"
	"strings"

	"github.com/weightcache/weightcache/internal/plan"
	"github.com/weightcache/weightcache/internal/protocol"
)

// firstUnmatched is how many unmatched names a report lists.
const firstUnmatched = 5

// CheckPlan slices every tensor of g for every tensor-parallel rank, so that
// a dimension that does not divide is reported, naming the tensor, before
// any daemon starts. It fills g.Report; with strict, a tensor that no rule
// of the plan matches is an error.
func CheckPlan(g *Group, tp int, strict bool) error {
	rep := &protocol.PlanReport{Plan: g.Plan.Name}
	for _, t := range g.Checkpoint.Tensors() {
		for r := range tp {
			if _, err := g.Plan.SliceFor(t.Tensor.Name, t.Tensor.Shape, g.Heads, tp, r); err != nil {
				return fmt.Errorf("group %s (%s): %w", g.Name, g.Model, err)
			}
		}
		rule, matched := g.Plan.Lookup(t.Tensor.Name)
		if rule.Split == plan.Replicated {
			rep.ReplicatedBytes += t.Tensor.NBytes()
		}
		if !matched {
			rep.Unmatched++
			rep.UnmatchedBytes += t.Tensor.NBytes()
			if len(rep.FirstUnmatched) < firstUnmatched {
				rep.FirstUnmatched = append(rep.FirstUnmatched, t.Tensor.Name)
			}
		}
	}
	g.Report = rep
	if strict && rep.Unmatched > 0 {
		return fmt.Errorf("group %s (%s): --strict-plan: %d tensors (%d bytes) match no rule of plan %s and would be replicated on every rank; first: %s",
			g.Name, g.Model, rep.Unmatched, rep.UnmatchedBytes, g.Plan.Name, strings.Join(rep.FirstUnmatched, ", "))
	}
	return nil
}
