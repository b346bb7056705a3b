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
	// Reads that are not ahead of the rate do not wait (a wait here
	// would hang the test, not slow it).
	read.Store(0)
	behind := Pacer{Rate: 1 << 20, Read: &read, Start: time.Now().Add(-time.Hour)}
	behind.Add(context.Background(), 1<<20)

	// 3600 bytes at 1 byte/s are due in an hour: the reader waits until
	// its context ends, and no sooner.
	read.Store(0)
	ahead := Pacer{Rate: 1, Read: &read, Start: time.Now()}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		ahead.Add(ctx, 3600)
		close(done)
	}()
	for read.Load() != 3600 {
		time.Sleep(time.Millisecond) // until the reader has counted its bytes
	}
	select {
	case <-done:
		t.Fatal("a read an hour ahead of its rate did not wait")
	default:
	}
	cancel()
	<-done
}
