package commands

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/weightcache/weightcache/client"
	"github.com/weightcache/weightcache/internal/checkpoint"
)

func init() {
	register(command{name: "demo", summary: "cold start, restart through the daemon, and a deliberate mismatch, timed", run: runDemo,
		examples: []string{
			"weightcache demo                        # a synthesized 105 MiB Llama (--preset small)",
			"weightcache demo --model /models/Llama-3.1-8B",
			"weightcache demo --preset medium        # 1.2 GiB",
		}})
}

func runDemo(ctx context.Context, e env, args []string) error {
	fs := newFlags("demo", e)
	model := fs.String("model", "", "checkpoint directory or hub model id to use (default: a synthesized Llama of --preset)")
	preset := fs.String("preset", "small", "synth preset when --model is not given: "+strings.Join(checkpoint.SynthPresets(), ", "))
	if err := parseFlags(fs, args, false); err != nil {
		return err
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
	sockets := filepath.Join(work, "sockets")
	// attach times client.Attach and, with touch, reading every byte after
	// it, the way an engine's first forward pass would.
	attach := func(touch bool, opts ...client.Opt) (client.Source, time.Duration, int, error) {
		start := time.Now()
		w, err := client.Attach(ctx, *model, append([]client.Opt{client.WithSocketDir(sockets), client.WithClientName("weightcache demo")}, opts...)...)
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

	fmt.Fprintln(e.stdout, "2. cold start: the engine loads from disk (no daemon yet)")
	if err := os.Mkdir(sockets, 0o700); err != nil {
		return err
	}
	coldSrc, cold, n, err := attach(false)
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "   %s, %d tensors in %s\n", coldSrc, n, cold.Round(time.Microsecond))

	fmt.Fprintln(e.stdout, "3. weightcache preload, in the background")
	stop, ready, err := startPreload(ctx, *model, sockets)
	if err != nil {
		return err
	}
	defer stop()
	fmt.Fprintf(e.stdout, "   ready in %.3f s: %v tensors, %s on %v\n", ready.LoadSeconds, ready.Tensors, humanBytes(ready.Bytes), ready.Socket)

	fmt.Fprintln(e.stdout, "4. restart through the daemon: attach (zero_copy)")
	hitSrc, hit, n, err := attach(false)
	if err != nil {
		return err
	}
	if !hitSrc.Hit {
		return fmt.Errorf("expected a hit, got %s", hitSrc)
	}
	fmt.Fprintf(e.stdout, "   hit, %d tensors in %s\n", n, hit.Round(time.Microsecond))
	_, hitTouch, _, err := attach(true)
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "   again, reading every byte of the mapped weights: %s\n", hitTouch.Round(time.Microsecond))

	fmt.Fprintf(e.stdout, "5. deliberate mismatch: attach with --dtype %s\n", other)
	missSrc, mis, _, err := attach(false, client.WithDType(other))
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "   fallback: %s, loaded from disk in %s\n", missSrc, mis.Round(time.Microsecond))

	fmt.Fprintln(e.stdout, "6. weightcache status")
	if err := runStatus(ctx, e, []string{"--socket-dir", sockets}); err != nil {
		return err
	}
	fmt.Fprintln(e.stdout, "7. stop the daemon (SIGTERM)")
	if err := stop(); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "\n%s, %d tensors, %s (page cache warm: cold start is the best case for disk)\n", *model, ready.Tensors, humanBytes(ready.Bytes))
	printBars(e.stdout, []bar{
		{"cold start (load from disk)", cold, ""},
		{"restart through the daemon (hit)", hit, fmt.Sprintf("%.0fx faster", float64(cold)/float64(hit))},
		{"hit, then read every byte", hitTouch, fmt.Sprintf("%.1fx faster", float64(cold)/float64(hitTouch))},
		{"mismatch (dtype): fallback", mis, "reason: " + string(missSrc.Reason)},
	})
	fmt.Fprintf(e.stdout, "\nrestart/cold: %.4f\nOn your own model: weightcache demo --model /path/to/checkpoint (or a hub id in the local cache)\n", float64(hit)/float64(cold))
	return nil
}

type bar struct {
	label string
	d     time.Duration
	note  string
}

// printBars draws one horizontal bar per timing, scaled to the longest, in
// eighths of a character so that short bars still show.
func printBars(w io.Writer, bars []bar) {
	const width = 40
	var longest time.Duration
	for _, b := range bars {
		longest = max(longest, b.d)
	}
	for _, b := range bars {
		eighths := 1
		if longest > 0 {
			eighths = max(1, int(float64(b.d)/float64(longest)*width*8+0.5))
		}
		s := strings.Repeat("█", eighths/8)
		if r := eighths % 8; r > 0 {
			s += string([]rune("▏▎▍▌▋▊▉")[r-1])
		}
		fmt.Fprintf(w, "%-34s %11s  %-*s %s\n", b.label, b.d.Round(time.Microsecond), width, s, b.note)
	}
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
