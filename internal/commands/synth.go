package commands

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/weightcache/weightcache/internal/checkpoint"
)

func init() {
	register(command{
		name:    "synth",
		summary: "write a synthetic Llama-shaped checkpoint (tiny, small, medium, large)",
		run:     runSynth,
		usage:   "synth --out DIR [flags]",
		examples: []string{
			"weightcache synth --preset small --out /tmp/llama-small",
			"weightcache synth --preset medium --shards 4 --dtype f16 --out /tmp/llama-medium",
		},
	})
}

func runSynth(ctx context.Context, e env, args []string) error {
	fs := newFlags("synth", e)
	presets := strings.Join(checkpoint.SynthPresets(), "|")
	preset := fs.String("preset", "tiny", "model size: "+presets)
	out := fs.String("out", "", "output directory; must not exist or be empty (required)")
	shards := fs.Int("shards", 1, "number of safetensors shards")
	dtype := fs.String("dtype", "bf16", "tensor dtype: bf16|f16|f32")
	tensors := fs.Int("tensors", 0, "instead of a preset: this many tiny (8x8 bf16) mixture-of-experts tensors, for per-tensor costs")
	if err := parseFlags(fs, args, false); err != nil {
		return err
	}
	if *out == "" {
		return usageErrorf("--out is required")
	}
	if !strings.Contains("|"+presets+"|", "|"+*preset+"|") {
		return usageErrorf("unknown --preset %q: want %s", *preset, presets)
	}
	if _, err := checkpoint.NormalizeDType(*dtype); err != nil || *dtype == "" || *dtype == "auto" {
		return usageErrorf("unknown --dtype %q: want bf16|f16|f32", *dtype)
	}
	if *shards < 1 {
		return usageErrorf("--shards %d: want at least 1", *shards)
	}
	start := time.Now()
	if *tensors > 0 {
		if err := checkpoint.SynthMany(ctx, *out, *tensors, *shards); err != nil {
			return err
		}
	} else if err := checkpoint.SynthContext(ctx, *out, *preset, *shards, *dtype); err != nil {
		return err
	}
	secs := time.Since(start).Seconds()
	// Resolving what was written validates it and gives the counts.
	c, err := checkpoint.Resolve(*out, "")
	if err != nil {
		return fmt.Errorf("checking the written checkpoint: %w", err)
	}
	fmt.Fprintf(e.stdout, "synth: wrote %s: %d tensors, %d bytes in %d shards, %.2fs\n",
		c.Dir, c.NumTensors(), c.Size(), len(c.Shards), secs)
	return nil
}
