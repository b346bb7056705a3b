package models

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/weightcache/weightcache/internal/sockets"
)

// Request is one line a client sends on serve's control socket.
type Request struct {
	Op    string `json:"op"` // load, drop, list
	Spec         // load, drop
	Force bool   `json:"force,omitempty"` // drop
	// WhenUnused drops the model once its last lease ends (at once if
	// it has none): a version an engine switched away from.
	WhenUnused bool `json:"when_unused,omitempty"`
}

// Reply is serve's one line back.
type Reply struct {
	Error     string   `json:"error,omitempty"`
	NoRoom    bool     `json:"no_room,omitempty"` // the error is ErrNoRoom's
	Loaded    *Loaded  `json:"loaded,omitempty"`
	Dropped   *Status  `json:"dropped,omitempty"`
	Models    []Status `json:"models,omitempty"`
	Budget    int64    `json:"budget"`
	Loads     int64    `json:"loads"`
	Evictions int64    `json:"evictions"`
}

// Listen takes the control socket of dir. A serve already answering there
// is an error; a socket file left by a dead one is replaced.
func Listen(dir string) (*net.UnixListener, error) {
	path := sockets.ServePath(dir)
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		return nil, fmt.Errorf("%s: another weightcache serve manages %s", path, dir)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("control socket %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

// Serve answers control requests on ln until it is closed. ctx bounds the
// loads (a serve that stops gives up a load in progress).
func (m *Manager) Serve(ctx context.Context, ln *net.UnixListener) {
	go m.reap(ctx)
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			return
		}
		go m.answer(ctx, c)
	}
}

func (m *Manager) answer(ctx context.Context, c *net.UnixConn) {
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := bufio.NewReader(c).ReadBytes('\n')
	_ = c.SetReadDeadline(time.Time{})
	var req Request
	var rep Reply
	if err == nil {
		err = json.Unmarshal(line, &req)
	}
	if err != nil {
		rep.Error = fmt.Sprintf("control request on %s: %v", sockets.ServePath(m.cfg.SocketDir), err)
	} else {
		switch req.Op {
		case "load":
			rep.Loaded, err = m.Load(ctx, req.Spec)
		case "drop":
			rep.Dropped, err = m.Drop(ctx, req.Spec, req.Force, req.WhenUnused)
		case "list":
			rep.Models = m.List(ctx)
		default:
			err = fmt.Errorf("control request op %q: want load, drop or list", req.Op)
		}
		if err != nil {
			rep.Error, rep.NoRoom = err.Error(), errors.Is(err, ErrNoRoom)
		}
	}
	rep.Budget = m.cfg.Budget
	rep.Loads, rep.Evictions = m.Counts()
	_ = json.NewEncoder(c).Encode(rep)
}

// Ask sends req to the serve managing dir and returns its reply; a reply
// that carries an error is returned with it as an error.
func Ask(ctx context.Context, dir string, req Request) (*Reply, error) {
	path := sockets.ServePath(dir)
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("no weightcache serve manages %s (%s: %w)", dir, path, err)
		}
		return nil, fmt.Errorf("control socket %s: %w", path, err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	defer stop()
	b, _ := json.Marshal(req)
	if _, err := c.Write(append(b, '\n')); err != nil {
		return nil, fmt.Errorf("control socket %s: %w", path, err)
	}
	var rep Reply
	if err := json.NewDecoder(c).Decode(&rep); err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return nil, fmt.Errorf("control socket %s: no reply: %w", path, err)
	}
	if rep.Error != "" {
		e := errors.New(rep.Error)
		if rep.NoRoom {
			e = noRoom{rep.Error}
		}
		return &rep, e
	}
	return &rep, nil
}

// noRoom carries a serve's budget refusal across the socket, for errors.Is.
type noRoom struct{ msg string }

func (n noRoom) Error() string        { return n.msg }
func (n noRoom) Is(target error) bool { return target == ErrNoRoom }
