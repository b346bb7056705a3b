package daemon

import (
	"errors"
	"fmt"
	"os"

	"github.com/weightcache/weightcache/internal/artifact"
	"github.com/weightcache/weightcache/internal/protocol"
	"github.com/weightcache/weightcache/internal/sockets"
)

// Compile artifacts are kept beside the weights in the socket directory's
// store (internal/artifact), which the ranks of a preload share and which
// outlives any one of them: a rank restart or a takeover finds the sets
// the ranks before it stored. Only a client whose hello was accepted on
// the connection may ask for or store a set: an engine of this daemon's
// model.

// artifactCounts are a daemon's own counts of sets served and of requests
// that found none; guarded by Daemon.mu.
type artifactCounts struct {
	hits   int64
	byID   map[string]int64 // sets served, by set ID
	misses map[string]int64 // by artifact miss kind
}

// openArtifacts opens the store in the socket directory. A store that
// cannot be opened leaves artifacts off, said once: the weights are
// served all the same.
func (d *Daemon) openArtifacts() *artifact.Store {
	dir := sockets.ArtifactDir(d.cfg.SocketDir)
	st, err := artifact.Open(dir, d.cfg.ArtifactBudget, d.log)
	if err != nil {
		d.log.Warn("artifacts: off, the store cannot be opened", "err", err)
		st, _ = artifact.Open(dir, 0, d.log)
	}
	return st
}

func (d *Daemon) artifacts(s *session, fr *protocol.Frame) (reply, error) {
	var req protocol.ArtifactsRequest
	if err := fr.Decode(&req); err != nil {
		return reply{}, err
	}
	// The engine-wide sets (vLLM's model info cache) are asked for before
	// the engine knows its model well enough for a hello: by its plugin,
	// as vLLM starts. They hold no weights and no code, and vLLM checks
	// them against its own sources; the connection is this uid's.
	if req.Rank != artifact.EngineRank {
		if err := needHello(s, fr); err != nil {
			return reply{}, err
		}
	}
	hits, miss := d.art.Get(req.Lookup, req.Rank, req.Config)
	msg := protocol.Artifacts{Head: protocol.NewHead(protocol.TypeArtifacts), Sets: []*artifact.Set{}, Reason: miss.Reason}
	files := make([]*os.File, 0, len(hits))
	keys := make([]string, 0, len(hits))
	d.mu.Lock()
	for _, h := range hits {
		msg.Sets = append(msg.Sets, h.Set)
		files = append(files, h.Pack)
		keys = append(keys, h.Set.Key)
		d.arts.hits++
		d.arts.byID[h.Set.ID()]++
	}
	if len(hits) == 0 {
		d.arts.misses[miss.Kind]++
	}
	d.mu.Unlock()
	if len(hits) > 0 {
		d.log.Info("artifacts: served", "keys", keys, "rank", clip(req.Rank), "client", clientOf(s), "client_pid", s.pid)
	} else {
		d.log.Info("artifacts: none", "reason", clipDetail(miss.Reason), "rank", clip(req.Rank), "client", clientOf(s), "client_pid", s.pid)
	}
	return reply{msg: msg, files: files}, nil
}

// artifactsPut stores the set of an artifacts_put, read from the pack
// descriptor the frame carries. A refused set keeps the connection: the
// client did nothing wrong by offering it.
func (d *Daemon) artifactsPut(s *session, fr *protocol.Frame) (reply, error) {
	if err := needHello(s, fr); err != nil {
		return reply{}, err
	}
	var put protocol.ArtifactsPut
	if err := fr.Decode(&put); err != nil {
		return reply{}, err
	}
	refuse := func(code string, err error) (reply, error) {
		d.log.Warn("artifacts: set refused", "err", err, "client", clip(s.hello.Client), "client_pid", s.pid)
		return reply{}, retryable{protocol.Errorf(code, "daemon on %s: %v", d.ln.path, err)}
	}
	if put.Set == nil {
		return refuse(protocol.CodeBadRequest, errors.New("artifacts_put without a set"))
	}
	if len(fr.Files) != 1 {
		return refuse(protocol.CodeBadRequest, fmt.Errorf("artifacts_put of set %s carries %d descriptors, want 1: the pack", clip(put.Set.Key), len(fr.Files)))
	}
	pack := fr.Files[0]
	st, err := pack.Stat()
	switch {
	case err != nil:
		return refuse(protocol.CodeBadRequest, fmt.Errorf("set %s: the pack: %w", clip(put.Set.Key), err))
	case !st.Mode().IsRegular():
		return refuse(protocol.CodeBadRequest, fmt.Errorf("set %s: the pack is a %s, want a regular file (a memfd)", clip(put.Set.Key), st.Mode().Type()))
	case st.Size() < put.Set.Bytes:
		return refuse(protocol.CodeBadRequest, fmt.Errorf("set %s: the pack is %d bytes, the set says %d", clip(put.Set.Key), st.Size(), put.Set.Bytes))
	}
	stored, err := d.art.Put(put.Set, pack)
	if err != nil {
		code := protocol.CodeBadRequest
		if !errors.Is(err, artifact.ErrInvalid) && !errors.Is(err, artifact.ErrContent) && !errors.Is(err, artifact.ErrOverBudget) && !errors.Is(err, artifact.ErrOff) {
			code = protocol.CodeInternal
		}
		return refuse(code, err)
	}
	d.log.Info("artifacts: stored", "key", stored.Key, "rank", put.Set.Rank, "files", stored.Files, "bytes", stored.Bytes, "evicted", stored.Evicted, "client_pid", s.pid)
	if stored.Evicted == nil {
		stored.Evicted = []string{}
	}
	return reply{msg: protocol.ArtifactsStored{Head: protocol.NewHead(protocol.TypeArtifactsStored),
		Key: stored.Key, Files: stored.Files, Bytes: stored.Bytes, Evicted: stored.Evicted}}, nil
}

// clientOf names s's client as its hello did; an engine-wide request may
// come before any.
func clientOf(s *session) string {
	if s.hello == nil {
		return ""
	}
	return clip(s.hello.Client)
}

func needHello(s *session, fr *protocol.Frame) error {
	if s.hello == nil {
		return protocol.Errorf(protocol.CodeBadRequest, "%s before an accepted hello on this connection", fr.Type)
	}
	return nil
}

// artifactStats fills st's artifact fields: the sets held, with this
// daemon's hits of each. The store is read before d.mu is taken.
func (d *Daemon) artifactStats(st *protocol.Stats, held []artifact.Info) {
	st.ArtifactBudget = d.art.Budget()
	st.ArtifactHits = d.arts.hits
	st.ArtifactMisses = copyMap(d.arts.misses)
	for _, in := range held {
		st.Artifacts = append(st.Artifacts, protocol.ArtifactSet{Key: in.Key, Dir: in.Set.Dir, Rank: in.Rank,
			Files: len(in.Set.Files), Bytes: in.Bytes, Hits: d.arts.byID[in.ID], LastUsed: in.LastUsed})
		st.ArtifactBytes += in.Bytes
	}
}
