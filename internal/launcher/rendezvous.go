package launcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/weightcache/weightcache/internal/checkpoint"
)

// Multi-node: node 0 hosts one rendezvous per group on --master-addr and
// the group's port. Every node (node 0 too, over TCP like the others)
// joins with what must agree and its ranks; node 0 checks them and sends
// the global layout, or an abort naming the node and field that differ.
// Nodes then load, report ready or failed, and get all_ready or abort: a
// node that fails stops every node, and a ready line means every node
// serves. Every wait is bounded by RendezvousTimeout.

// rvMsg is one JSON line of the rendezvous.
type rvMsg struct {
	Type   string     `json:"type"` // join, layout, ready, failed, all_ready, abort
	Node   int        `json:"node"`
	NNodes int        `json:"nnodes,omitempty"`
	Agree  *agreement `json:"agree,omitempty"`
	Ranks  []Rank     `json:"ranks,omitempty"`
	Layout [][]Rank   `json:"layout,omitempty"` // by node
	Error  string     `json:"error,omitempty"`
}

// agreement is what every node must have identically: the fingerprint
// with its ranks zeroed (each node serves other ranks), compared field by
// field from its one list, and the number of local devices.
type agreement struct {
	Group        string                 `json:"group"`
	Fingerprint  checkpoint.Fingerprint `json:"fingerprint"`
	LocalDevices int                    `json:"local_devices"`
}

func agreementOf(g Group, fp checkpoint.Fingerprint, devices int) *agreement {
	fp.TPRank, fp.DPRank = 0, 0
	return &agreement{Group: g.Name, Fingerprint: fp, LocalDevices: devices}
}

// diff names the first field in which b differs from a.
func (a *agreement) diff(b *agreement) (field, av, bv string) {
	if a.Group != b.Group {
		return "group", a.Group, b.Group
	}
	if d := checkpoint.Diff(a.Fingerprint, b.Fingerprint); len(d) > 0 {
		return d[0].Field, d[0].Want, d[0].Got
	}
	if a.LocalDevices != b.LocalDevices {
		return "local devices", strconv.Itoa(a.LocalDevices), strconv.Itoa(b.LocalDevices)
	}
	return "", "", ""
}

// member is this node's side of one group's rendezvous.
type member struct {
	group   string
	addr    string
	node    int
	timeout time.Duration
	conn    net.Conn
	enc     *json.Encoder
	dec     *json.Decoder
	server  *rvServer  // node 0 only
	msgs    chan rvMsg // after the layout: node 0's messages; closed when the connection ends
	lost    error      // why msgs was closed
	closing atomic.Bool
}

// join runs the first rendezvous step for every group when there are
// several nodes.
func (l *launcher) join(ctx context.Context, cancel context.CancelCauseFunc) error {
	lay := l.cfg.Layout
	if lay.NNodes <= 1 {
		return nil
	}
	for _, g := range l.cfg.Groups {
		fp, err := g.Checkpoint.Fingerprint(checkpoint.Request{Model: g.Model, DType: g.DType, TPSize: lay.TP, DPSize: lay.DP})
		if err != nil {
			return err
		}
		addr := net.JoinHostPort(l.cfg.MasterAddr, strconv.Itoa(g.MasterPort))
		m := &member{group: g.Name, addr: addr, node: lay.NodeRank, timeout: l.cfg.RendezvousTimeout, msgs: make(chan rvMsg, 4)}
		l.nodes = append(l.nodes, m)
		if lay.NodeRank == 0 {
			if m.server, err = listenRendezvous(addr, g.Name, lay.NNodes, l.cfg.RendezvousTimeout, l.log); err != nil {
				return err
			}
		}
		layout, err := m.join(ctx, rvMsg{Type: "join", Node: lay.NodeRank, NNodes: lay.NNodes, Agree: agreementOf(g, fp, len(l.cfg.Devices)), Ranks: l.ranks})
		if err != nil {
			return err
		}
		l.log.Info("rendezvous: every node joined", "group", g.Name, "addr", addr, "nodes", len(layout))
		go m.follow(func(err error) {
			if l.phase.now() == phaseStarting {
				cancel(err)
				return
			}
			l.log.Warn("rendezvous connection ended; this node keeps serving", "group", m.group, "addr", m.addr, "err", err)
		})
	}
	return nil
}

// barrier reports this node ready and waits until every node is.
func (l *launcher) barrier(ctx context.Context) error {
	for _, m := range l.nodes {
		if err := m.ready(ctx); err != nil {
			return err
		}
	}
	return nil
}

