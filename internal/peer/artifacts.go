package peer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/weightcache/weightcache/internal/artifact"
)

// Compile artifacts travel between nodes beside the checkpoints: a node
// serving peers lists the sets its store holds (their manifests) and sends
// a set's pack, under the same authentication, connection and send slots
// and rate as pieces. Artifacts are code: a manifest digest or the hub's
// blob names vouch for a checkpoint's bytes, not for what an engine
// compiled, so a seeder takes sets only from peers it trusts outright
// (--peer-trust-peers, with peers that prove themselves), and every file
// is checked against its set's SHA-256 before it is stored.

// packRate is the slowest a pack may come, beyond pieceWaits x Timeout:
// a pack's deadline grows with its size, and is a deadline all the same.
const packRate = 8 << 20

func (sv *Server) artifactList(w http.ResponseWriter, r *http.Request) {
	if sv.relayedArtifacts(w, r) {
		return
	}
	st := sv.Artifacts
	if st == nil || st.Budget() == 0 {
		http.Error(w, "this node holds no artifacts", http.StatusNotFound)
		return
	}
	// The most recently used sets first, as many as a seeder reads.
	var body bytes.Buffer
	body.WriteByte('[')
	for _, in := range st.List() {
		b, err := json.Marshal(in.Set)
		if err != nil || body.Len()+len(b)+2 > artifact.MaxManifestBytes {
			break
		}
		if body.Len() > 1 {
			body.WriteByte(',')
		}
		body.Write(b)
	}
	body.WriteByte(']')
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(body.Len()))
	_, _ = w.Write(body.Bytes())
}

func (sv *Server) artifactPack(w http.ResponseWriter, r *http.Request) {
	if sv.relayedArtifacts(w, r) {
		return
	}
	st := sv.Artifacts
	if st == nil {
		http.Error(w, "this node holds no artifacts", http.StatusNotFound)
		return
	}
	h, err := st.Open(r.PathValue("id"))
	if err != nil {
		http.Error(w, "this node does not hold artifact set "+r.PathValue("id"), http.StatusNotFound)
		return
	}
	defer h.Pack.Close()
	end, ok := sv.admitSend(w, r)
	if !ok {
		return
	}
	defer end()
	w.Header().Set("Content-Length", strconv.FormatInt(h.Set.Bytes, 10))
	cw := &countWriter{w: w, rc: http.NewResponseController(w), sv: sv, ctx: r.Context()}
	if _, err := io.Copy(cw, io.NewSectionReader(h.Pack, 0, h.Set.Bytes)); err != nil {
		sv.say(slog.LevelDebug, "sending artifacts to a peer failed", r.RemoteAddr, err.Error())
	}
}

// Artifacts stores the compile artifact sets the peers hold and st does
// not, each file checked against its set by st.Put, as long as they fit
// in what st's budget leaves free: a seed evicts none of this node's own
// sets. A peer that serves a set whose bytes do not match it, or a
// manifest that is not one, is asked nothing more. It takes nothing
// unless the seeder trusts its peers outright (Trust, with peers that
// prove themselves), and it ends within the deadlines of its requests,
// whatever the peers do. It returns how many sets it stored.
func (sd *Seeder) Artifacts(ctx context.Context, st *artifact.Store) int {
	if st == nil || st.Budget() == 0 {
		return 0
	}
	if !sd.Trust || !sd.Auth.AuthenticatesServer() {
		sd.Log.Info("artifacts: not taken from peers without --peer-trust-peers")
		return 0
	}
	defer sd.connect()()
	peers, err := sd.resolve(ctx)
	if err != nil {
		sd.Log.Warn("artifacts: no peer to take them from", "err", err)
		return 0
	}
	held := map[string]bool{}
	free := st.Budget()
	for _, in := range st.List() {
		held[in.ID] = true
		free -= in.Bytes
	}
	stored := 0
	for _, p := range peers {
		sets, err := sd.artifactList(ctx, p)
		if err != nil {
			sd.note(slog.LevelWarn, "artifacts: a peer's list of sets is not taken", p, err)
			continue
		}
		for _, set := range sets {
			if held[set.ID()] || set.Bytes > free {
				continue
			}
			if err := sd.artifactSet(ctx, p, set, st); err != nil {
				if errors.Is(err, artifact.ErrContent) {
					sd.note(slog.LevelError, "artifacts: peer served a set whose bytes do not match it: not stored, and the peer is not asked again", p, err)
					break
				}
				sd.note(slog.LevelWarn, "artifacts: a set from a peer is not stored", p, err, "key", set.Key)
				if ctx.Err() != nil {
					return stored
				}
				continue
			}
			held[set.ID()] = true
			free -= set.Bytes
			stored++
			sd.Log.Info("artifacts: stored a set from a peer", "peer", p.base, "key", set.Key, "rank", set.Rank, "files", len(set.Files), "bytes", set.Bytes)
		}
	}
	return stored
}

// ofCheckpoint is the query that names Checkpoint, or "".
func (sd *Seeder) ofCheckpoint() string {
	if sd.Checkpoint == "" {
		return ""
	}
	return "?checkpoint=" + url.QueryEscape(sd.Checkpoint)
}

// artifactList is the sets p holds, each a valid manifest: a list with
// one that is not is not taken.
func (sd *Seeder) artifactList(ctx context.Context, p *remote) ([]*artifact.Set, error) {
	raw, _, err := sd.get(ctx, p.base+"/v1/artifacts"+sd.ofCheckpoint(), artifact.MaxManifestBytes)
	if err != nil {
		return nil, err
	}
	var sets []*artifact.Set
	if err := json.Unmarshal(raw, &sets); err != nil {
		return nil, fmt.Errorf("the list of artifact sets: %w", err)
	}
	for _, set := range sets {
		if set == nil {
			return nil, errors.New("the list of artifact sets holds a null")
		}
		if err := set.Validate(); err != nil {
			return nil, err
		}
	}
	return sets, nil
}

// artifactSet takes set's pack from p, exactly set.Bytes bytes within its
// deadline, and stores it in st, which checks every file.
func (sd *Seeder) artifactSet(ctx context.Context, p *remote, set *artifact.Set, st *artifact.Store) error {
	wait := pieceWaits*sd.timeout + time.Duration(set.Bytes/packRate)*time.Second
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	resp, err := sd.getExact(ctx, p.base+"/v1/artifacts/"+set.ID()+"/pack"+sd.ofCheckpoint(), "pack", set.Bytes)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	pack, err := memfd("artifacts "+set.ID(), 0)
	if err != nil {
		return err
	}
	defer pack.Close()
	n, err := io.Copy(pack, io.LimitReader(resp.Body, set.Bytes+1))
	switch {
	case err != nil && ctx.Err() != nil:
		return fmt.Errorf("%d of %d bytes in %s: %w", n, set.Bytes, wait, context.Cause(ctx))
	case err != nil:
		return fmt.Errorf("%d of %d bytes: %w", n, set.Bytes, err)
	case n > set.Bytes:
		return fmt.Errorf("%w: set %s: a pack of %d bytes sent with more", artifact.ErrContent, set.Key, set.Bytes)
	}
	_, err = st.Put(set, pack)
	return err
}
