package commands

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/weightcache/weightcache/client"
	"github.com/weightcache/weightcache/internal/checkpoint"
)

func init() {
	register(command{name: "demo", summary: "cold start against attach through the daemon, N alternating runs, and a deliberate mismatch, timed", run: runDemo,
		examples: []string{
			"weightcache demo                        # a synthesized 105 MiB Llama (--preset small)",
			"weightcache demo --model /models/Llama-3.1-8B --repeat 3",
			"weightcache demo --preset medium        # 1.2 GiB",
		}})
}

// demoRun is one measured kind of start, repeated.
type demoRun struct {
	label string
	times []time.Duration
}

func runDemo(ctx context.Context, e env, args []string) error {
	fs := newFlags("demo", e)
	model := fs.String("model", "", "checkpoint directory or hub model id to use (default: a synthesized Llama of --preset)")
	preset := fs.String("preset", "small", "synth preset when --model is not given: "+strings.Join(checkpoint.SynthPresets(), ", "))
	repeat := fs.Int("repeat", 5, "runs of each kind, alternating, after one warm-up run that is not counted")
	if err := parseFlags(fs, args, false); err != nil {
		return err
	}
	if *repeat < 1 {
		return usageErrorf("--repeat must be at least 1, got %d", *repeat)
	}
	work, err := os.MkdirTemp("", "weightcache-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	if *model == "" {
		*model = filepath.Join(work, "model")
		fmt.Fprintf(e.stdout, "1. synth --preset %s -> %s\n", *preset, *model)
		if err := checkpoint.Synth(*model, *preset, 2, "bf16"); err != nil {
			return err
		}
	}
	ckpt, err := checkpoint.Resolve(*model, "")
	if err != nil {
		return err
	}
	served, err := ckpt.ServedDType("")
	if err != nil {
		return err
	}
	other := "float32"
	if served == "float32" {
		other = "float16"
	}
	// The daemon serves in sockets; nothing serves in none, so an engine
	// looking there starts cold, from disk, exactly as without weightcache.
	sockets, none := filepath.Join(work, "sockets"), filepath.Join(work, "none")
	for _, d := range []string{sockets, none} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return err
		}
	}
	// attach times client.Attach and, with touch, reading every byte after
	// it, the way an engine's first forward pass would.
	attach := func(dir string, touch bool, opts ...client.Opt) (client.Source, time.Duration, int, error) {
		start := time.Now()
		w, err := client.Attach(ctx, *model, append([]client.Opt{client.WithSocketDir(dir), client.WithClientName("weightcache demo")}, opts...)...)
		if err != nil {
			return client.Source{}, 0, 0, err
		}
		defer w.Close()
		if touch {
			if err := touchAll(w); err != nil {
				return client.Source{}, 0, 0, err
			}
		}
		return w.Source, time.Since(start), w.Len(), nil
	}

	fmt.Fprintln(e.stdout, "2. weightcache preload, in the background")
	stop, ready, err := startPreload(ctx, *model, sockets)
	if err != nil {
		return err
	}
	defer stop()
	fmt.Fprintf(e.stdout, "   ready in %.3f s: %v tensors, %s on %v\n", ready.LoadSeconds, ready.Tensors, checkpoint.HumanBytes(ready.Bytes), ready.Socket)

	fmt.Fprintf(e.stdout, "3. %d runs of each, alternating (one warm-up first, not counted):\n", *repeat)
	runs := []demoRun{{label: "cold start (load from disk)"}, {label: "attach through the daemon (hit)"}, {label: "attach, then read every byte"},
		{label: "floor: read() into fresh memory"}}
	for i := 0; i <= *repeat; i++ {
		for k := range runs {
			if k == 3 {
				d, err := readFloor(ckpt)
				if err != nil {
					return err
				}
				if i > 0 {
					runs[k].times = append(runs[k].times, d)
				}
				continue
			}
			src, d, n, err := attach(map[bool]string{true: none, false: sockets}[k == 0], k == 2)
			if err != nil {
				return err
			}
			if hit := k > 0; src.Hit != hit {
				return fmt.Errorf("%s: got %s", runs[k].label, src)
			}
			if i == 0 {
				fmt.Fprintf(e.stdout, "   %s: %s, %d tensors\n", runs[k].label, src.Kind(), n)
				continue
			}
			runs[k].times = append(runs[k].times, d)
		}
	}

	fmt.Fprintf(e.stdout, "4. deliberate mismatch: attach with --dtype %s\n", other)
	missSrc, mis, _, err := attach(sockets, false, client.WithDType(other))
	if err != nil {
		return err
	}
	missSrc.Fix = "" // the demo asked for the mismatch
	fmt.Fprintf(e.stdout, "   fallback: %s; loaded from disk (and converted) in %s\n", missSrc, mis.Round(time.Microsecond))

	fmt.Fprintln(e.stdout, "5. weightcache status")
	if err := runStatus(ctx, e, []string{"--socket-dir", sockets}); err != nil {
		return err
	}
	fmt.Fprintln(e.stdout, "6. stop the daemon (SIGTERM)")
	if err := stop(); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "\n%s, %d tensors, %s; median (min-max) of %d runs each, page cache warm (the best case for disk)\n",
		*model, ready.Tensors, checkpoint.HumanBytes(ready.Bytes), *repeat)
	bars := make([]bar, len(runs))
	for i, r := range runs {
		med, lo, hi := spread(r.times)
		bars[i] = bar{r.label, med, fmt.Sprintf("(%s-%s)", lo.Round(time.Microsecond), hi.Round(time.Microsecond))}
	}
	printBars(e.stdout, bars)
	fmt.Fprintf(e.stdout, "\nattach through the daemon takes 1/%.0f of a cold start (medians); attach, then read every byte, %.2fx the floor\n",
		float64(bars[0].d)/float64(bars[1].d), float64(bars[2].d)/float64(bars[3].d))
	fmt.Fprintln(e.stdout, "This times the weights' way into the engine's process: an engine's own start (imports, graph capture, KV cache) comes on top of both.")
	fmt.Fprintln(e.stdout, "On your own model: weightcache demo --model /path/to/checkpoint (or a hub id in the local cache)")
	return nil
}

