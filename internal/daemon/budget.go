package daemon

import (
	"fmt"
	"sync/atomic"
)

// inflight is the daemon's budget for request bytes being read, shared by
// every connection (protocol.Conn.SetBudget).
type inflight struct {
	limit int64
	used  atomic.Int64
}

func (b *inflight) Take(n int64) error {
	if n <= 0 {
		return nil
	}
	if used := b.used.Add(n); used > b.limit {
		b.used.Add(-n)
		return fmt.Errorf("the daemon already holds %d bytes of requests being read (limit %d)", used-n, b.limit)
	}
	return nil
}

func (b *inflight) Give(n int64) { b.used.Add(-n) }
