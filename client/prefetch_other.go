//go:build !linux

package client

// prefetch is not supported on this platform: reads fault pages in.
type prefetch struct{}

func startPrefetch([][]byte) *prefetch { return nil }

// Stop does nothing here.
func (p *prefetch) Stop() {}
