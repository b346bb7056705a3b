package rank

import (
	"fmt"
	"os"

	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/daemon"
	"github.com/weightcache/weightcache/internal/protocol"
)

// The launcher (internal/launcher) talks to each rank daemon (Serve)
// over a socketpair, the daemon's fd 3, in protocol frames: spec ->,
// <- listening, segments (with one fd per segment) ->, <- ready. The pair
// stays open for the rank's lifetime: its end of file tells the rank that
// the launcher is gone. While the launcher loads for a rank it sends
// progress; once the rank is ready, pings, each answered with a pong.
const (
	TypeSpec      = "rank_spec"
	TypeListening = "rank_listening"
	TypeSegments  = "rank_segments"
	TypeReady     = "rank_ready"
	TypeProgress  = "rank_progress"
	TypePing      = "rank_ping"
	TypePong      = "rank_pong"
	// After the spec, the launcher sends the rank its socket (listener
	// and lock descriptors), which it took and keeps (sockets.Socket).
	TypeSocket = "rank_socket"
	// A successor's launcher sends its ready ranks the leases it took
	// over; the predecessor's launcher asks its ranks for theirs with a
	// handover, answered by leases frames, the last with Last set.
	TypeLeases   = "rank_leases"
	TypeHandover = "rank_handover"
	// A rank about to exit without having seen the launcher go says bye;
	// a launcher that lives answers ack. A SIGTERM may be the launcher's
	// death (Pdeathsig) arriving before its end of the channel closes:
	// without an ack the rank waits for that end and lets go of its socket.
	TypeBye = "rank_bye"
	TypeAck = "rank_ack"
	// A rank tells its launcher of every lease it grants, with a copy of
	// the leased connection, and of every lease that ends (daemon.LeaseWatcher):
	// a replacement is sent the leases still held, and counts them.
	TypeLease    = "rank_lease"
	TypeLeaseEnd = "rank_lease_end"
)

// Lease is one lease granted, its connection's copy on the frame.
type Lease struct {
	protocol.Head
	ID    uint64             `json:"id"`
	Lease daemon.HandedLease `json:"lease"`
}

// LeaseEnd is a lease ended.
type LeaseEnd struct {
	protocol.Head
	ID uint64 `json:"id"`
}

// launcherLeases is the daemon.LeaseWatcher of a rank: its launcher, over the
// control channel.
type launcherLeases struct{ ctl *protocol.Conn }

func (w launcherLeases) Leased(id uint64, l daemon.HandedLease, conn *os.File) error {
	defer conn.Close()
	return w.ctl.Send(Lease{Head: protocol.NewHead(TypeLease), ID: id, Lease: l}, conn)
}

func (w launcherLeases) Ended(id uint64) {
	_ = w.ctl.Send(LeaseEnd{Head: protocol.NewHead(TypeLeaseEnd), ID: id})
}

// Handover asks a rank to stop for a successor: with Leases it hands
// its leased connections over (answered by leases frames); without, the
// successor serves other bytes, and the leases drain here (answered by
// one empty last leases frame once it accepts no more).
type Handover struct {
	protocol.Head
	Leases bool `json:"leases"`
}

// Leases carries leased connections, one descriptor per lease, in
// frames of at most protocol.MaxFDs.
type Leases struct {
	protocol.Head
	Leases []daemon.HandedLease `json:"leases"`
	Last   bool                 `json:"last"`
}

// SendLeases sends leases over ctl in frames that respect the kernel's
// per-message descriptor limit; the last frame has Last set.
func SendLeases(ctl *protocol.Conn, leases []daemon.HandedLease, files []*os.File) error {
	for {
		n := min(len(files), protocol.MaxFDs)
		m := Leases{Head: protocol.NewHead(TypeLeases), Leases: leases[:n], Last: n == len(files)}
		if err := ctl.Send(m, files[:n]...); err != nil {
			return err
		}
		leases, files = leases[n:], files[n:]
		if m.Last {
			return nil
		}
	}
}

