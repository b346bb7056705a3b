package commands

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/protocol"
	"github.com/weightcache/weightcache/internal/safetensors"
)

// manyTensorModel writes a Llama-shaped checkpoint of n small tensors, so
// that its manifest is larger than a socket buffer.
func manyTensorModel(tb testing.TB, n int) string {
	tb.Helper()
	dir := filepath.Join(tb.TempDir(), "many")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	ts := make([]safetensors.TensorData, n)
	for i := range ts {
		ts[i] = safetensors.TensorData{Name: fmt.Sprintf("model.layers.%d.input_layernorm.weight", i), DType: safetensors.F32, Shape: []int64{4}, Data: make([]byte, 16)}
	}
	var buf bytes.Buffer
	if err := safetensors.Write(&buf, nil, ts); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "model.safetensors"), buf.Bytes(), 0o644); err != nil {
		tb.Fatal(err)
	}
	cfg := `{"architectures":["LlamaForCausalLM"],"num_attention_heads":4,"num_key_value_heads":4,"torch_dtype":"float32"}`
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o644); err != nil {
		tb.Fatal(err)
	}
	return dir
}

// procFDs is the number of open descriptors of process pid.
func procFDs(pid int) int {
	ents, _ := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
	return len(ents)
}

// stallFrames opens n connections that each declare a frame of size bytes
// and send nothing more.
func stallFrames(tb testing.TB, sock string, n int, size uint32) []net.Conn {
	tb.Helper()
	var out []net.Conn
	for range n {
		c, err := net.Dial("unix", sock)
		if err != nil {
			tb.Fatalf("connection %d: %v", len(out), err)
		}
		var hdr [4]byte
		binary.BigEndian.PutUint32(hdr[:], size)
		if _, err := c.Write(hdr[:]); err != nil {
			tb.Fatal(err)
		}
		out = append(out, c)
	}
	return out
}

// stallManifests opens n connections that say hello, ask for the manifest
// and never read it.
func stallManifests(tb testing.TB, sock string, fp checkpoint.Fingerprint, n int) []*protocol.Conn {
	tb.Helper()
	var out []*protocol.Conn
	for range n {
		c, err := protocol.Dial(context.Background(), sock)
		if err != nil {
			tb.Fatal(err)
		}
		hello := protocol.Hello{Head: protocol.NewHead(protocol.TypeHello), Fingerprint: fp, Device: "host", Mode: protocol.ModeZeroCopy, Client: "stalled"}
		if _, err := c.Call(context.Background(), hello, protocol.TypeOK); err != nil {
			tb.Fatal(err)
		}
		if err := c.Send(protocol.NewHead(protocol.TypeManifest)); err != nil {
			tb.Fatal(err)
		}
		out = append(out, c)
	}
	return out
}

// daemonPID is the pid of the rank that serves the one socket of p.
func daemonPID(t *testing.T, p *preloadProc) int {
	return int(readyRanks(t, p)[0]["pid"].(float64))
}

func closeAll[C interface{ Close() error }](cs []C) {
	for _, c := range cs {
		_ = c.Close()
	}
}

