package commands

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/models"
)

func init() {
	register(command{name: "drop", summary: "free a model weightcache serve holds", run: runDrop,
		usage: "drop --model M [--revision R] [--force]", fallbackGroup: "serving",
		examples: []string{"weightcache drop --model /models/llama-8b-v1"}})
}

func runDrop(ctx context.Context, e env, args []string) error {
	var c controlFlags
	fs := newFlags("drop", e)
	c.register(fs)
	force := fs.Bool("force", false, "drop a model engines hold leases on: they get the drain timeout")
	whenUnused := fs.Bool("when-unused", false, "drop it once its last lease ends, at once if it has none (a version engines switched away from); a load of it before then keeps it")
	if err := parseFlags(fs, args, false); err != nil {
		return err
	}
	if c.spec.Model == "" {
		return usageErrorf("--model is required")
	}
	if *force && *whenUnused {
		return usageErrorf("--force and --when-unused: one drops now whatever the leases, the other once they end")
	}
	rep, err := models.Ask(ctx, c.socketDir, models.Request{Op: "drop", Spec: c.spec, Force: *force, WhenUnused: *whenUnused})
	if err != nil {
		return err
	}
	if c.asJSON {
		return json.NewEncoder(e.stdout).Encode(rep.Dropped)
	}
	if rep.Dropped.DropWhenUnused {
		fmt.Fprintf(e.stdout, "dropping %s once its last lease ends (%d now)\n", c.spec.Model, rep.Dropped.Leases)
		return nil
	}
	fmt.Fprintf(e.stdout, "dropped %s: %s freed on each device\n", c.spec.Model, checkpoint.HumanBytes(rep.Dropped.Bytes))
	return nil
}
