package commands

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/weightcache/weightcache/client"
	"github.com/weightcache/weightcache/internal/sockets"
)

func init() {
	register(command{
		name:    "publish",
		summary: "publish a checkpoint's tensors into a --publish-only daemon as an engine would (a smoke test of the publish path)",
		run:     runPublish,
		usage:   "publish --model M --engine NAME [flags]",
		examples: []string{
			"weightcache publish --model /tmp/llama-small --engine smoke --engine-version 1   # into: weightcache preload --model /tmp/llama-small --publish-only",
		},
	})
}

type publishResult struct {
	Tensors        int     `json:"tensors"`
	Bytes          int64   `json:"bytes"`
	PublishSeconds float64 `json:"publish_seconds"` // claim, write every byte, commit
}

// runPublish reads the checkpoint from disk, as an engine that processed
// nothing would hold it, and publishes every tensor under --engine.
func runPublish(ctx context.Context, e env, args []string) error {
	fs := newFlags("publish", e)
	model := fs.String("model", "", "checkpoint directory or hub model id (required)")
	revision := fs.String("revision", "", "checkpoint revision")
	device := fs.String("device", "", "the engine's device key (default: the daemon serving --tp-rank/--dp-rank, else host)")
	engine := fs.String("engine", "", "the publishing engine's name (required)")
	engineVersion := fs.String("engine-version", "", "the publishing engine's version")
	socketDir := fs.String("socket-dir", sockets.DefaultDir(), "directory of the daemon sockets")
	asJSON := fs.Bool("json", false, "print one JSON object")
	if err := parseFlags(fs, args, false); err != nil {
		return err
	}
	if *model == "" || *engine == "" {
		return usageErrorf("--model and --engine are required")
	}
	// No daemon in an empty directory: the tensors as stored, from disk.
	empty, err := os.MkdirTemp("", "weightcache-publish-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(empty)
	disk, err := client.Attach(ctx, *model, client.WithRevision(*revision), client.WithSocketDir(empty))
	if err != nil {
		return err
	}
	defer disk.Close()
	ts, err := disk.Tensors()
	if err != nil {
		return err
	}
	specs := make([]client.TensorSpec, len(ts))
	for i, t := range ts {
		specs[i] = client.TensorSpec{Name: t.Name, DType: t.DType, Shape: t.Shape}
	}
	start := time.Now()
	p, err := client.Publish(ctx, *model, specs, client.WithRevision(*revision), client.WithDevice(*device),
		client.WithSocketDir(*socketDir), client.WithEngine(*engine, *engineVersion), client.WithClientName("weightcache publish"))
	if err != nil {
		return err
	}
	res := publishResult{Tensors: len(ts)}
	for _, t := range ts {
		if err := p.Write(t.Name, t.Data); err != nil {
			_ = p.Close()
			return err
		}
		res.Bytes += int64(len(t.Data))
	}
	if err := p.Commit(ctx); err != nil {
		return err
	}
	res.PublishSeconds = time.Since(start).Seconds()
	if *asJSON {
		return json.NewEncoder(e.stdout).Encode(res)
	}
	_, err = fmt.Fprintf(e.stdout, "published %d tensors, %d bytes in %.3f s\n", res.Tensors, res.Bytes, res.PublishSeconds)
	return err
}
