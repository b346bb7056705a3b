package client

import (
	"context"
	"fmt"
	"io"
	"slices"

	"github.com/weightcache/weightcache/internal/checkpoint"
)

// WithVerifyContent accepts a daemon whose checkpoint files have another
// stat identity than the engine's (replaced, rewritten or copied) but the
// same headers, once the CRC-32C of every tensor read from the engine's
// files equals the daemon's. It reads the whole checkpoint. Without it,
// such a daemon is a ReasonCheckpointChanged miss.
func WithVerifyContent(on bool) Opt { return func(o *options) { o.verifyContent = on } }

// attempt is one try at the daemon: the fingerprint sent and how the
// engine's files are checked against the daemon's.
type attempt struct {
	fp    checkpoint.Fingerprint
	dir   string // the engine's checkpoint directory
	model string // as the engine named it, for verify_content
	// change is, on a second try, how the engine's files differ from the
	// daemon's; the fingerprint then carries the checkpoint hash.
	change string
	// serial sends the hello alone, the manifest asked only once ready:
	// set after a daemon that was not ready answered the manifest sent
	// with the hello (one from before pipelining closes the connection
	// after that answer, and the next try must wait for it instead).
	serial bool
}

// reasonRehash is internal to Attach: the files' identity differs, so try
// again with the checkpoint hash.
const reasonRehash Reason = "rehash"

// filesChange compares the daemon's offered identity with the engine's
// files: "" when they are the same files, unchanged. The engine's files are
// its own choice (the files vLLM reads), never the daemon's list: a daemon
// serving other files of the same directory (say the shards beside a
// consolidated.safetensors) is a named difference. The choice trusts the
// set the daemon derived from an index that is still the file it read
// (checkpoint.KnownWeightFiles), so an unchanged checkpoint's index is
// not parsed.
func filesChange(offered checkpoint.Identity, dir string) string {
	if offered == nil {
		return "the daemon offers no stat identity for its files (they changed while it loaded them, or its publisher gave none)"
	}
	set, err := checkpoint.KnownWeightFiles(dir, offered)
	if err != nil {
		return err.Error()
	}
	names := set.IdentityNames()
	theirs := make([]string, len(offered))
	for i, f := range offered {
		theirs[i] = f.Name
	}
	if !slices.Equal(theirs, names) {
		return fmt.Sprintf("the daemon serves the files %v, this engine reads %v", theirs, names)
	}
	mine, err := checkpoint.StatIdentity(dir, names)
	if err != nil {
		return err.Error()
	}
	return offered.Diff(mine)
}

// verifyContent compares the CRC-32C of every tensor, read from the
// engine's checkpoint as the daemon serves it, with the daemon's.
func verifyContent(ctx context.Context, w *Weights, model string, o options, dtype string) error {
	if o.req.TPSize > 1 {
		return fmt.Errorf("verify_content is not supported with tensor parallelism (tp_size %d)", o.req.TPSize)
	}
	ckpt, err := checkpoint.Resolve(model, o.req.Revision)
	if err != nil {
		return err
	}
	served, err := ckpt.ServedTensors(dtype)
	if err != nil {
		return err
	}
	if len(served) != w.Len() {
		return fmt.Errorf("the checkpoint has %d tensors, the daemon %d", len(served), w.Len())
	}
	files, err := ckpt.OpenShards()
	if err != nil {
		return err
	}
	defer checkpoint.CloseShards(files)
	r := checkpoint.NewReader(files, 4<<20)
	for _, s := range served {
		if err := ctx.Err(); err != nil {
			return err
		}
		t, err := w.Get(s.Tensor.Name)
		if err != nil {
			return err
		}
		crc, err := r.Copy(s, discard{}, 0, nil)
		if err != nil {
			return err
		}
		if crc != t.CRC32C {
			return fmt.Errorf("tensor %s: CRC-32C %08x in %s, %08x in the daemon", s.Tensor.Name, crc, s.Shard.Name, t.CRC32C)
		}
	}
	return nil
}

// discard is an io.WriterAt that keeps nothing.
type discard struct{}

func (discard) WriteAt(p []byte, _ int64) (int, error) { return len(p), nil }

var _ io.WriterAt = discard{}