// DecodeLeases reads one leases frame, pairing each lease with its
// descriptor; on error every descriptor is closed.
func DecodeLeases(fr *protocol.Frame) (Leases, error) {
	var m Leases
	if fr.Type != TypeLeases {
		fr.CloseFiles()
		return m, fmt.Errorf("expected leases, got %q", fr.Type)
	}
	if err := fr.Decode(&m); err != nil {
		fr.CloseFiles()
		return m, err
	}
	if len(m.Leases) != len(fr.Files) {
		fr.CloseFiles()
		return m, fmt.Errorf("%d leases with %d descriptors", len(m.Leases), len(fr.Files))
	}
	return m, nil
}

// ControlFD is the descriptor the rank daemon finds its socketpair end on.
const ControlFD = 3

// Spec is everything a rank daemon needs to start serving.
type Spec struct {
	protocol.Head
	Group       string                 `json:"group"`
	Device      string                 `json:"device"`
	Model       string                 `json:"model"` // as the operator named it
	Dir         string                 `json:"dir"`   // resolved checkpoint directory
	Revision    string                 `json:"revision"`
	Fingerprint checkpoint.Fingerprint `json:"fingerprint"`
	// SelfLoad ranks read the checkpoint themselves, through the same
	// loader: GPU ranks under legacy IPC, whose memory dies with the
	// process that allocated it.
	SelfLoad bool `json:"self_load,omitempty"`
	daemon.Settings
	// Plan is what the sharding plan replicates, for status.
	Plan *protocol.PlanReport `json:"plan,omitempty"`
	// ControlSocket, for the launcher's first rank, is the launcher's
	// control socket (handover), which that rank removes if the launcher
	// dies without removing it.
	ControlSocket string `json:"control_socket,omitempty"`
}

// Listening tells the launcher that the rank holds its socket.
type Listening struct {
	protocol.Head
	Socket string `json:"socket"`
	PID    int    `json:"pid"`
}

// Segments hands a rank its sealed segments and its manifest index (a
// sealed memfd of IndexSize bytes placing Tensors tensors of DataBytes in
// all, as the daemon serves it): the fds ride on the frame in Segments
// order, then the index's. Nothing per tensor travels as JSON.
type Segments struct {
	protocol.Head
	Segments  []protocol.Segment  `json:"segments"`
	Tensors   int                 `json:"tensors"`
	DataBytes int64               `json:"data_bytes"`
	IndexSize int64               `json:"index_size"`
	Identity  checkpoint.Identity `json:"identity,omitempty"`
	LoadMS    int64               `json:"load_ms"`
	ReadBytes int64               `json:"read_bytes"`
	// Bound ties the descriptors to what they were made as, set by the
	// launcher that filled them (internal/handover): a successor or a
	// restart from systemd's fd store refuses any descriptor not exactly
	// the one described. Absent from a version-1 predecessor's.
	Bound *Binding `json:"bound,omitempty"`
}

// Binding is one rank's segments as their maker saw them.
type Binding struct {
	Rank        string     `json:"rank"`         // group/device/tp_rank/dp_rank
	Fingerprint string     `json:"fingerprint"`  // the rank's fingerprint sum
	Files       []FileBind `json:"files"`        // the segments in order, then the index
	IndexSHA256 string     `json:"index_sha256"` // of the whole manifest index
}

// FileBind is one descriptor's identity: its inode (a memfd's is its own
// for as long as it lives; a copy is another), size and seals.
type FileBind struct {
	Role  string `json:"role"` // "segment N" or "index"
	Dev   uint64 `json:"dev"`
	Ino   uint64 `json:"ino"`
	Size  int64  `json:"size"`
	Seals int    `json:"seals"`
}

// Ready tells the launcher that the rank serves.
type Ready struct {
	protocol.Head
	Bytes int64 `json:"bytes"`
	// LoadSeconds is the rank's own load, for ranks that load themselves.
	LoadSeconds float64 `json:"load_seconds,omitempty"`
}

// Progress tells a rank how far the launcher's load for it has come.
type Progress struct {
	protocol.Head
	Done  int64 `json:"done"`
	Total int64 `json:"total"`
}
