package launcher

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"github.com/weightcache/weightcache/internal/protocol"
	"github.com/weightcache/weightcache/internal/scatter"
)

// report accumulates what the ready line says about the loads.
type report struct {
	mu           sync.Mutex
	readBytes    int64 // read from the checkpoints' shard files
	dataBytes    int64 // tensor data in those files
	fileBytes    int64 // the files' sizes, headers included
	loadSeconds  float64
	localSeconds float64 // start-up of this node, before waiting for others
	// rankLoadSeconds is the slowest self-loading rank's own load time.
	rankLoadSeconds float64
	reason          string // why the segments were not taken over, if asked
	leases          int    // leases a predecessor handed over
}

func (r *report) add(g Group, res *scatter.Result) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.readBytes += res.ReadBytes
	r.fileBytes += g.Checkpoint.Size()
	r.dataBytes += g.Checkpoint.DataSize()
	r.loadSeconds += res.Elapsed.Seconds()
}

// addServed counts a group whose segments were handed over: its bytes are
// served, none read.
func (r *report) addServed(g Group) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fileBytes += g.Checkpoint.Size()
	r.dataBytes += g.Checkpoint.DataSize()
}

// ReadyLine is the one JSON line preload prints on stdout once every rank
// of every group on every node serves. The leading fields describe the
// first rank, as a single-device preload always printed them.
type ReadyLine struct {
	Event       string  `json:"event"`
	Socket      string  `json:"socket"`
	Device      string  `json:"device"`
	Group       string  `json:"group"`
	Model       string  `json:"model"`
	Tensors     int     `json:"tensors"`
	Bytes       int64   `json:"bytes"` // resident over every local rank
	LoadSeconds float64 `json:"load_seconds"`
	// LoaderSeconds is the one loader's own time (allocate, read, copy,
	// seal), without process and driver start-up; 0 where ranks load
	// themselves or start empty.
	LoaderSeconds float64 `json:"loader_seconds,omitempty"`
	Fingerprint   string  `json:"fingerprint"`
	PID           int     `json:"pid"`
	ReadBytes     int64   `json:"read_bytes"`
	DataBytes     int64   `json:"data_bytes"`
	FileBytes     int64   `json:"file_bytes"`
	NNodes        int     `json:"nnodes"`
	NodeRank      int     `json:"node_rank"`
	Health        string  `json:"health,omitempty"`
	// Plan is what the main group's sharding plan replicates (TP > 1).
	Plan *protocol.PlanReport `json:"plan,omitempty"`
	// Source is where the segments came from: "checkpoint", "takeover"
	// (a predecessor preload's, with its pid and version) or "fdstore"
	// (systemd's fd store, from this service's last run). Reason says why
	// a launch asked to take over or restarted under systemd loaded from
	// the checkpoint instead.
	Source        string `json:"source"`
	SourcePID     int    `json:"source_pid,omitempty"`
	SourceVersion string `json:"source_version,omitempty"`
	Reason        string `json:"reason,omitempty"`
	// PeerBytes and StorageBytes are where a load with --peers or
	// --peer-listen got its checkpoint bytes; PeerManifest is the digest
	// of the manifest every piece was checked against (the main group's).
	PeerBytes    *int64 `json:"peer_bytes,omitempty"`
	StorageBytes *int64 `json:"storage_bytes,omitempty"`
	PeerManifest string `json:"peer_manifest,omitempty"`
	// Leases is how many leases a predecessor handed over.
	Leases int `json:"leases,omitempty"`
	// Generation is this launch's ownership of its sockets: one more than
	// the owner it took them from (internal/handover).
	Generation uint64      `json:"generation"`
	Ranks      []ReadyRank `json:"ranks"`
}

// ReadyRank is one rank daemon in the ready line.
type ReadyRank struct {
	Group       string `json:"group"`
	Device      string `json:"device"`
	TPRank      int    `json:"tp_rank"`
	DPRank      int    `json:"dp_rank"`
	Socket      string `json:"socket"`
	PID         int    `json:"pid"`
	Fingerprint string `json:"fingerprint"`
}

