package commands

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"sort"
	"time"

	"github.com/weightcache/weightcache/client"
	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/sockets"
)

func init() {
	register(command{name: "attach", summary: "attach to a daemon as an engine would, and report hit or fallback", run: runAttach,
		usage: "attach --model M [flags]", fallbackGroup: "serving",
		examples: []string{
			"weightcache attach --model /models/Llama-3.1-8B --device cuda:0",
			"weightcache attach --model /models/m --fallback=false --json   # exit 3 on a miss",
			"weightcache attach --model /models/m --tensor-parallel-size 2 --tp-rank 1 --device host:1 --verify",
		}})
}

type attachResult struct {
	Source        string             `json:"source"`
	Reason        string             `json:"reason"`
	Detail        string             `json:"detail,omitempty"`
	Fields        []client.FieldDiff `json:"fields,omitempty"`
	Socket        string             `json:"socket,omitempty"`
	DaemonModel   string             `json:"daemon_model,omitempty"`
	Fix           string             `json:"fix,omitempty"`
	Tensors       int                `json:"tensors"`
	Bytes         int64              `json:"bytes"`
	AttachSeconds float64            `json:"attach_seconds"`
	TouchSeconds  float64            `json:"touch_seconds,omitempty"`
	Verified      *bool              `json:"verified,omitempty"`
	Digest        map[string]string  `json:"digest,omitempty"`
	gpuResult
}

func runAttach(ctx context.Context, e env, args []string) error {
	fs := newFlags("attach", e)
	model := fs.String("model", "", "checkpoint directory or hub model id (required)")
	mode := fs.String("mode", string(client.ZeroCopy), "zero_copy or copy")
	fallback := fs.Bool("fallback", true, "load from disk when the daemon cannot serve (false: exit 3 instead)")
	dtype := fs.String("dtype", "auto", "the engine's dtype")
	revision := fs.String("revision", "", "checkpoint revision")
	device := fs.String("device", "", "the engine's device key (default: the daemon serving --tp-rank/--dp-rank, else host)")
	group := fs.String("group", "main", "daemon group: main, or draft for the draft model")
	tpSize := fs.Int("tensor-parallel-size", 1, "the engine's tensor-parallel size")
	tpRank := fs.Int("tp-rank", 0, "the engine's tensor-parallel rank")
	dpSize := fs.Int("data-parallel-size", 1, "the engine's data-parallel size")
	dpRank := fs.Int("dp-rank", 0, "the engine's data-parallel rank")
	shardingPlan := fs.String("sharding-plan", "", "plan file for a tensor-parallel fallback on an architecture without a built-in plan")
	socketDir := fs.String("socket-dir", sockets.DefaultDir(), "directory of the daemon sockets")
	connectTimeout := fs.Duration("connect-timeout", client.DefaultConnectTimeout, "bound on connecting to the daemon")
	stateTimeout := fs.Duration("state-timeout", client.DefaultStateTimeout, "bound on waiting for a loading daemon")
	asJSON := fs.Bool("json", false, "print one JSON object")
	digest := fs.Bool("digest", false, "add the SHA-256 of every tensor's bytes as served")
	touch := fs.Bool("touch", false, "read every byte, so that mapping cost is counted")
	verify := fs.Bool("verify", false, "check every tensor against the daemon's CRC-32C")
	verifyContent := fs.Bool("verify-content", false, "accept a daemon whose checkpoint files were replaced or copied but keep the same headers, once every tensor read from this checkpoint matches the daemon's CRC-32C (reads the whole checkpoint)")
	hold := fs.Duration("hold", 0, "keep the weights (and a zero_copy lease) this long before exiting")
	engine := fs.String("engine", "", "attach the layout this engine published (with --engine-version)")
	engineVersion := fs.String("engine-version", "", "the publishing engine's version")
	reread := fs.Bool("reread", false, "after --hold, or on SIGUSR1, read every tensor again and print a second result (checks that memory outlives a dead daemon)")
	if err := parseFlags(fs, args, false); err != nil {
		return err
	}
	if *model == "" {
		return usageErrorf("--model is required")
	}
	if *mode != string(client.ZeroCopy) && *mode != string(client.Copy) {
		return usageErrorf("--mode %q: want zero_copy or copy", *mode)
	}
	if *group != "main" && *group != "draft" {
		return usageErrorf("--group %q: want main or draft", *group)
	}
	initSecs := openDevice(*device)
	start := time.Now()
	w, err := client.Attach(ctx, *model,
		client.WithMode(client.Mode(*mode)), client.WithFallback(*fallback), client.WithDType(*dtype),
		client.WithRevision(*revision), client.WithDevice(*device), client.WithSocketDir(*socketDir),
		client.WithConnectTimeout(*connectTimeout), client.WithStateTimeout(*stateTimeout),
		client.WithClientName("weightcache attach"), client.WithEngine(*engine, *engineVersion), client.WithGroup(*group),
		client.WithVerifyContent(*verifyContent),
		client.WithParallel(*tpSize, *tpRank, *dpSize, *dpRank), client.WithShardingPlan(*shardingPlan))
	var me *client.MissError
	if errors.As(err, &me) {
		if *asJSON {
			_ = json.NewEncoder(e.stdout).Encode(resultOf(me.Source, nil, time.Since(start)))
		}
		return &exitError{code: exitMiss, err: err}
	}
	if err != nil {
		return err
	}
	defer w.Close()
	res := resultOf(w.Source, w, time.Since(start))
	res.gpuResult = gpuResultOf(w, initSecs)
	checks := readChecks{touch: *touch, verify: *verify && w.Source.Hit, digest: *digest}
	if err := checks.run(e, w, &res); err != nil {
		return err
	}
	// Listen for SIGUSR1 before the result is out: whoever reads it may
	// signal at once, and SIGUSR1 would otherwise end the process.
	wake, stopWake := rereadSignal(*reread)
	defer stopWake()
	if err := report(e, res, *asJSON); err != nil {
		return err
	}
	if *reread {
		return rereadAfter(ctx, e, w, *hold, wake, checks, *asJSON)
	}
	if *hold > 0 {
		select {
		case <-time.After(*hold):
		case <-ctx.Done():
		}
	}
	return verifyErr(res)
}

