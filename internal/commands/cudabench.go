package commands

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/weightcache/weightcache/internal/backend/cuda"
	"github.com/weightcache/weightcache/internal/checkpoint"
)

func init() {
	register(command{name: "cuda-bench", hidden: true, summary: "measure host-to-device bandwidth on the bytes of a checkpoint", run: runCUDABench,
		examples: []string{"weightcache cuda-bench --model /tmp/llama-medium --device cuda:0"}})
}

// benchResult is cuda-bench's output: the baselines a GPU preload is
// compared with, on the same bytes.
type benchResult struct {
	Device       string  `json:"device"`
	Name         string  `json:"name"`
	Bytes        int64   `json:"bytes"`
	PageableGBps float64 `json:"pageable_gbps"` // plain cuMemcpyHtoD of the files' bytes from ordinary memory
	PinnedGBps   float64 `json:"pinned_gbps"`   // async copies from one pinned buffer: the link's ceiling
}

func runCUDABench(ctx context.Context, e env, args []string) error {
	fs := newFlags("cuda-bench", e)
	model := fs.String("model", "", "checkpoint whose shard files are copied (required)")
	device := fs.String("device", "cuda:0", "GPU: GPU-<uuid> or cuda:N")
	var chunk int64
	bytesVar(fs, &chunk, "pinned-chunk", 64<<20, "pinned buffer size for the ceiling measurement")
	if err := parseFlags(fs, args, false); err != nil {
		return err
	}
	if *model == "" {
		return usageErrorf("--model is required")
	}
	ckpt, err := checkpoint.Resolve(*model, "")
	if err != nil {
		return err
	}
	var bufs [][]byte
	for _, s := range ckpt.Shards {
		b, err := os.ReadFile(s.Path)
		if err != nil {
			return err
		}
		bufs = append(bufs, b)
	}
	d, err := cuda.Open(*device)
	if err != nil {
		return err
	}
	return errors.Join(benchDevice(e, d, bufs, chunk), d.Close())
}

func benchDevice(e env, d *cuda.Device, bufs [][]byte, chunk int64) error {
	// One untimed round first: the first copies pay for driver set-up.
	if _, err := d.CopyPinned(chunk, chunk); err != nil {
		return err
	}
	pageable, err := d.CopyPageable(bufs)
	if err != nil {
		return err
	}
	pinned, err := d.CopyPinned(pageable.Bytes, chunk)
	if err != nil {
		return err
	}
	res := benchResult{Device: d.UUID, Name: d.Name, Bytes: pageable.Bytes, PageableGBps: pageable.GBps(), PinnedGBps: pinned.GBps()}
	if err := json.NewEncoder(e.stdout).Encode(res); err != nil {
		return fmt.Errorf("write result: %w", err)
	}
	return nil
}