// A hostile local client cannot grow the daemon's memory or descriptors
// past its limits, and a real engine still attaches during the attack.
func TestHostileClientsAreBounded(t *testing.T) {
	// Serial: its floods and the memory and descriptors it bounds are
	// its own only with no other test beside it.
	const tensors, maxConns = 5000, 64
	model, dir := manyTensorModel(t, tensors), sockDir(t)
	p := startPreloadProc(t, true, "--model", model, "--socket-dir", dir,
		"--max-connections", strconv.Itoa(maxConns), "--max-inflight-bytes", strconv.Itoa(4<<20), "--write-timeout", "1s")
	pid, sock := daemonPID(t, p), p.ready["socket"].(string)
	anon0, fds0 := procStatus(pid, "RssAnon"), procFDs(pid)
	fp, err := checkpoint.QuickFingerprint(checkpoint.NewRequest(model))
	if err != nil {
		t.Fatal(err)
	}

	// Frames that declare 16 MiB and stall, three times the connection cap:
	// the oldest are closed as new ones come, and none holds 16 MiB.
	stalled := stallFrames(t, sock, 3*maxConns, protocol.MaxRequestFrame)
	defer closeAll(stalled)
	if r, code := attachJSON(t, "--model", model, "--socket-dir", dir, "--fallback=false"); code != 0 || r.Source != "hit" {
		t.Fatalf("engine during the attack: exit %d, %+v", code, r)
	}
	waitFor(t, "connections capped", func() bool { return stats(t, dir).Connections <= maxConns })
	if anon, fds := procStatus(pid, "RssAnon"), procFDs(pid); anon-anon0 > 64<<20 || fds-fds0 > maxConns+8 {
		t.Fatalf("%d stalled frames: RssAnon +%d MiB, descriptors +%d (cap %d)", 3*maxConns, (anon-anon0)>>20, fds-fds0, maxConns)
	}

	// Manifest readers that never read: the manifest is a few hundred
	// bytes (the index is a shared sealed segment), so each gets it whole
	// into its socket buffer and holds a lease like an engine, pinning
	// nothing in the daemon.
	readers := stallManifests(t, sock, fp, 8)
	defer closeAll(readers)
	waitFor(t, "stalled manifest readers hold their leases", func() bool { return stats(t, dir).Leases == 8 })
	if anon := procStatus(pid, "RssAnon"); anon-anon0 > 64<<20 {
		t.Fatalf("8 stalled manifest readers: RssAnon +%d MiB", (anon-anon0)>>20)
	}
	// One that asks again and again without reading fills its socket:
	// the daemon's write times out, and the connection and its lease go.
	pipelined := stallManifests(t, sock, fp, 1)[0]
	sent := make(chan error, 1)
	go func() {
		for {
			if err := pipelined.Send(protocol.NewHead(protocol.TypeManifest)); err != nil {
				sent <- err
				return
			}
		}
	}()
	timer := waitTimer(t)
	defer timer.Stop()
	select {
	case <-sent: // the daemon closed it
	case <-timer.C:
		t.Fatal("a client that never reads its replies was not closed by the test's deadline")
	}
	_ = pipelined.Close()
	waitFor(t, "the pipelining reader's lease dropped", func() bool { return stats(t, dir).Leases == 8 })
	closeAll(readers)
	waitFor(t, "leases of closed readers dropped", func() bool { return stats(t, dir).Leases == 0 })

	// A hello field of 1 MiB is refused, naming the field, without echoing it.
	c, err := protocol.Dial(context.Background(), sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	big := protocol.Hello{Head: protocol.NewHead(protocol.TypeHello), Fingerprint: fp, Device: "host", Mode: protocol.ModeZeroCopy, Client: string(bytes.Repeat([]byte("x"), 1<<20))}
	ctx, cancel := context.WithDeadline(context.Background(), waitDeadline(t))
	defer cancel()
	_, err = c.Call(ctx, big, protocol.TypeOK)
	if err == nil || !bytes.Contains([]byte(err.Error()), []byte("field client")) || len(err.Error()) > 512 {
		t.Fatalf("1 MiB client name: %.300v", err)
	}
	if r, code := attachJSON(t, "--model", model, "--socket-dir", dir, "--fallback=false"); code != 0 || r.Source != "hit" {
		t.Fatalf("engine after the attack: exit %d, %+v", code, r)
	}
	if code := p.stop(t, os.Interrupt); code != 0 {
		t.Fatalf("preload exit %d: %s", code, p.stderr)
	}
	if bytes.Contains(p.stderr.Bytes(), bytes.Repeat([]byte("x"), 100)) {
		t.Fatal("the log quotes the whole client name")
	}
}
