package daemon

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weightcache/weightcache/client"
	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/protocol"
)

func startPublishOnly(t *testing.T, model, dir string) *Daemon {
	t.Helper()
	d := start(t, model, dir, "host", func(c *Config) { c.PublishOnly = true })
	if err := d.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := d.Stats(); st.State != protocol.StateEmpty || st.Tensors != 0 {
		t.Fatalf("publish-only daemon after Load: state %s, %d tensors", st.State, st.Tensors)
	}
	return d
}

// engineWeights is what an engine would publish: the checkpoint as loaded
// from disk, with one tensor "post-processed" (negated) so that the
// published layout is provably the engine's, not the checkpoint's.
func engineWeights(t *testing.T, model string) ([]client.TensorSpec, map[string][]byte) {
	t.Helper()
	w, err := client.Attach(context.Background(), model, client.WithSocketDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	var specs []client.TensorSpec
	data := map[string][]byte{}
	for i, tn := range tensorsOf(t, w) {
		b := append([]byte(nil), tn.Data...)
		if i == 0 {
			for j := 1; j < len(b); j += 2 {
				b[j] ^= 0x80 // flip the sign bit of every bf16
			}
		}
		specs = append(specs, client.TensorSpec{Name: tn.Name, DType: tn.DType, Shape: tn.Shape})
		data[tn.Name] = b
	}
	specs = append(specs, client.TensorSpec{Name: "engine.fused_scale", DType: "F32", Shape: []int64{2}})
	data["engine.fused_scale"] = []byte{0, 0, 128, 63, 0, 0, 0, 64}
	return specs, data
}

func publishAll(t *testing.T, model, dir string, specs []client.TensorSpec, data map[string][]byte, opts ...client.Opt) error {
	t.Helper()
	opts = append([]client.Opt{client.WithSocketDir(dir), client.WithEngine("testengine", "1.0")}, opts...)
	p, err := client.Publish(context.Background(), model, specs, opts...)
	if err != nil {
		return err
	}
	for _, s := range specs {
		if err := p.Write(s.Name, data[s.Name]); err != nil {
			t.Fatal(err)
		}
	}
	return p.Commit(context.Background())
}

func TestPublishThenAttach(t *testing.T) {
	model, dir := synth(t), sockDir(t)
	d := startPublishOnly(t, model, dir)
	engine := client.WithEngine("testengine", "1.0")
	_, err := client.Attach(context.Background(), model, client.WithSocketDir(dir), engine, client.WithFallback(false))
	if !errors.Is(err, client.ErrEmpty) {
		t.Fatalf("attach to an empty daemon: %v, want ErrEmpty", err)
	}
	specs, data := engineWeights(t, model)
	if err := publishAll(t, model, dir, specs, data); err != nil {
		t.Fatal(err)
	}
	w := attach(t, model, dir, engine, client.WithFallback(false))
	if w.Len() != len(specs) {
		t.Fatalf("%d tensors, want %d", w.Len(), len(specs))
	}
	table := crc32.MakeTable(crc32.Castagnoli)
	for i, tn := range tensorsOf(t, w) {
		if tn.Name != specs[i].Name || string(tn.Data) != string(data[tn.Name]) {
			t.Fatalf("tensor %s: not the bytes published", tn.Name)
		}
		if crc32.Checksum(tn.Data, table) != tn.CRC32C {
			t.Fatalf("tensor %s: daemon checksum does not match", tn.Name)
		}
	}
	st := d.Stats()
	if st.State != protocol.StateReady || st.Tensors != len(specs) || st.Fingerprint.Engine != "testengine" {
		t.Fatalf("stats after commit = %+v", st)
	}
	// Another engine version, or the raw checkpoint, is not this layout.
	for _, tc := range []struct {
		opt   client.Opt
		field string
	}{{client.WithEngine("testengine", "2.0"), "engine_version"}, {client.WithEngine("", ""), "engine"}} {
		_, err := client.Attach(context.Background(), model, client.WithSocketDir(dir), tc.opt, client.WithFallback(false))
		var me *client.MissError
		if !errors.As(err, &me) || me.Source.Reason != client.ReasonFingerprintMismatch || me.Source.Fields[0].Field != tc.field {
			t.Fatalf("attach with other engine: %v, want a mismatch on %s", err, tc.field)
		}
	}
	// The layout is committed for good.
	if err := publishAll(t, model, dir, specs, data); !errors.Is(err, client.ErrPublished) {
		t.Fatalf("second publish: %v, want ErrPublished", err)
	}
}

func TestAbandonedPublishLeavesNothing(t *testing.T) {
	model, dir := synth(t), sockDir(t)
	d := startPublishOnly(t, model, dir)
	specs, data := engineWeights(t, model)
	p, err := client.Publish(context.Background(), model, specs, client.WithSocketDir(dir), client.WithEngine("testengine", "1.0"))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Write(specs[0].Name, data[specs[0].Name]); err != nil {
		t.Fatal(err)
	}
	if st := d.Stats().State; st != protocol.StatePublishing {
		t.Fatalf("state while writing = %s", st)
	}
	// A reader waiting for this writer learns at once that it went away.
	read := make(chan error, 1)
	go func() {
		_, err := client.Attach(context.Background(), model, client.WithSocketDir(dir), client.WithEngine("testengine", "1.0"),
			client.WithFallback(false), client.WithStateTimeout(time.Minute))
		read <- err
	}()
	waitFor(t, func() bool { return busyConns(d) == 1 }) // the reader waits in wait_ready
	p.Close()
	select {
	case err := <-read:
		if !errors.Is(err, client.ErrEmpty) {
			t.Fatalf("waiting reader: %v, want ErrEmpty", err)
		}
	case <-time.After(time.Until(waitDeadline(t))):
		t.Fatal("waiting reader not told by the test's deadline that the writer went away")
	}
	waitFor(t, func() bool { return d.Stats().State == protocol.StateEmpty })
	if err := publishAll(t, model, dir, specs, data); err != nil {
		t.Fatalf("publish after an abandoned one: %v", err)
	}
}

func TestOneWriterAtATime(t *testing.T) {
	model, dir := synth(t), sockDir(t)
	d := startPublishOnly(t, model, dir)
	specs, data := engineWeights(t, model)
	ctx := context.Background()
	first, err := client.Publish(ctx, model, specs, client.WithSocketDir(dir), client.WithEngine("testengine", "1.0"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = client.Publish(ctx, model, specs, client.WithSocketDir(dir), client.WithEngine("testengine", "1.0"))
	if !errors.Is(err, client.ErrBusy) || !strings.Contains(err.Error(), "one writer at a time") {
		t.Fatalf("second writer: %v, want busy", err)
	}
	// A reader that arrives meanwhile waits for the commit.
	read := make(chan *client.Weights, 1)
	go func() {
		w, err := client.Attach(ctx, model, client.WithSocketDir(dir), client.WithEngine("testengine", "1.0"), client.WithFallback(false))
		if err != nil {
			t.Error(err)
		}
		read <- w
	}()
	// A waiting writer learns that the layout was committed.
	waited := make(chan error, 1)
	go func() {
		_, err := client.Publish(ctx, model, specs, client.WithSocketDir(dir), client.WithEngine("testengine", "1.0"), client.WithPublishWait(10*time.Second))
		waited <- err
	}()
	waitFor(t, func() bool { return busyConns(d) == 2 }) // the reader and the writer wait
	for _, s := range specs {
		if err := first.Write(s.Name, data[s.Name]); err != nil {
			t.Fatal(err)
		}
	}
	if err := first.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-waited; !errors.Is(err, client.ErrPublished) {
		t.Fatalf("waiting writer: %v, want ErrPublished", err)
	}
	w := <-read
	if w == nil || !w.Source.Hit || w.Len() != len(specs) {
		t.Fatal("waiting reader did not get the published layout")
	}
	w.Close()
}

func TestPublishRefused(t *testing.T) {
	model, dir := synth(t), sockDir(t)
	ready := startReady(t, model, sockDir(t))
	specs, _ := engineWeights(t, model)
	ckpt, _ := checkpoint.Resolve(model, "")
	fp := fingerprintOf(t, ckpt)
	ctx := context.Background()
	// A preloaded daemon serves the checkpoint; it takes no publisher.
	pre := rawConn(t, ready.Socket())
	if _, err := pre.Call(ctx, protocol.Hello{Head: protocol.NewHead(protocol.TypeHello), Fingerprint: fp, Device: "host", Mode: "zero_copy"}, protocol.TypeOK); err != nil {
		t.Fatal(err)
	}
	_, err := pre.Call(ctx, protocol.Publish{Head: protocol.NewHead(protocol.TypePublish), Sizes: []int64{4096}}, protocol.TypePublishSegments)
	if !errors.Is(err, protocol.ErrBadRequest) || !strings.Contains(err.Error(), "--publish-only") {
		t.Fatalf("publish to a preloaded daemon: %v", err)
	}
	d := startPublishOnly(t, model, dir)
	if _, err := client.Publish(context.Background(), model, specs, client.WithSocketDir(dir)); err == nil {
		t.Fatal("publish without an engine name succeeded")
	}
	// A writer that still maps its segment for writing cannot commit, and
	// its failed commit leaves nothing behind.
	c := rawConn(t, d.Socket())
	fp.Engine = "raw"
	if _, err := c.Call(ctx, protocol.Hello{Head: protocol.NewHead(protocol.TypeHello), Fingerprint: fp, Device: "host", Mode: "zero_copy"}, protocol.TypeOK); err != nil {
		t.Fatal(err)
	}
	fr := rawPublish(t, c, []protocol.Tensor{{Name: "x", DType: "U8", Shape: []int64{16}, NBytes: 16}})
	m, err := unix.Mmap(int(fr.Files[0].Fd()), 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	fr.CloseFiles()
	commit := protocol.Commit{Head: protocol.NewHead(protocol.TypeCommit), Tensors: 1}
	if _, err := c.Call(ctx, commit, protocol.TypeCommitted); !errors.Is(err, protocol.ErrBadRequest) || !strings.Contains(err.Error(), "seal") {
		t.Fatalf("commit while mapped writable: %v", err)
	}
	waitFor(t, func() bool { return d.Stats().State == protocol.StateEmpty })
}

func TestCommitChecksEntries(t *testing.T) {
	model, dir := synth(t), sockDir(t)
	d := startPublishOnly(t, model, dir)
	ckpt, _ := checkpoint.Resolve(model, "")
	fp := fingerprintOf(t, ckpt)
	fp.Engine = "raw"
	ctx := context.Background()
	a := protocol.Tensor{Name: "a", DType: "U8", Shape: []int64{1}, NBytes: 1}
	b := protocol.Tensor{Name: "b", DType: "U8", Shape: []int64{1}, Offset: 1, NBytes: 1}
	const order = protocol.IndexHeaderLen + 2*protocol.IndexEntryLen // of two entries
	for _, tc := range []struct {
		name string
		ts   []protocol.Tensor
		// mangle changes the encoded index before the commit, for what
		// EncodeIndex would refuse to write.
		mangle func([]byte)
		want   string
	}{
		{"outside", []protocol.Tensor{{Name: "a", DType: "U8", Shape: []int64{300}, Offset: 4000, NBytes: 300}}, nil, "outside segment"},
		{"size", []protocol.Tensor{{Name: "a", DType: "F32", Shape: []int64{3}, NBytes: 16}}, nil, "does not match"},
		{"segment", []protocol.Tensor{{Name: "a", DType: "U8", Shape: []int64{1}, Segment: 3, NBytes: 1}}, nil, "does not exist"},
		// The names are the last bytes: "ab" becomes "aa".
		{"twice", []protocol.Tensor{a, b}, func(x []byte) { x[len(x)-1] = 'a' }, "tensor a is listed twice"},
		{"unsorted", []protocol.Tensor{a, b}, func(x []byte) { x[order], x[order+4] = 1, 0 }, "not sorted by name at slot 1"},
		{"order past", []protocol.Tensor{a, b}, func(x []byte) { x[order] = 7 }, "order slot 0 names an entry past the 2"},
		{"dtype", []protocol.Tensor{a}, func(x []byte) { copy(x[protocol.IndexHeaderLen+16:], "Q9") }, "does not match dtype \"Q9\""},
		// Refused from the entry's stated lengths, before Entry copies the
		// shape or the name onto the daemon's heap: a shape of ones has
		// the size its dtype says, so nothing later would refuse it.
		{"dims", []protocol.Tensor{{Name: "a", DType: "U8", Shape: ones(MaxTensorDims + 1), NBytes: 1}}, nil,
			fmt.Sprintf("entry 0: a name of 1 bytes or %d dimensions, over the limits", MaxTensorDims+1)},
		{"name", []protocol.Tensor{{Name: strings.Repeat("n", MaxFieldBytes+1), DType: "U8", Shape: []int64{1}, NBytes: 1}}, nil,
			fmt.Sprintf("entry 0: a name of %d bytes or 1 dimensions, over the limits", MaxFieldBytes+1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := rawConn(t, d.Socket())
			if _, err := c.Call(ctx, protocol.Hello{Head: protocol.NewHead(protocol.TypeHello), Fingerprint: fp, Device: "host", Mode: "zero_copy"}, protocol.TypeOK); err != nil {
				t.Fatal(err)
			}
			fr := rawPublish(t, c, tc.ts)
			if tc.mangle != nil {
				x := make([]byte, protocol.IndexSize(tc.ts))
				if _, err := fr.Files[1].ReadAt(x, 0); err != nil {
					t.Fatal(err)
				}
				tc.mangle(x)
				if _, err := fr.Files[1].WriteAt(x, 0); err != nil {
					t.Fatal(err)
				}
			}
			fr.CloseFiles()
			_, err := c.Call(ctx, protocol.Commit{Head: protocol.NewHead(protocol.TypeCommit), Tensors: len(tc.ts)}, protocol.TypeCommitted)
			if !errors.Is(err, protocol.ErrBadRequest) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("commit: %v, want %q", err, tc.want)
			}
			waitFor(t, func() bool { return d.Stats().State == protocol.StateEmpty })
		})
	}
}

func ones(n int) []int64 {
	s := make([]int64, n)
	for i := range s {
		s[i] = 1
	}
	return s
}

func TestManifestAfterOtherEnginePublished(t *testing.T) {
	model, dir := synth(t), sockDir(t)
	d := startPublishOnly(t, model, dir)
	ckpt, _ := checkpoint.Resolve(model, "")
	fp := fingerprintOf(t, ckpt)
	fp.Engine, fp.EngineVersion, fp.EngineConfig = "testengine", "0.9", `{"kv_cache_dtype":"fp8"}`
	ctx := context.Background()
	// Accepted while empty: any engine, version and engine config may
	// become the writer.
	c := rawConn(t, d.Socket())
	fr, err := c.Call(ctx, protocol.Hello{Head: protocol.NewHead(protocol.TypeHello), Fingerprint: fp, Device: "host", Mode: "zero_copy"}, protocol.TypeOK)
	if err != nil {
		t.Fatal(err)
	}
	var ok protocol.OK
	if fr.Decode(&ok); ok.State != protocol.StateEmpty {
		t.Fatalf("hello state = %s, want empty", ok.State)
	}
	specs, data := engineWeights(t, model)
	if err := publishAll(t, model, dir, specs, data); err != nil {
		t.Fatal(err)
	}
	fr, err = c.Call(ctx, protocol.NewHead(protocol.TypeManifest), protocol.TypeManifest, protocol.TypeMismatch)
	if err != nil {
		t.Fatal(err)
	}
	defer fr.CloseFiles()
	var m protocol.Mismatch
	if fr.Type != protocol.TypeMismatch || fr.Decode(&m) != nil || len(m.Fields) != 2 || m.Fields[0].Field != "engine_config" || m.Fields[1].Field != "engine_version" {
		t.Fatalf("manifest after another engine published: %s", fr.Body)
	}
}

// rawPublish asks for one 4096-byte segment and writes the index of ts into
// the index memfd that comes after it.
func rawPublish(t *testing.T, c *protocol.Conn, ts []protocol.Tensor) *protocol.Frame {
	t.Helper()
	return rawPublishIdentity(t, c, ts, nil)
}

// rawPublishIdentity is rawPublish stating identity as the writer's files.
func rawPublishIdentity(t *testing.T, c *protocol.Conn, ts []protocol.Tensor, identity checkpoint.Identity) *protocol.Frame {
	t.Helper()
	req := protocol.Publish{Head: protocol.NewHead(protocol.TypePublish), Sizes: []int64{4096}, IndexSize: protocol.IndexSize(ts), Tensors: len(ts), Identity: identity}
	fr, err := c.Call(context.Background(), req, protocol.TypePublishSegments)
	if err != nil {
		t.Fatal(err)
	}
	if len(fr.Files) != 2 {
		t.Fatalf("%d descriptors, want a segment and the index", len(fr.Files))
	}
	buf := make([]byte, req.IndexSize)
	if err := protocol.EncodeIndex(buf, ts); err != nil {
		t.Fatal(err)
	}
	if _, err := fr.Files[1].WriteAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	return fr
}