// readFloor times read() of the checkpoint's tensor bytes from the page
// cache into fresh memory: what no way of getting the bytes into a process
// beats by much, the floor the other rows are held to.
func readFloor(ckpt *checkpoint.Checkpoint) (time.Duration, error) {
	var total int64
	for _, s := range ckpt.Shards {
		total += s.Size - s.DataStart
	}
	start := time.Now()
	buf := make([]byte, total)
	off := int64(0)
	for _, s := range ckpt.Shards {
		f, err := os.Open(s.Path)
		if err != nil {
			return 0, err
		}
		n := s.Size - s.DataStart
		_, err = f.ReadAt(buf[off:off+n], s.DataStart)
		f.Close()
		if err != nil {
			return 0, fmt.Errorf("%s: %w", s.Path, err)
		}
		off += n
	}
	return time.Since(start), nil
}

// spread is the median, the shortest and the longest of ds.
func spread(ds []time.Duration) (med, lo, hi time.Duration) {
	s := slices.Sorted(slices.Values(ds))
	n := len(s)
	med = s[n/2]
	if n%2 == 0 {
		med = (s[n/2-1] + s[n/2]) / 2
	}
	return med, s[0], s[n-1]
}

type bar struct {
	label string
	d     time.Duration
	note  string
}

// printBars draws one horizontal bar per timing on a log scale, with a
// decade axis under them: a hit is a hundredth of a cold start, and on a
// linear scale it would be a sliver. The scale starts a decade below the
// shortest bar so that it still has length.
func printBars(w io.Writer, bars []bar) {
	const width = 40
	shortest, longest := time.Duration(math.MaxInt64), time.Duration(1)
	for _, b := range bars {
		shortest, longest = min(shortest, max(b.d, time.Microsecond)), max(longest, b.d)
	}
	lo := math.Pow(10, math.Floor(math.Log10(float64(shortest)))-1)
	span := math.Log10(float64(longest) / lo)
	col := func(d float64) int { return int(math.Round(math.Log10(d/lo) / span * width)) }
	for _, b := range bars {
		n := max(1, col(float64(max(b.d, time.Microsecond))))
		fmt.Fprintf(w, "%-34s %11s  %-*s %s\n", b.label, b.d.Round(time.Microsecond), width, strings.Repeat("█", n), b.note)
	}
	// The axis: a tick and a label at every decade.
	axis, labels := []rune(strings.Repeat("─", width+1)), []rune(strings.Repeat(" ", width+12))
	for d := lo; d <= float64(longest)*1.0001; d *= 10 {
		c := col(d)
		axis[c] = '┴'
		copy(labels[c:], []rune(time.Duration(d).String()))
	}
	fmt.Fprintf(w, "%-34s %11s  %s\n%-34s %11s  %s\n", "", "", string(axis), "(log scale)", "", strings.TrimRight(string(labels), " "))
}

// startPreload runs `weightcache preload` as its own process, as an operator
// would, and waits for its ready line. stop sends SIGTERM and waits.
func startPreload(ctx context.Context, model, sockets string) (stop func() error, ready *readyLine, err error) {
	self, err := os.Executable()
	if err != nil {
		return nil, nil, err
	}
	cmd := exec.Command(self, "preload", "--model", model, "--socket-dir", sockets, "--devices", "host")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, err
	}
	var once bool
	stop = func() error {
		if once {
			return nil
		}
		once = true
		_ = cmd.Process.Signal(syscall.SIGTERM)
		if err := cmd.Wait(); err != nil {
			return fmt.Errorf("preload: %w", err)
		}
		return nil
	}
	lines := make(chan *readyLine, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var r readyLine
			if json.Unmarshal(sc.Bytes(), &r) == nil && r.Event == "ready" {
				lines <- &r
			}
		}
		close(lines)
	}()
	select {
	case m, ok := <-lines:
		if ok {
			return stop, m, nil
		}
		_ = stop()
		return nil, nil, fmt.Errorf("preload exited before it was ready: %s", bytes.TrimSpace(stderr.Bytes()))
	case <-time.After(5 * time.Minute):
		err = errors.New("preload not ready after 5 minutes")
	case <-ctx.Done():
		err = ctx.Err()
	}
	_ = stop()
	return nil, nil, err
}
