package client

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"strings"

	"github.com/weightcache/weightcache/internal/sockets"
)

// errNoRankDaemon: no daemon in the socket directory serves the engine's
// group and ranks.
var errNoRankDaemon = errors.New("no daemon serves these ranks")

// rankDevice is the device the engine named, or, where it named none, the
// device of the daemon in the socket directory that serves its group and
// ranks (host or GPU), so that a tensor-parallel engine finds its rank's
// daemon from its ranks alone; sock is the socket it was found on.
//
// The socket a one-node host preload gives the rank (main-host_<g>.sock,
// g = dp_rank x tp + tp_rank) is asked first, then every other at once: a
// stopped daemon costs one connect timeout, not one each. Where none serves
// the ranks, the error names the rank's socket and what each socket said,
// so that a dead rank is not reported as main-host.sock.
func rankDevice(ctx context.Context, o options) (device, sock string, err error) {
	if o.device != "" {
		return o.device, "", nil
	}
	if o.req.TPSize <= 1 && o.req.DPSize <= 1 {
		return "host", "", nil
	}
	guess, err := sockets.Path(o.socketDir, o.group, fmt.Sprintf("host:%d", max(o.req.DPRank, 0)*o.req.TPSize+o.req.TPRank))
	if err != nil {
		return "", "", err
	}
	if err := sockets.CheckDir(o.socketDir); err != nil {
		return "", guess, err
	}
	plain, err := sockets.Path(o.socketDir, o.group, "host")
	if err != nil {
		return "", guess, err
	}
	st, err := statsWithin(ctx, guess, o)
	if err == nil && servesRanks(st, o) {
		return st.Device, guess, nil
	}
	notes := []string{filepath.Base(guess) + ": " + said(st, err)}
	socks, err := sockets.List(o.socketDir)
	if err != nil {
		return "", guess, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // the others stop asking once one serves the ranks
	type reply struct {
		sock string
		st   *DaemonStatus
		err  error
	}
	replies := make(chan reply, len(socks))
	asked := 0
	for _, s := range socks {
		if s == guess {
			continue
		}
		asked++
		go func() {
			st, err := statsWithin(ctx, s, o)
			replies <- reply{s, st, err}
		}()
	}
	plainAnswered := false
	for range asked {
		r := <-replies
		if r.err == nil && servesRanks(r.st, o) {
			return r.st.Device, r.sock, nil
		}
		plainAnswered = plainAnswered || r.sock == plain && r.err == nil
		notes = append(notes, filepath.Base(r.sock)+": "+said(r.st, r.err))
	}
	if plainAnswered {
		// A daemon without ranks: its mismatch names the differing fields,
		// which says more than no_daemon.
		return "host", plain, nil
	}
	sort.Strings(notes[1:])
	if len(notes) > 9 {
		notes = append(notes[:9], fmt.Sprintf("%d more", len(notes)-9))
	}
	return "", guess, fmt.Errorf("%w: group %s tp_rank %d of %d, dp_rank %d of %d in %s (%s)",
		errNoRankDaemon, o.group, o.req.TPRank, o.req.TPSize, o.req.DPRank, max(o.req.DPSize, 1), o.socketDir, strings.Join(notes, "; "))
}

// statsWithin asks one socket within the connect timeout.
func statsWithin(ctx context.Context, sock string, o options) (*DaemonStatus, error) {
	ctx, cancel := context.WithTimeout(ctx, o.connectTimeout)
	defer cancel()
	return StatsOf(ctx, sock)
}

func servesRanks(st *DaemonStatus, o options) bool {
	fp := st.Fingerprint
	return st.Group == o.group && fp.TPSize == o.req.TPSize && fp.TPRank == o.req.TPRank &&
		max(fp.DPSize, 1) == max(o.req.DPSize, 1) && fp.DPRank == o.req.DPRank
}

// said is what a socket answered, short: its ranks, or why it did not.
func said(st *DaemonStatus, err error) string {
	if err != nil {
		var op interface{ Unwrap() error }
		for errors.As(err, &op) && op.Unwrap() != nil && !errors.Is(op.Unwrap(), context.DeadlineExceeded) {
			err = op.Unwrap()
		}
		return "no answer (" + err.Error() + ")"
	}
	fp := st.Fingerprint
	return fmt.Sprintf("serves group %s tp_rank %d of %d, dp_rank %d of %d", st.Group, fp.TPRank, fp.TPSize, fp.DPRank, max(fp.DPSize, 1))
}