func (l *launcher) printReady() error {
	r := &l.report
	line := ReadyLine{
		Event: "ready", Model: l.cfg.Groups[0].Model, Tensors: l.tensors(),
		LoadSeconds: r.localSeconds, LoaderSeconds: r.loadSeconds, PID: os.Getpid(), ReadBytes: r.readBytes, DataBytes: r.dataBytes, FileBytes: r.fileBytes,
		NNodes: l.cfg.Layout.NNodes, NodeRank: l.cfg.Layout.NodeRank, Plan: l.cfg.Groups[0].Report,
	}
	if l.health != nil {
		line.Health = l.health.Addr()
	}
	line.Reason, line.Leases, line.Generation = r.reason, r.leases, l.own.Generation()
	l.source.report(&line)
	if _, loaded := l.source.(loader); loaded && line.Reason == "" {
		line.Reason = l.store.reason // why the fd store's segments were not served
	}
	if pc := l.peers; pc != nil {
		fromPeers, fromStorage := pc.fromPeers.Load(), pc.fromStorage.Load()
		line.PeerBytes, line.StorageBytes = &fromPeers, &fromStorage
		pc.mu.Lock()
		line.PeerManifest = pc.digests[l.cfg.Groups[0].Name]
		pc.mu.Unlock()
	}
	for i, p := range l.procsSnapshot() {
		spec, err := l.spec(l.groupIndex(p.group), p.Rank)
		if err != nil {
			return err
		}
		rr := ReadyRank{Group: p.group, Device: p.Device, TPRank: p.TPRank, DPRank: p.DPRank, Socket: p.socket, PID: p.pid, Fingerprint: spec.Fingerprint.Sum()}
		line.Ranks = append(line.Ranks, rr)
		if i == 0 {
			line.Socket, line.Device, line.Group, line.Fingerprint = rr.Socket, rr.Device, rr.Group, rr.Fingerprint
		}
	}
	if l.cfg.PublishOnly {
		line.Tensors = 0 // served once an engine publishes
	}
	if r.rankLoadSeconds > 0 {
		line.LoadSeconds = r.rankLoadSeconds
	}
	line.Bytes = l.residentBytes()
	l.outMu.Lock()
	err := json.NewEncoder(l.cfg.Stdout).Encode(line)
	l.outMu.Unlock()
	if err != nil {
		return err
	}
	return notifySystemd(os.Getenv("NOTIFY_SOCKET"))
}

func (l *launcher) groupIndex(name string) int {
	for i, g := range l.cfg.Groups {
		if g.Name == name {
			return i
		}
	}
	return 0
}

func (l *launcher) residentBytes() int64 {
	var n int64
	for _, p := range l.procsSnapshot() {
		p.mu.Lock()
		n += p.bytes
		p.mu.Unlock()
	}
	return n
}

// notifySystemd sends READY=1 to $NOTIFY_SOCKET (sd_notify(3)), a unix
// datagram socket; a leading '@' names an abstract socket.
func notifySystemd(addr string) error {
	if addr == "" {
		return nil
	}
	if addr[0] == '@' {
		addr = "\x00" + addr[1:]
	}
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: addr, Net: "unixgram"})
	if err != nil {
		return fmt.Errorf("notify systemd on NOTIFY_SOCKET %s: %w", addr, err)
	}
	defer c.Close()
	// A notify socket nobody reads fills its queue, and a write to it
	// blocks: a preload that serves must not wait on that for ever.
	_ = c.SetWriteDeadline(time.Now().Add(notifyTimeout))
	if _, err := c.Write([]byte("READY=1")); err != nil {
		return fmt.Errorf("notify systemd on NOTIFY_SOCKET %s: %w (is systemd reading its notify socket?)", addr, err)
	}
	return nil
}

// notifyTimeout bounds the READY=1 datagram's wait for room in a full
// notify socket queue.
var notifyTimeout = 10 * time.Second

// tensors is the main group's tensor count, as its first rank's segments
// hold it: every rank holds a part of every tensor, and a checkpoint
// resolved lazily for a takeover is then not parsed for the count.
func (l *launcher) tensors() int {
	for _, p := range l.procsSnapshot() {
		if p.group == l.cfg.Groups[0].Name && p.cache != nil {
			return p.cache.Msg.Tensors
		}
	}
	return l.cfg.Groups[0].Checkpoint.NumTensors()
}
