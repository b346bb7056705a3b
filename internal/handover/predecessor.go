package handover

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"syscall"
	"time"

	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/protocol"
	"github.com/weightcache/weightcache/internal/rank"
	"github.com/weightcache/weightcache/internal/sockets"
)

// Self is a successor as it introduces itself to a predecessor.
type Self struct {
	Binary string
	Ranks  []Rank
	// Identity is each group's checkpoint files' stat identity now.
	Identity map[string]checkpoint.Identity
}

func (me Self) hello(ready bool) hello {
	return hello{Head: protocol.NewHead(typeHello), Versions: versions, PID: os.Getpid(), Binary: me.Binary,
		Ranks: me.Ranks, Identity: me.Identity, Ready: ready}
}

// Predecessor is the preload a successor takes over, as the successor
// sees it: a Source over its control socket.
type Predecessor struct {
	conn  *protocol.Conn // nil: to be asked again once loaded (sockets only)
	path  string         // its control socket
	ranks []Rank
	hello func(ready bool) hello
	offer offer
}

// Contact asks the preload whose control socket is path for its cache.
// With no preload there, none says so; retry is a refusal worth asking
// again (another handover under way); any other refusal (another model,
// other devices) is an error, leaving that preload serving.
func Contact(path string, me Self) (pr *Predecessor, none, retry string, err error) {
	pr = &Predecessor{path: path, ranks: me.Ranks, hello: me.hello}
	if none, retry, err = pr.contact(false); none != "" || retry != "" || err != nil {
		return nil, none, retry, err
	}
	return pr, "", "", nil
}

// PID is the predecessor's pid, as its offer says.
func (pr *Predecessor) PID() int { return pr.offer.PID }

// Binary is the predecessor's version, as its offer says.
func (pr *Predecessor) Binary() string { return pr.offer.Binary }

// contact asks the preload at pr.path for its cache, or, with ready (this
// launch has its segments), for its sockets only.
func (pr *Predecessor) contact(ready bool) (none, retry string, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), StepTimeout)
	defer cancel()
	conn, err := protocol.Dial(ctx, pr.path)
	if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Sprintf("no preload to take over at %s", pr.path), "", nil
	}
	if err != nil {
		return "", "", fmt.Errorf("--takeover: control socket %s: %w", pr.path, err)
	}
	retry, err = pr.ask(protocol.NewConn(conn.Unix(), maxPredecessorFrame), ready)
	return "", retry, err
}

// ask says hello on conn and reads the answer: an offer, kept with conn,
// or a refusal (retry: worth asking again). conn is closed unless kept.
func (pr *Predecessor) ask(conn *protocol.Conn, ready bool) (retry string, err error) {
	// The predecessor reads the hello only once it is this one's turn.
	_ = conn.Unix().SetDeadline(time.Now().Add(TurnTimeout + StepTimeout))
	// A predecessor that refuses at once (another uid) may close before
	// the hello is written: its reason is still queued.
	serr := conn.Send(pr.hello(ready))
	Fault("succ:hello")
	fr, err := conn.Recv()
	if err != nil && serr != nil {
		err = serr
	}
	if errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) {
		// Closed unanswered: a predecessor exiting after a handover to
		// another, or dying. Asked again, its successor answers, or
		// nobody, and this launch loads afresh.
		_ = conn.Close()
		return fmt.Sprintf("%s closed the connection before an offer: %v", pr.path, err), nil
	}
	if err != nil {
		_ = conn.Close()
		return "", fmt.Errorf("--takeover: %s: no offer: %w", pr.path, err)
	}
	fr.CloseFiles()
	switch fr.Type {
	case typeRefused:
		var r refused
		_ = fr.Decode(&r)
		_ = conn.Close()
		if r.Retry {
			return r.Reason, nil
		}
		return "", fmt.Errorf("--takeover: the preload at %s refused: %s", pr.path, r.Reason)
	case typeOffer:
	default:
		_ = conn.Close()
		return "", fmt.Errorf("--takeover: %s answered %q, not an offer", pr.path, fr.Type)
	}
	var o offer
	if err := fr.Decode(&o); err != nil {
		_ = conn.Close()
		return "", fmt.Errorf("--takeover: %s: offer: %w", pr.path, err)
	}
	Fault("succ:offer")
	_ = conn.Unix().SetDeadline(time.Now().Add(StepTimeout))
	pr.conn = conn
	if !ready {
		pr.offer = o
	}
	return "", nil
}

// Offer implements Source: the offer contact received.
func (pr *Predecessor) Offer() (Offer, error) {
	o := Offer{From: fmt.Sprintf("preload pid %d (%s)", pr.offer.PID, pr.offer.Binary), Ranks: pr.offer.Ranks, Reason: pr.offer.Reason}
	if pr.offer.Adopt {
		o.Caches = pr.offer.Segments
		if o.Caches == nil {
			o.Caches = []*rank.Segments{}
		}
	}
	return o, nil
}

// Files implements Source: rank's segments frame.
func (pr *Predecessor) Files(rank int) ([]*os.File, error) {
	fr, err := pr.conn.Recv()
	if err != nil {
		return nil, fmt.Errorf("the predecessor (pid %d) went away while sending segments: %w", pr.offer.PID, err)
	}
	var m leasesMsg
	if fr.Type != typeSegments || fr.Decode(&m) != nil || m.Rank != rank {
		fr.CloseFiles()
		return nil, fmt.Errorf("the predecessor (pid %d) sent %q for rank %d, want the segments of rank %d", pr.offer.PID, fr.Type, m.Rank, rank)
	}
	return fr.Files, nil
}

