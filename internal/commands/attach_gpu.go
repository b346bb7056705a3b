package commands

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/weightcache/weightcache/client"
	"github.com/weightcache/weightcache/internal/backend/cuda"
)

// gpuResult is what attach adds to its result for GPU weights.
type gpuResult struct {
	Device            string  `json:"device,omitempty"`
	ReadOnly          bool    `json:"read_only,omitempty"`
	DriverInitSeconds float64 `json:"driver_init_seconds,omitempty"`
	Reread            bool    `json:"reread,omitempty"`
}

// openDevice starts the CUDA driver before the attach clock starts, as an
// engine that already runs CUDA would have, and returns how long that took.
// A failure is left to Attach, which reports it as the miss's reason.
func openDevice(key string) float64 {
	if !cuda.IsDevice(key) {
		return 0
	}
	t0 := time.Now()
	_, _ = client.PrepareDevice(key)
	return time.Since(t0).Seconds()
}

func gpuResultOf(w *client.Weights, initSecs float64) gpuResult {
	return gpuResult{Device: w.Device, ReadOnly: w.ReadOnly, DriverInitSeconds: initSecs}
}

// readChecks are attach's checks that read every tensor's bytes.
type readChecks struct{ touch, verify, digest bool }

func (c readChecks) run(e env, w *client.Weights, res *attachResult) error {
	if c.touch {
		t0 := time.Now()
		if err := touchAll(w); err != nil {
			return err
		}
		res.TouchSeconds = time.Since(t0).Seconds()
	}
	if c.verify {
		ok, bad, err := verifyAll(w)
		if err != nil {
			return err
		}
		res.Verified = &ok
		if !ok {
			fmt.Fprintf(e.stderr, "tensor %s does not match its CRC-32C\n", bad)
		}
	}
	if c.digest {
		res.Digest = make(map[string]string, w.Len())
		for t, err := range w.All() {
			if err != nil {
				return err
			}
			d, err := w.Read(t)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(d)
			res.Digest[t.Name] = hex.EncodeToString(sum[:])
		}
	}
	return nil
}

// rereadAfter waits for hold to pass or for SIGUSR1, then runs the checks
// again on the same mappings and reports a second result. It is how
// gpu-check.sh shows that a zero_copy engine's memory outlives a daemon
// killed in between.
func rereadAfter(ctx context.Context, e env, w *client.Weights, hold time.Duration, usr1 <-chan os.Signal, c readChecks, asJSON bool) error {
	select {
	case <-time.After(hold):
	case <-usr1:
	case <-ctx.Done():
		return ctx.Err()
	}
	res := attachResult{Source: w.Source.Kind(), Tensors: w.Len(), Bytes: w.Bytes(), gpuResult: gpuResult{Device: w.Device, Reread: true}}
	if err := c.run(e, w, &res); err != nil {
		return fmt.Errorf("reread: %w", err)
	}
	if err := report(e, res, asJSON); err != nil {
		return err
	}
	return verifyErr(res)
}

// rereadSignal starts catching SIGUSR1 when on.
func rereadSignal(on bool) (<-chan os.Signal, func()) {
	c := make(chan os.Signal, 1)
	if !on {
		return c, func() {}
	}
	signal.Notify(c, syscall.SIGUSR1)
	return c, func() { signal.Stop(c) }
}
