// Package rank is the rank process (`weightcache daemon`, started by the
// launcher once per device and group): it takes the socket its launcher
// hands it, runs the device server (internal/daemon) on it, and speaks the
// control channel on fd 3 (control.go) for as long as it lives: segments
// in, ready out, pings, leases, and its side of a handover.
package rank

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/weightcache/weightcache/internal/backend"
	"github.com/weightcache/weightcache/internal/backend/cuda"
	"github.com/weightcache/weightcache/internal/backend/host"
	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/daemon"
	"github.com/weightcache/weightcache/internal/protocol"
	"github.com/weightcache/weightcache/internal/sockets"
)

// Serve is the rank daemon (`weightcache daemon`): it takes its socket
// in state loading, waits for the launcher's segments, serves them, and
// drains when ctx ends (SIGINT/SIGTERM) or the launcher goes away.
func Serve(ctx context.Context, ctl *protocol.Conn, log *slog.Logger) error {
	launcher := getppid()
	fr, err := ctl.Recv()
	if err != nil {
		return fmt.Errorf("read rank spec from the launcher: %w", err)
	}
	var spec Spec
	if err := fr.Decode(&spec); err != nil || fr.Type != TypeSpec {
		return fmt.Errorf("rank spec from the launcher: type %q: %v", fr.Type, err)
	}
	if !spec.SelfLoad {
		// Only a rank that loads itself stages: pin nothing here.
		spec.GPU.Stages = 0
	}
	sock, err := awaitSocket(ctl, spec)
	if err != nil {
		return err
	}
	be, err := NewBackend(spec.Device, spec.GPU)
	if err != nil {
		sock.Close()
		return err
	}
	d, err := startRank(spec, be, sock, launcherLeases{ctl}, log)
	if err != nil {
		sock.Close()
		return errors.Join(err, be.Close())
	}
	if err := ctl.Send(Listening{Head: protocol.NewHead(TypeListening), Socket: d.Socket(), PID: os.Getpid()}); err != nil {
		d.Shutdown(context.Background())
		return fmt.Errorf("rank %s: tell the launcher: %w", spec.Device, err)
	}
	frames := make(chan *protocol.Frame)
	// gone closes when the launcher's end of the control channel does: it
	// died, whatever this rank is doing then (loading, serving, draining,
	// handing over), and the socket is let go at once.
	gone := make(chan struct{})
	released := make(chan struct{})
	go func() {
		<-gone
		launcherGone(d, spec)
		close(released)
	}()
	acked := make(chan struct{})
	defer func() {
		select {
		case <-gone:
		default:
			if ctl.Send(protocol.NewHead(TypeBye)) == nil {
				select {
				case <-acked:
					return
				case <-gone:
				case <-time.After(2 * time.Second):
					return
				}
			}
			<-gone
		}
		<-released
	}()
	go func() {
		for {
			fr, err := ctl.Recv()
			if err != nil {
				close(gone)
				return
			}
			if fr.Type == TypeAck {
				close(acked)
				continue
			}
			if fr.Type == TypeProgress {
				var pr Progress
				if fr.Decode(&pr) == nil {
					d.SetProgress(pr.Done, pr.Total)
				}
				continue
			}
			if fr.Type == TypePing {
				// Pings come only once this rank said ready, so this is
				// the only sender left.
				_ = ctl.Send(protocol.NewHead(TypePong))
				continue
			}
			frames <- fr
		}
	}()
	switch {
	case spec.PublishOnly:
		// Nothing to wait for: the daemon starts empty and engines fill it.
		err = ctl.Send(Ready{Head: protocol.NewHead(TypeReady)})
	case spec.SelfLoad:
		if err = d.Load(ctx); err == nil {
			st := d.Stats()
			err = ctl.Send(Ready{Head: protocol.NewHead(TypeReady), Bytes: st.Bytes, LoadSeconds: st.LoadSeconds})
		}
	default:
		select {
		case fr := <-frames:
			err = adoptFrame(d, be, spec, fr)
			if err == nil {
				err = ctl.Send(Ready{Head: protocol.NewHead(TypeReady), Bytes: d.Stats().Bytes})
			}
		case <-ctx.Done():
			err = fmt.Errorf("rank %s interrupted while loading%s", spec.Device, launcherDied(launcher))
		case <-gone:
			err = fmt.Errorf("rank %s: the launcher went away while loading%s", spec.Device, launcherDied(launcher))
		}
	}
	if err != nil {
		d.Shutdown(context.Background())
		return err
	}
	if handed, err := serveReady(ctx, d, ctl, frames, gone, log); handed || err != nil {
		return err
	}
	if n := d.Leases(); n > 0 {
		log.Info("draining: waiting for zero_copy leases to end", "leases", n, "timeout", spec.DrainTimeout)
	}
	if left := d.Shutdown(context.Background()); left > 0 {
		log.Warn("stopped with live leases; their mappings stay valid until those engines exit", "leases", left)
	}
	log.Info("stopped: segments freed")
	return nil
}

