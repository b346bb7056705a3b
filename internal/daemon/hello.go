package daemon

import (
	"fmt"

	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/protocol"
)

func (d *Daemon) hello(s *session, fr *protocol.Frame) (reply, error) {
	var h protocol.Hello
	if err := fr.Decode(&h); err != nil {
		d.count(protocol.ResultError, nil)
		return reply{}, err
	}
	if s.hello != nil {
		return reply{}, protocol.Errorf(protocol.CodeBadRequest, "hello sent twice on one connection")
	}
	if err := helloFieldTooLong(&h); err != nil {
		d.count(protocol.ResultError, nil)
		d.log.Warn("hello refused", "err", err, "client", clip(h.Client))
		return reply{}, protocol.Errorf(protocol.CodeBadRequest, "%v", err)
	}
	if h.Mode != protocol.ModeZeroCopy && h.Mode != protocol.ModeCopy {
		d.count(protocol.ResultError, nil)
		return reply{}, protocol.Errorf(protocol.CodeBadRequest, "hello: field mode is %s, want %s or %s", quote(h.Mode), protocol.ModeZeroCopy, protocol.ModeCopy)
	}
	d.mu.Lock()
	state := d.state
	d.mu.Unlock()
	if state == stateDraining {
		d.count(protocol.ResultDraining, nil)
		return reply{}, protocol.Errorf(protocol.CodeDraining, "daemon on %s is draining", d.ln.path)
	}
	dev := d.cfg.Backend.Device()
	if h.Device != dev {
		diff := []checkpoint.FieldDiff{{Field: "device", Want: h.Device, Got: dev}}
		d.count(protocol.ResultDeviceMismatch, diff)
		d.log.Info("hello refused: device differs", "client", clip(h.Client), "want", clip(h.Device), "have", dev)
		return reply{}, mismatch(diff)
	}
	if diff := d.fingerprintDiff(h.Fingerprint); len(diff) > 0 {
		d.count(protocol.ResultMismatch, diff)
		d.log.Info("hello refused: fingerprint differs", "client", clip(h.Client), "fields", diffFields(diff))
		return reply{}, mismatch(diff)
	}
	s.hello = &h
	if l := d.served(); l != nil {
		return reply{msg: l.hello}, nil
	}
	s.early = true
	return reply{msg: protocol.OK{Head: protocol.NewHead(protocol.TypeOK), State: string(state), Device: dev, Daemon: Version(), Outcomes: true}}, nil
}

// helloFieldTooLong names the first string field of h over MaxFieldBytes;
// the fingerprint's fields come from its one list (checkpoint.Fingerprint).
func helloFieldTooLong(h *protocol.Hello) error {
	for _, f := range []struct{ name, value string }{
		{"device", h.Device}, {"mode", h.Mode}, {"client", h.Client},
	} {
		if len(f.value) > MaxFieldBytes {
			return fmt.Errorf("hello: field %s is %d bytes, over the limit of %d", f.name, len(f.value), MaxFieldBytes)
		}
	}
	if err := h.Fingerprint.CheckLengths(MaxFieldBytes); err != nil {
		return fmt.Errorf("hello: %w", err)
	}
	return nil
}
