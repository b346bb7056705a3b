package launcher

import "fmt"

// rankState is where one rank daemon process is in its life, as the
// launcher sees it. Every move is in rankMoves and made by (*proc).move;
// /health shows each state by the name display gives it.
type rankState int

const (
	rankStarting   rankState = iota // process started, socket not yet taken (the zero value)
	rankLoading                     // serving its socket, segments being filled
	rankReady                       // serving its segments
	rankHanding                     // stopping for a successor (handover.go); not restarted
	rankKilling                     // the launcher sent it SIGKILL
	rankExited                      // reaped; the serve loop decides what follows
	rankHanded                      // reaped after stopping for a successor: nothing follows
	rankRestarting                  // its exit handled: a replacement takes the slot (restart.go)
	rankDead                        // its exit handled: not replaced (given up, stopping, or ceded)
)

var rankStateNames = [...]string{"starting", "loading", "ready", "handing", "killing", "exited", "handed", "restarting", "dead"}

func (s rankState) String() string {
	if int(s) < len(rankStateNames) {
		return rankStateNames[s]
	}
	return fmt.Sprintf("rankState(%d)", int(s))
}

// rankMoves is every move a rank makes. A process may exit in any state
// it is alive in; the launcher kills one in any; a handover that did not
// finish takes its ranks back (handing to ready, handed to exited, so
// that the serve loop restarts them); a restart that started nothing
// puts the exit back (restarting to exited) to be tried again.
var rankMoves = map[rankState][]rankState{
	rankStarting:   {rankLoading, rankKilling, rankExited},
	rankLoading:    {rankReady, rankKilling, rankExited},
	rankReady:      {rankHanding, rankKilling, rankExited},
	rankHanding:    {rankReady, rankKilling, rankHanded},
	rankKilling:    {rankExited},
	rankExited:     {rankRestarting, rankDead},
	rankHanded:     {rankExited},
	rankRestarting: {rankExited},
	rankDead:       nil,
}

func rankMoveAllowed(from, to rankState) bool {
	for _, s := range rankMoves[from] {
		if s == to {
			return true
		}
	}
	return false
}

// alive is whether the process has not been reaped.
func (s rankState) alive() bool { return s <= rankKilling }

// display is the state as /health and /metrics name it; restarts is the
// slot's restart count: a replacement that does not serve yet shows as
// restarting. The names are those /health has always shown.
func (s rankState) display(restarts int) string {
	switch s {
	case rankStarting, rankLoading:
		if restarts > 0 {
			return StateRestarting
		}
		if s == rankStarting {
			return StateStarting
		}
		return StateLoading
	case rankReady, rankHanding:
		return StateReady // until it exits, a rank handing over still serves
	case rankKilling:
		return StateStopping
	case rankRestarting:
		return StateRestarting
	default:
		return StateExited
	}
}

// moveLocked moves p from state from to to, reporting false, changing
// nothing, when p is no longer in from (it exited meanwhile, most often).
// A move missing from rankMoves is a bug in this package: it panics.
// Callers hold p.mu.
func (p *proc) moveLocked(from, to rankState) bool {
	if p.state != from {
		return false
	}
	if !rankMoveAllowed(from, to) {
		panic(fmt.Sprintf("launcher: %s: no move from %s to %s", p, from, to))
	}
	p.state = to
	return true
}

// move is moveLocked for callers that do not hold p.mu.
func (p *proc) move(from, to rankState) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.moveLocked(from, to)
}

// current is p's state now.
func (p *proc) current() rankState {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.state
}
