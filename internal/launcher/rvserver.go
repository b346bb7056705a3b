package launcher

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// rvServer is node 0's side of one group's rendezvous.
type rvServer struct {
	ln      net.Listener
	group   string
	addr    string
	nnodes  int
	timeout time.Duration
	log     *slog.Logger

	mu      sync.Mutex // guards conns; held by broadcast
	conns   []net.Conn
	done    chan struct{}
	closing atomic.Bool // this node is stopping: peers leaving is expected
}

type rvPeer struct {
	conn net.Conn
	enc  *json.Encoder
	dec  *json.Decoder
	join rvMsg
}

type peerMsg struct {
	p   *rvPeer
	msg rvMsg
	err error
}

func listenRendezvous(addr, group string, nnodes int, timeout time.Duration, log *slog.Logger) (*rvServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("node 0: rendezvous for group %s: listen on %s: %w", group, addr, err)
	}
	s := &rvServer{ln: ln, group: group, addr: addr, nnodes: nnodes, timeout: timeout, log: log, done: make(chan struct{})}
	go s.run()
	return s, nil
}

func (s *rvServer) close() {
	s.closing.Store(true)
	_ = s.ln.Close()
	s.mu.Lock()
	for _, c := range s.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	<-s.done
}

func (s *rvServer) run() {
	defer close(s.done)
	peers, err := s.gather()
	_ = s.ln.Close() // every node is in, or the rendezvous failed
	if err == nil {
		err = s.check(peers)
	}
	if err != nil {
		s.log.Error("rendezvous failed", "group", s.group, "addr", s.addr, "err", err)
		s.broadcast(peers, rvMsg{Type: "abort", Error: err.Error()})
		return
	}
	layout := make([][]Rank, s.nnodes)
	for _, p := range peers {
		layout[p.join.Node] = p.join.Ranks
	}
	s.broadcast(peers, rvMsg{Type: "layout", Layout: layout})
	msgs := make(chan peerMsg)
	for _, p := range peers {
		go func() {
			for {
				var m rvMsg
				err := p.dec.Decode(&m)
				select {
				case msgs <- peerMsg{p: p, msg: m, err: err}:
				case <-s.done:
					return
				}
				if err != nil {
					return
				}
			}
		}()
	}
	s.follow(peers, msgs)
}

// gather accepts joins until every node is in or the timeout passes.
func (s *rvServer) gather() ([]*rvPeer, error) {
	arrivals := make(chan peerMsg)
	go s.accept(arrivals)
	timer := time.NewTimer(s.timeout)
	defer timer.Stop()
	byNode := map[int]*rvPeer{}
	var peers []*rvPeer
	for len(byNode) < s.nnodes {
		select {
		case a := <-arrivals:
			if a.err != nil {
				s.log.Warn("rendezvous: bad join", "group", s.group, "err", a.err)
				continue
			}
			peers = append(peers, a.p)
			n := a.msg.Node
			if prev, dup := byNode[n]; dup {
				return peers, fmt.Errorf("node rank %d joined twice, from %s and %s", n, prev.conn.RemoteAddr(), a.p.conn.RemoteAddr())
			}
			if n < 0 || n >= s.nnodes || a.msg.NNodes != s.nnodes {
				return peers, fmt.Errorf("node %d from %s says nnodes %d; node 0 has nnodes %d", n, a.p.conn.RemoteAddr(), a.msg.NNodes, s.nnodes)
			}
			byNode[n] = a.p
		case <-timer.C:
			var missing []int
			for n := range s.nnodes {
				if byNode[n] == nil {
					missing = append(missing, n)
				}
			}
			return peers, fmt.Errorf("node(s) %v never joined the rendezvous for group %s at %s within %s", missing, s.group, s.addr, s.timeout)
		}
	}
	return peers, nil
}

