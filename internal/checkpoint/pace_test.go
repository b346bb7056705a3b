package checkpoint

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

func TestPacer(t *testing.T) {
	var read atomic.Int64
	free := Pacer{Read: &read, Start: time.Now()}
	free.Add(context.Background(), 1<<30)
	if read.Load() != 1<<30 {
		t.Fatalf("read = %d", read.Load())
	}
	// 1 MiB at 1 MiB/s is due a second after start: a reader that got
	// there at once waits, and an ended context cuts the wait short.
	read.Store(0)
	slow := Pacer{Rate: 1 << 20, Read: &read, Start: time.Now()}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	start := time.Now()
	slow.Add(ctx, 1<<20)
	if el := time.Since(start); el < 15*time.Millisecond || el > 900*time.Millisecond {
		t.Fatalf("paced read returned after %v, want about 20ms (the context's end)", el)
	}
}