func (m *member) join(ctx context.Context, hello rvMsg) ([][]Rank, error) {
	if err := m.dial(ctx); err != nil {
		return nil, err
	}
	if err := m.enc.Encode(hello); err != nil {
		return nil, fmt.Errorf("node %d: rendezvous for group %s at %s: %w", m.node, m.group, m.addr, err)
	}
	reply, err := m.await(ctx, "layout")
	if err != nil {
		return nil, err
	}
	return reply.Layout, nil
}

// ready reports this node ready and waits for every node, bounded by the
// timeout.
func (m *member) ready(ctx context.Context) error {
	if err := m.enc.Encode(rvMsg{Type: "ready", Node: m.node}); err != nil {
		return fmt.Errorf("node %d: rendezvous for group %s at %s: %w", m.node, m.group, m.addr, err)
	}
	timer := time.NewTimer(m.timeout)
	defer timer.Stop()
	select {
	case msg, ok := <-m.msgs:
		switch {
		case !ok:
			return m.lost
		case msg.Type != "all_ready":
			return fmt.Errorf("rendezvous for group %s at %s: got %q, want all_ready", m.group, m.addr, msg.Type)
		}
		return nil
	case <-timer.C:
		return fmt.Errorf("node %d: rendezvous for group %s at %s: not every node was ready within %s of this one", m.node, m.group, m.addr, m.timeout)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// follow reads node 0's messages once the layout is agreed. An abort, or
// the connection ending, is reported to lost: during start-up that stops
// this node even while it is still loading.
func (m *member) follow(lost func(error)) {
	_ = m.conn.SetReadDeadline(time.Time{})
	for {
		var msg rvMsg
		err := m.dec.Decode(&msg)
		if err == nil && msg.Type == "abort" {
			err = fmt.Errorf("rendezvous for group %s at %s aborted: %s", m.group, m.addr, msg.Error)
		} else if err != nil {
			err = fmt.Errorf("node %d: rendezvous for group %s at %s closed (node 0 gone?): %w", m.node, m.group, m.addr, err)
		}
		if err != nil {
			m.lost = err
			close(m.msgs)
			if !m.closing.Load() {
				lost(err)
			}
			return
		}
		m.msgs <- msg
	}
}

// dial connects to node 0, retrying until the timeout: node 0 may start
// after this node.
func (m *member) dial(ctx context.Context) error {
	deadline := time.Now().Add(m.timeout)
	var d net.Dialer
	for {
		cctx, cancel := context.WithDeadline(ctx, deadline)
		c, err := d.DialContext(cctx, "tcp", m.addr)
		cancel()
		if err == nil {
			m.conn, m.enc, m.dec = c, json.NewEncoder(c), json.NewDecoder(c)
			return nil
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return fmt.Errorf("node %d: rendezvous for group %s: node 0 at %s not reachable within %s: %w", m.node, m.group, m.addr, m.timeout, err)
		}
		select {
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
		}
	}
}

// await reads the next message, bounded by the timeout and ctx.
func (m *member) await(ctx context.Context, want string) (rvMsg, error) {
	_ = m.conn.SetReadDeadline(time.Now().Add(m.timeout))
	stop := context.AfterFunc(ctx, func() { _ = m.conn.SetReadDeadline(time.Now()) })
	defer stop()
	var msg rvMsg
	err := m.dec.Decode(&msg)
	var ne net.Error
	switch {
	case ctx.Err() != nil:
		return msg, ctx.Err()
	case errors.As(err, &ne) && ne.Timeout():
		return msg, fmt.Errorf("node %d: rendezvous for group %s at %s: no %s within %s", m.node, m.group, m.addr, want, m.timeout)
	case err != nil:
		return msg, fmt.Errorf("node %d: rendezvous for group %s at %s closed (node 0 gone?): %w", m.node, m.group, m.addr, err)
	case msg.Type == "abort":
		return msg, fmt.Errorf("rendezvous for group %s at %s aborted: %s", m.group, m.addr, msg.Error)
	case msg.Type != want:
		return msg, fmt.Errorf("rendezvous for group %s at %s: got %q, want %q", m.group, m.addr, msg.Type, want)
	}
	return msg, nil
}

// fail tells node 0 this node failed, so that every node stops.
func (m *member) fail(err error) {
	if m.enc != nil {
		_ = m.conn.SetWriteDeadline(time.Now().Add(time.Second))
		_ = m.enc.Encode(rvMsg{Type: "failed", Node: m.node, Error: err.Error()})
	}
	m.close()
}

func (m *member) close() {
	m.closing.Store(true)
	if m.conn != nil {
		_ = m.conn.Close()
	}
	if m.server != nil {
		m.server.close()
	}
}