func report(e env, res attachResult, asJSON bool) error {
	if asJSON {
		return json.NewEncoder(e.stdout).Encode(res)
	}
	printAttach(e, res)
	return nil
}

func verifyErr(res attachResult) error {
	if res.Verified != nil && !*res.Verified {
		return errors.New("verification failed")
	}
	return nil
}

func resultOf(src client.Source, w *client.Weights, el time.Duration) attachResult {
	r := attachResult{Source: src.Kind(), Reason: string(src.Reason), Detail: src.Detail, Fields: src.Fields,
		Socket: src.Socket, DaemonModel: src.DaemonModel, Fix: src.Fix, AttachSeconds: el.Seconds()}
	if w != nil {
		r.Tensors, r.Bytes = w.Len(), w.Bytes()
	}
	return r
}

func printAttach(e env, r attachResult) {
	if r.Source == "hit" {
		fmt.Fprintf(e.stdout, "hit: %d tensors, %s in %.2f ms from %s\n", r.Tensors, checkpoint.HumanBytes(r.Bytes), r.AttachSeconds*1e3, r.Socket)
	} else {
		src := client.Source{Reason: client.Reason(r.Reason), Detail: r.Detail, Fields: r.Fields}
		fix := ""
		if r.Fix != "" {
			fix = "; " + r.Fix
		}
		fmt.Fprintf(e.stdout, "fallback (%s): loaded %d tensors, %s from disk in %.3f s%s\n", src, r.Tensors, checkpoint.HumanBytes(r.Bytes), r.AttachSeconds, fix)
	}
	if r.TouchSeconds > 0 {
		fmt.Fprintf(e.stdout, "touched every byte in %.3f s\n", r.TouchSeconds)
	}
	if r.Verified != nil && *r.Verified {
		fmt.Fprintln(e.stdout, "verified: every tensor matches its CRC-32C")
	}
	names := make([]string, 0, len(r.Digest))
	for name := range r.Digest {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		fmt.Fprintf(e.stdout, "%s  %s\n", r.Digest[name], name)
	}
}

// touchSink keeps the compiler from dropping touchAll's reads.
var touchSink uint64

// touchAll reads every byte, the way an engine's first forward pass would;
// GPU tensors are copied to the host first.
func touchAll(w *client.Weights) error {
	var x uint64
	for t, err := range w.All() {
		if err != nil {
			return err
		}
		d, err := w.Read(t)
		if err != nil {
			return err
		}
		for ; len(d) >= 8; d = d[8:] {
			x ^= binary.LittleEndian.Uint64(d)
		}
		for _, b := range d {
			x ^= uint64(b)
		}
	}
	touchSink = x
	return nil
}

func verifyAll(w *client.Weights) (bool, string, error) {
	for t, err := range w.All() {
		if err != nil {
			return false, "", err
		}
		d, err := w.Read(t)
		if err != nil {
			return false, t.Name, err
		}
		if crc32.Checksum(d, checkpoint.Castagnoli) != t.CRC32C {
			return false, t.Name, nil
		}
	}
	return true, "", nil
}
