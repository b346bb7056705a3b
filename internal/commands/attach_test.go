package commands

import (
	"encoding/json"
	"hash/crc32"
	"net"
	"os"
	"strings"
	"testing"

	"github.com/weightcache/weightcache/internal/backend/host"
	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/protocol"
	"github.com/weightcache/weightcache/internal/sockets"
)

// sealed is a sealed memfd holding b, exported read-only as a daemon
// hands out segments and indexes.
func sealed(t *testing.T, b []byte) *os.File {
	t.Helper()
	hb, err := host.New("host")
	if err != nil {
		t.Fatal(err)
	}
	seg, err := hb.Alloc(int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	defer seg.Free()
	if _, err := seg.WriteAt(b, 0); err != nil {
		t.Fatal(err)
	}
	if err := seg.Seal(); err != nil {
		t.Fatal(err)
	}
	f, err := seg.Export()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// fakeDaemon serves data as one host segment placed by index ts on dir's
// host socket, to every connection: ok with the stat identity of model's
// files (so the engine hits without hashing a header), the manifest, and
// then the lease until the engine leaves.
func fakeDaemon(t *testing.T, model string, data []byte, ts []protocol.Tensor) string {
	t.Helper()
	ckpt, err := checkpoint.Resolve(model, "")
	if err != nil {
		t.Fatal(err)
	}
	// The index as the daemon writes it (host.WriteIndex), wrong CRC and all.
	idxSeg, err := host.WriteIndex(ts)
	if err != nil {
		t.Fatal(err)
	}
	defer idxSeg.Free()
	idxFile, err := idxSeg.Export()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { idxFile.Close() })
	var bytes int64
	for _, x := range ts {
		bytes += x.NBytes
	}
	seg := sealed(t, data)
	dir := sockDir(t)
	path, err := sockets.Path(dir, "main", "host")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		for {
			uc, err := ln.AcceptUnix()
			if err != nil {
				return
			}
			c := protocol.NewConn(uc, protocol.MaxRequestFrame)
			replies := []any{
				protocol.OK{Head: protocol.NewHead(protocol.TypeOK), State: protocol.StateReady, Device: "host", Identity: ckpt.Identity},
				protocol.Manifest{Head: protocol.NewHead(protocol.TypeManifest), Device: "host",
					Segments: []protocol.Segment{{Index: 0, Size: int64(len(data))}}, Tensors: len(ts), Bytes: bytes, IndexSize: protocol.IndexSize(ts)},
			}
			for i, reply := range replies {
				fr, err := c.Recv()
				if err != nil {
					break
				}
				fr.CloseFiles()
				var files []*os.File
				if i == 1 {
					files = []*os.File{seg, idxFile}
				}
				if c.Send(reply, files...) != nil {
					break
				}
			}
			for {
				if _, err := c.Recv(); err != nil {
					break
				}
			}
			c.Close()
		}
	}()
	return dir
}

// attach --verify reads every tensor against the index's CRC-32C: a daemon
// whose index is wrong for one tensor fails it, naming that tensor.
func TestAttachVerifyReportsMismatch(t *testing.T) {
	t.Parallel()
	model := synthModel(t, "tiny")
	data := make([]byte, 4096)
	for i := range data {
		data[i] = byte(i * 7)
	}
	crc := func(off, n int64) uint32 { return crc32.Checksum(data[off:off+n], checkpoint.Castagnoli) }
	tensors := []protocol.Tensor{
		{Name: "good", DType: "U8", Shape: []int64{64}, Offset: 0, NBytes: 64, CRC32C: crc(0, 64)},
		{Name: "bad", DType: "U8", Shape: []int64{64}, Offset: 256, NBytes: 64, CRC32C: crc(256, 64) ^ 1},
	}
	tests := []struct {
		name     string
		ts       []protocol.Tensor
		code     int
		verified bool
	}{
		{"all match", tensors[:1], 0, true},
		{"one wrong", tensors, 1, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := fakeDaemon(t, model, data, tt.ts)
			out, stderr, code := runWC(t, "attach", "--json", "--model", model, "--socket-dir", dir, "--fallback=false", "--verify")
			var r attachResult
			if err := json.Unmarshal([]byte(out), &r); err != nil || r.Source != "hit" || r.Verified == nil {
				t.Fatalf("attach --verify printed %q (stderr %q, exit %d), want a verified hit", out, stderr, code)
			}
			if code != tt.code || *r.Verified != tt.verified {
				t.Fatalf("attach --verify: exit %d, verified %v; want exit %d, verified %v", code, *r.Verified, tt.code, tt.verified)
			}
			if named := strings.Contains(stderr, "tensor bad does not match its CRC-32C"); named == tt.verified {
				t.Fatalf("attach --verify stderr %q: naming tensor bad is %v, want %v", stderr, named, !tt.verified)
			}
		})
	}
}
