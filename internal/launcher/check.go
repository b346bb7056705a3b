package launcher

import "fmt"

// CheckPlan slices every tensor of g for every tensor-parallel rank, so that
// a dimension that does not divide is reported, naming the tensor, before
// any daemon starts.
func CheckPlan(g Group, tp int) error {
	for _, t := range g.Checkpoint.Tensors() {
		for r := range tp {
			if _, err := g.Plan.SliceFor(t.Tensor.Name, t.Tensor.Shape, g.Heads, tp, r); err != nil {
				return fmt.Errorf("group %s (%s): %w", g.Name, g.Model, err)
			}
		}
	}
	return nil
}