func (s *rvServer) accept(arrivals chan<- peerMsg) {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.conns = append(s.conns, c)
		s.mu.Unlock()
		go func() {
			p := &rvPeer{conn: c, enc: json.NewEncoder(c), dec: json.NewDecoder(c)}
			_ = c.SetReadDeadline(time.Now().Add(s.timeout))
			err := p.dec.Decode(&p.join)
			_ = c.SetReadDeadline(time.Time{})
			if err == nil && p.join.Type != "join" {
				err = fmt.Errorf("first message from %s is %q, not join", c.RemoteAddr(), p.join.Type)
			}
			select {
			case arrivals <- peerMsg{p: p, msg: p.join, err: err}:
			case <-s.done:
			}
		}()
	}
}

// check requires every node to agree with node 0 and the ranks of all
// nodes to cover every (tp_rank, dp_rank) exactly once.
func (s *rvServer) check(peers []*rvPeer) error {
	var zero *rvPeer
	for _, p := range peers {
		if p.join.Node == 0 {
			zero = p
		}
	}
	seen := map[[2]int]int{}
	want := 0
	for _, p := range peers {
		if f, a, b := zero.join.Agree.diff(p.join.Agree); f != "" {
			return fmt.Errorf("node %d (%s) disagrees with node 0 on %s: node 0 has %q, node %d has %q", p.join.Node, p.conn.RemoteAddr(), f, a, p.join.Node, b)
		}
		want = p.join.Agree.Fingerprint.TPSize * p.join.Agree.Fingerprint.DPSize
		for _, r := range p.join.Ranks {
			k := [2]int{r.TPRank, r.DPRank}
			if n, dup := seen[k]; dup {
				return fmt.Errorf("tp_rank %d dp_rank %d is served by node %d and node %d", r.TPRank, r.DPRank, n, p.join.Node)
			}
			seen[k] = p.join.Node
		}
	}
	if len(seen) != want {
		return fmt.Errorf("the nodes serve %d ranks, the layout has %d", len(seen), want)
	}
	return nil
}

// follow waits until every node is ready (then tells them all) or one
// fails (then aborts them all), and afterwards logs nodes that leave.
func (s *rvServer) follow(peers []*rvPeer, msgs <-chan peerMsg) {
	readyNodes := map[int]bool{}
	open := len(peers)
	for open > 0 {
		m := <-msgs
		node := m.p.join.Node
		switch {
		case m.err != nil:
			open--
			if len(readyNodes) < s.nnodes {
				s.abortAll(peers, fmt.Errorf("node %d (%s) left before every node was ready: %v", node, m.p.conn.RemoteAddr(), m.err))
				return
			}
			if s.closing.Load() {
				continue
			}
			s.log.Warn("rendezvous: node left; the other nodes keep serving", "group", s.group, "node", node, "addr", m.p.conn.RemoteAddr().String())
		case m.msg.Type == "failed":
			s.abortAll(peers, fmt.Errorf("node %d (%s) failed: %s", node, m.p.conn.RemoteAddr(), m.msg.Error))
			return
		case m.msg.Type == "ready":
			readyNodes[node] = true
			if len(readyNodes) == s.nnodes {
				s.broadcast(peers, rvMsg{Type: "all_ready"})
			}
		}
	}
}

func (s *rvServer) abortAll(peers []*rvPeer, err error) {
	s.log.Error("rendezvous aborted", "group", s.group, "addr", s.addr, "err", err)
	s.broadcast(peers, rvMsg{Type: "abort", Error: err.Error()})
	for _, p := range peers {
		_ = p.conn.Close()
	}
}

// broadcast holds mu while it writes, so that close (node 0's own launcher
// stopping because of this very message) cannot cut it off before every
// node has it.
func (s *rvServer) broadcast(peers []*rvPeer, m rvMsg) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range slices.Clone(peers) {
		_ = p.conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
		if err := p.enc.Encode(m); err != nil {
			s.log.Warn("rendezvous: send failed", "group", s.group, "node", p.join.Node, "err", err)
		}
	}
}
