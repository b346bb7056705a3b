package commands

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/models"
	"github.com/weightcache/weightcache/internal/sockets"
)

func init() {
	register(command{name: "load", summary: "make a model resident in a socket directory weightcache serve manages", run: runLoad,
		usage: "load --model M [--revision R] [flags]", fallbackGroup: "serving",
		examples: []string{
			"weightcache load --model /models/llama-8b-v2",
			"weightcache load --model Qwen/Qwen3-8B --revision main --dtype bfloat16",
			"weightcache load --model /models/llama-8b --publish-only --engine trainer --engine-version step-200",
		}})
}

// controlFlags are what load and drop share: which model, which serve.
type controlFlags struct {
	spec      models.Spec
	socketDir string
	asJSON    bool
}

func (c *controlFlags) register(fs interface {
	StringVar(*string, string, string, string)
	BoolVar(*bool, string, bool, string)
}) {
	fs.StringVar(&c.spec.Model, "model", "", "checkpoint directory or hub model id (required)")
	fs.StringVar(&c.spec.Revision, "revision", "", "checkpoint revision (hub cache: branch, tag or commit)")
	fs.StringVar(&c.socketDir, "socket-dir", sockets.DefaultDir(), "the socket directory weightcache serve manages")
	fs.BoolVar(&c.asJSON, "json", false, "print the reply as one JSON line")
	fs.StringVar(&c.spec.Engine, "engine", "", "with --publish-only: the engine (or trainer) whose published layout the model is")
	fs.StringVar(&c.spec.EngineVersion, "engine-version", "", "with --publish-only: that engine's version, or the version of the weights a trainer pushes")
}

func runLoad(ctx context.Context, e env, args []string) error {
	var c controlFlags
	fs := newFlags("load", e)
	c.register(fs)
	fs.StringVar(&c.spec.DType, "dtype", "auto", "serve the tensors stored in the checkpoint's weight dtype in this one, as preload's --dtype")
	fs.StringVar(&c.spec.Devices, "devices", "", "devices to serve it on, as preload's --devices (default: serve's --devices); the budget is each device's")
	fs.IntVar(&c.spec.TPSize, "tensor-parallel-size", 0, "its tensor-parallel size, one rank per device of --devices, which it then needs (default: serve's)")
	fs.BoolVar(&c.spec.PublishOnly, "publish-only", false, "stage an empty model that the engine named by --engine and --engine-version publishes into (a trainer's pushed version: weightcache.push); it is never evicted, only dropped")
	if err := parseFlags(fs, args, false); err != nil {
		return err
	}
	if c.spec.Model == "" {
		return usageErrorf("--model is required")
	}
	rep, err := models.Ask(ctx, c.socketDir, models.Request{Op: "load", Spec: c.spec})
	if err != nil {
		if errors.Is(err, models.ErrNoRoom) {
			return &exitError{code: exitFail, err: err}
		}
		return err
	}
	l := rep.Loaded
	if c.asJSON {
		return json.NewEncoder(e.stdout).Encode(l)
	}
	for _, v := range l.Evicted {
		fmt.Fprintf(e.stdout, "evicted %s (least recently used, no lease)\n", v)
	}
	for _, v := range l.Moved {
		fmt.Fprintf(e.stdout, "moved %s to the host tier\n", v)
	}
	what := "loaded"
	switch {
	case l.Already:
		what = "already resident"
	case l.PublishOnly:
		fmt.Fprintf(e.stdout, "staged %s for %s %s to publish into; engines attach it with --socket-dir %s and that engine and version\n",
			c.spec.Model, c.spec.Engine, c.spec.EngineVersion, c.socketDir)
		return nil
	}
	fmt.Fprintf(e.stdout, "%s %s on %s: %d tensors, %s on each device, in %.2f s; engines attach with --socket-dir %s\n",
		what, c.spec.Model, l.Devices, l.Tensors, checkpoint.HumanBytes(l.Bytes), l.LoadSeconds, c.socketDir)
	return nil
}