// NewBackend returns the backend for one device key (launcher.ParseDevices
// checks them); gpu configures a GPU's.
func NewBackend(device string, gpu cuda.Options) (backend.Backend, error) {
	if strings.HasPrefix(device, "GPU-") {
		return cuda.New(device, gpu)
	}
	return host.New(device)
}

// awaitSocket waits for the socket the launcher took for this rank. It
// may come long after the spec: a successor preload gets it from its
// predecessor once its own segments are filled.
func awaitSocket(ctl *protocol.Conn, spec Spec) (*sockets.Socket, error) {
	for {
		fr, err := ctl.Recv()
		if err != nil {
			return nil, fmt.Errorf("rank %s: launcher went away before handing over its socket: %w", spec.Device, err)
		}
		switch fr.Type {
		case TypeProgress:
			fr.CloseFiles()
			continue
		case TypeSocket:
		default:
			fr.CloseFiles()
			return nil, fmt.Errorf("rank %s: expected its socket from the launcher, got %q", spec.Device, fr.Type)
		}
		if len(fr.Files) != 2 {
			fr.CloseFiles()
			return nil, fmt.Errorf("rank %s: socket frame with %d descriptors, want a listener and a lock", spec.Device, len(fr.Files))
		}
		path, err := sockets.Path(spec.SocketDir, spec.Group, spec.Device)
		if err != nil {
			fr.CloseFiles()
			return nil, err
		}
		return sockets.FromFiles(path, fr.Files[0], fr.Files[1])
	}
}

// serveReady serves until ctx ends or the launcher goes away, adopting the
// leases a successor's launcher sends, or handing this rank's over when a
// predecessor's launcher asks. handed reports the latter: then the rank
// has stopped, leaving its socket to the successor.
func serveReady(ctx context.Context, d *daemon.Daemon, ctl *protocol.Conn, frames <-chan *protocol.Frame, gone <-chan struct{}, log *slog.Logger) (handed bool, err error) {
	for {
		select {
		case <-ctx.Done():
			return false, nil
		case <-gone:
			log.Warn("launcher went away: stopping")
			return false, nil
		case fr := <-frames:
			switch fr.Type {
			case TypeLeases:
				m, err := DecodeLeases(fr)
				if err == nil {
					err = d.AdoptLeases(m.Leases, fr.Files)
				}
				if err != nil {
					log.Warn("leases handed over by the predecessor", "err", err)
				} else {
					log.Info("adopted leases from the predecessor", "leases", len(m.Leases))
				}
			case TypeHandover:
				var m Handover
				err := fr.Decode(&m)
				fr.CloseFiles()
				if err == nil && !m.Leases {
					d.StopAccepting()
					// No lease goes: an empty last frame says this rank
					// accepts no more, before the successor is ready.
					if err := SendLeases(ctl, nil, nil); err != nil {
						log.Warn("could not tell the launcher this rank stopped accepting", "err", err)
					}
					if n := d.Leases(); n > 0 {
						log.Info("successor serves another load: draining leases here", "leases", n)
					}
					d.Shutdown(context.Background())
					return true, nil
				}
				leases, files := d.HandOver()
				err = SendLeases(ctl, leases, files)
				for _, f := range files {
					_ = f.Close()
				}
				d.Shutdown(context.Background())
				if err != nil {
					return true, fmt.Errorf("hand %d leases to the launcher: %w", len(leases), err)
				}
				log.Info("stopped: handed over to a successor, socket left to it")
				return true, nil
			default:
				fr.CloseFiles()
				log.Warn("unexpected frame from the launcher", "type", fr.Type)
			}
		}
	}
}