// Taken implements Source. A load comes first where any rank was not
// taken, which may take longer than the predecessor waits for the next
// step: it is asked again, for the sockets only, once this launch has its
// segments.
func (pr *Predecessor) Taken(taken []bool) {
	if pr.offer.Adopt {
		Fault("succ:segments")
	}
	if slices.Contains(taken, false) || len(taken) == 0 {
		_ = pr.conn.Close()
		pr.conn = nil
	}
}

// Sockets implements Source: it asks for every rank's socket and the
// control socket and checks each is the one at its path.
func (pr *Predecessor) Sockets(req SocketRequest) (Sockets, error) {
	if err := pr.reconnect(); err != nil {
		return Sockets{}, err
	}
	_ = pr.conn.Unix().SetDeadline(time.Now().Add(StepTimeout))
	if err := pr.conn.Send(protocol.NewHead(typeTake)); err != nil {
		return Sockets{}, err
	}
	Fault("succ:take")
	fr, err := pr.conn.Recv()
	if err != nil {
		return Sockets{}, err
	}
	return socketsFrom(fr, req)
}

// reconnect asks the predecessor again, for its sockets only, when the
// first exchange was let go for a load.
func (pr *Predecessor) reconnect() error {
	if pr.conn != nil {
		return nil
	}
	for deadline := time.Now().Add(TurnTimeout); ; {
		none, retry, err := pr.contact(true)
		if err != nil {
			return fmt.Errorf("asking again for the sockets: %w", err)
		}
		if none != "" {
			return fmt.Errorf("asking again for the sockets: %s", none)
		}
		if retry == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("asking again for the sockets: %s", retry)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// socketsFrom reads a sockets frame: every rank's listener and lock but
// the missing ones', then the control socket's.
func socketsFrom(fr *protocol.Frame, req SocketRequest) (Sockets, error) {
	var m socketsMsg
	if fr.Type != typeSockets || fr.Decode(&m) != nil {
		fr.CloseFiles()
		return Sockets{}, fmt.Errorf("the predecessor sent %q, want its sockets", fr.Type)
	}
	missing := map[int]bool{}
	for _, i := range m.Missing {
		if i < 0 || i >= len(req.Ranks) {
			fr.CloseFiles()
			return Sockets{}, fmt.Errorf("the predecessor names rank %d missing of %d ranks", i, len(req.Ranks))
		}
		missing[i] = true
	}
	if want := 2*(len(req.Ranks)-len(missing)) + 2; len(fr.Files) != want || len(missing) != len(m.Missing) {
		fr.CloseFiles()
		return Sockets{}, fmt.Errorf("the predecessor sent %d descriptors for %d ranks (%d missing), want %d", len(fr.Files), len(req.Ranks), len(m.Missing), want)
	}
	files := fr.Files
	take := func(path string) (*sockets.Socket, error) {
		s, err := sockets.FromFiles(path, files[0], files[1])
		files = files[2:]
		return s, err
	}
	out := Sockets{Ranks: make([]*sockets.Socket, len(req.Ranks)), Generation: m.Generation}
	fail := func(err error) (Sockets, error) {
		out.Close()
		for _, f := range files {
			_ = f.Close()
		}
		return Sockets{}, err
	}
	var err error
	for i, path := range req.Ranks {
		if missing[i] {
			continue
		}
		if out.Ranks[i], err = take(path); err != nil {
			return fail(err)
		}
	}
	if out.Control, err = take(req.Control); err != nil {
		return fail(err)
	}
	return out, nil
}

// Leases implements Source: it asks for the leases and hands each batch
// to deliver until the predecessor says all are sent.
func (pr *Predecessor) Leases(deliver Deliver) (int, error) {
	_ = pr.conn.Unix().SetDeadline(time.Now().Add(TurnTimeout))
	if err := pr.conn.Send(protocol.NewHead(typeLeases)); err != nil {
		return 0, fmt.Errorf("ask for the leases: %w", err)
	}
	Fault("succ:leases")
	moved := 0
	for {
		fr, err := pr.conn.Recv()
		if err != nil {
			return moved, fmt.Errorf("the predecessor went away while handing over its leases; those not received end with it (their engines keep their mappings): %w", err)
		}
		if fr.Type == typeSent {
			return moved, nil
		}
		var m leasesMsg
		if fr.Type != typeLeases || fr.Decode(&m) != nil || m.Rank < 0 || m.Rank >= len(pr.ranks) || len(m.Leases) != len(fr.Files) {
			fr.CloseFiles()
			return moved, fmt.Errorf("unexpected frame %q (rank %d of %d) while receiving leases", fr.Type, m.Rank, len(pr.ranks))
		}
		err = deliver(m.Rank, m.Leases, fr.Files, m.Last)
		fr.CloseFiles()
		if err != nil {
			return moved, err
		}
		moved += len(m.Leases)
	}
}

// Close implements Source: done once this launch owns everything, else
// the connection just closes.
func (pr *Predecessor) Close(err error) {
	if pr.conn == nil {
		return
	}
	if err == nil {
		Fault("succ:done")
		_ = pr.conn.Send(protocol.NewHead(typeDone))
	}
	_ = pr.conn.Close()
	pr.conn = nil
}
