package scatter

import (
	"fmt"

	"github.com/weightcache/weightcache/internal/backend"
	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/plan"
	"github.com/weightcache/weightcache/internal/protocol"
	"github.com/weightcache/weightcache/internal/safetensors"
)

// job is one tensor: read once, written as part[t] to every target t.
type job struct {
	s       checkpoint.Served
	part    []*part            // per target
	groups  []*group           // targets holding the same slice share one
	entries []*protocol.Tensor // per target, for the checksums
}

// part is where one target's slice of a tensor goes.
type part struct {
	slice  plan.Slice
	nbytes int64
	seg    backend.Segment
	off    int64
	dev    string
}

// group is the targets that hold the same slice (data-parallel replicas
// of one tensor-parallel rank): the slice is gathered and checksummed once
// and written to each.
type group struct {
	slice      plan.Slice
	targets    []int
	start, len int64 // the slice along a row, in elements
	crc        uint32
}

// planJobs slices every served tensor for every target.
func planJobs(cfg Config) ([]*job, error) {
	served, err := cfg.Checkpoint.ServedTensors(cfg.DType)
	if err != nil {
		return nil, err
	}
	p := cfg.Plan
	if p == nil {
		p, _ = plan.New("replicated", nil)
	}
	// One allocation per kind rather than per tensor: at 100,000 tensors
	// the small ones cost more than the planning, mostly in the collector.
	nt := len(cfg.Targets)
	slab, parts := make([]job, len(served)), make([]part, len(served)*nt)
	ptrs, entries := make([]*part, len(served)*nt), make([]*protocol.Tensor, len(served)*nt)
	groups, gptrs, targets := make([]group, len(served)), make([]*group, len(served)), make([]int, len(served)*nt)
	jobs := make([]*job, len(served))
	for i, s := range served {
		j := &slab[i]
		j.s, j.part, j.entries = s, ptrs[i*nt:(i+1)*nt:(i+1)*nt], entries[i*nt:i*nt:(i+1)*nt]
		j.groups = gptrs[i : i : i+1]
		for t, tg := range cfg.Targets {
			sl, err := p.SliceFor(s.Tensor.Name, s.Tensor.Shape, cfg.Model, cfg.TPSize, tg.TPRank)
			if err != nil {
				return nil, fmt.Errorf("%w (in %s)", err, s.Shard.Path)
			}
			n := s.NBytes
			if !sl.Whole() {
				if err := splittable(s); err != nil {
					return nil, err
				}
				n, _ = safetensors.NBytes(s.DType, sl.Shape(s.Tensor.Shape))
			}
			parts[i*nt+t] = part{slice: sl, nbytes: n}
			j.part[t] = &parts[i*nt+t]
			if t == 0 {
				groups[i] = group{slice: sl, targets: targets[i*nt : i*nt+1 : (i+1)*nt]}
				targets[i*nt] = 0
				j.groups = append(j.groups, &groups[i])
			} else {
				j.addToGroup(t, sl)
			}
		}
		jobs[i] = j
	}
	return jobs, nil
}

func (j *job) addToGroup(t int, sl plan.Slice) {
	for _, g := range j.groups {
		if g.slice == sl {
			g.targets = append(g.targets, t)
			return
		}
	}
	j.groups = append(j.groups, &group{slice: sl, targets: []int{t}})
}

// splittable refuses to slice dtypes whose elements are not whole bytes.
func splittable(s checkpoint.Served) error {
	if s.Tensor.DType.Bits()%8 != 0 || s.DType.Bits()%8 != 0 {
		return fmt.Errorf("tensor %s in %s: dtype %s packs elements below a byte and cannot be split across ranks", s.Tensor.Name, s.Shard.Path, s.Tensor.DType)
	}
	return nil
}

// geometry views the tensor as [outer, row] elements where every group's
// slice is the contiguous range [start, start+len) of each row: for a
// split along dim d, a row is dims d and after. A whole tensor is one row;
// one served as stored is counted in bytes, so packed dtypes work too.
func (j *job) geometry() (outer, row, srcE, dstE int64) {
	s := j.s
	shape := s.Tensor.Shape
	srcE, dstE = int64(s.Tensor.DType.Bits()/8), int64(s.DType.Bits()/8)
	sl := j.groups[0].slice
	if sl.Whole() {
		if s.DType == s.Tensor.DType {
			srcE, dstE = 1, 1
			row = s.NBytes
		} else {
			row, _ = safetensors.NumElements(shape)
		}
		for _, g := range j.groups {
			g.start, g.len = 0, row
		}
		return 1, row, srcE, dstE
	}
	outer, inner := int64(1), int64(1)
	for _, d := range shape[:sl.Dim] {
		outer *= d
	}
	for _, d := range shape[sl.Dim+1:] {
		inner *= d
	}
	for _, g := range j.groups {
		g.start, g.len = g.slice.Start*inner, g.slice.Len*inner
	}
	return outer, shape[sl.Dim] * inner, srcE, dstE
}

// smallTensor is the size up to which a tensor may share a batch: one
// read for the lot and one write per target, where 100,000 tiny tensors
// (norms, biases, scales) would otherwise cost two syscalls each.
const smallTensor = 64 << 10

// batchable reports whether j goes whole and unconverted to every target,
// so that its bytes are the same read or written.
func (j *job) batchable() bool {
	return len(j.groups) == 1 && j.groups[0].slice.Whole() && j.s.DType == j.s.Tensor.DType && j.s.NBytes <= smallTensor
}

// batches cuts jobs, in order, into runs that lie back to back in one
// shard and in order within one segment of each target, spanning at most
// chunk bytes on either side. Any other job is a batch of its own.
func batches(jobs []*job, chunk int64) [][]*job {
	var out [][]*job
	for i := 0; i < len(jobs); {
		n := 1
		for first := jobs[i]; first.batchable() && i+n < len(jobs) && follows(first, jobs[i+n-1], jobs[i+n], chunk); n++ {
		}
		out = append(out, jobs[i:i+n])
		i += n
	}
	return out
}

// follows reports whether j can join the batch that starts at first and
// ends at prev.
func follows(first, prev, j *job, chunk int64) bool {
	s, p := j.s, prev.s
	if !j.batchable() || s.Shard != p.Shard || s.Tensor.Begin != p.Tensor.End || s.Tensor.End-first.s.Tensor.Begin > chunk {
		return false
	}
	for t, pt := range j.part {
		q := prev.part[t]
		if pt.seg != q.seg || pt.off < q.off+q.nbytes || pt.off+pt.nbytes-first.part[t].off > chunk {
			return false
		}
	}
	return true
}