func startRank(spec Spec, be backend.Backend, sock *sockets.Socket, leases daemon.LeaseWatcher, log *slog.Logger) (*daemon.Daemon, error) {
	// Only a rank that loads itself reads the checkpoint: the launcher
	// parsed every header once for the others.
	var ckpt *checkpoint.Checkpoint
	if spec.SelfLoad && !spec.PublishOnly {
		var err error
		if ckpt, err = checkpoint.Resolve(spec.Dir, spec.Revision); err != nil {
			return nil, err
		}
	}
	return daemon.Start(daemon.Config{
		Settings: spec.Settings, Model: spec.Model, Checkpoint: ckpt, Fingerprint: spec.Fingerprint,
		DType: spec.Fingerprint.DType, Backend: be, Group: spec.Group, Logger: log, PlanReport: spec.Plan, Socket: sock, Leases: leases,
	})
}

// adoptFrame imports the segments on fr and serves them. The frame's fds are
// owned by the segments once imported; the rest are closed.
func adoptFrame(d *daemon.Daemon, be backend.Backend, spec Spec, fr *protocol.Frame) error {
	if fr.Type != TypeSegments {
		fr.CloseFiles()
		return fmt.Errorf("rank %s: expected segments from the launcher, got %q", spec.Device, fr.Type)
	}
	var m Segments
	if err := fr.Decode(&m); err != nil {
		fr.CloseFiles()
		return err
	}
	if len(m.Segments)+1 != len(fr.Files) {
		fr.CloseFiles()
		return fmt.Errorf("rank %s: %d segments and an index named, %d descriptors sent", spec.Device, len(m.Segments), len(fr.Files))
	}
	imp, ok := be.(backend.Importer)
	if !ok {
		fr.CloseFiles()
		return fmt.Errorf("rank %s: backend cannot import segments", spec.Device)
	}
	segs := make([]backend.Segment, 0, len(m.Segments))
	var ierr error
	for i, s := range m.Segments {
		if ierr != nil {
			_ = fr.Files[i].Close()
			continue
		}
		seg, err := imp.Import(fr.Files[i], s.Size)
		if err != nil {
			ierr = fmt.Errorf("rank %s: segment %d: %w", spec.Device, i, err)
			continue
		}
		segs = append(segs, seg)
	}
	var index backend.Segment
	if ierr == nil {
		// The index is host memory whatever the rank's device.
		hb, err := host.New("host")
		if err == nil {
			index, err = hb.Import(fr.Files[len(m.Segments)], m.IndexSize)
		} else {
			_ = fr.Files[len(m.Segments)].Close()
		}
		if err != nil {
			ierr = fmt.Errorf("rank %s: manifest index: %w", spec.Device, err)
		}
	} else {
		_ = fr.Files[len(m.Segments)].Close()
	}
	if ierr != nil {
		for _, s := range segs {
			_ = s.Free()
		}
		return ierr
	}
	if err := d.Adopt(segs, index, m.Tensors, m.DataBytes, m.Identity, time.Duration(m.LoadMS)*time.Millisecond, m.ReadBytes); err != nil {
		return errors.Join(fmt.Errorf("rank %s", spec.Device), err)
	}
	return nil
}

// launcherGone lets go of the socket at once, before any drain: a
// successor that took it over, or the next preload, serves it while the
// leases here drain. It goes from the directory only if no process holds
// it any more; the first rank clears the dead launcher's control socket
// the same way. The owner file stays: it records the generation, which the
// next launcher continues.
func launcherGone(d *daemon.Daemon, spec Spec) {
	d.LauncherGone()
	if spec.ControlSocket != "" {
		sockets.RemoveUnheld(spec.ControlSocket)
	}
}

// getppid is os.Getppid, a variable so that a test can be reparented.
var getppid = os.Getppid

// launcherDied says why loading stopped when the launcher died: a launcher
// that dies while loading without a word of its own (it would have stopped
// its ranks and said why) was killed by SIGKILL, and during a load that is
// most often the OOM killer. A rank is reparented when its launcher dies.
func launcherDied(launcher int) string {
	if getppid() == launcher {
		return ""
	}
	return fmt.Sprintf(": its launcher (pid %d) died, which without a message of its own means SIGKILL, most likely the OOM killer: "+
		"check `dmesg` and the memory cgroup's memory.max against the checkpoint size", launcher)
}
