package launcher

import (
	"fmt"
	"sync/atomic"
)

// phase is where the launcher process is in its life. Every move is in
// phaseMoves and made by (*phaseOf).move. Whether it owns its sockets is
// not a phase but its handover.Owner's to say: a serving launcher cedes
// them to a successor mid-handover, and may take them back.
type phase int32

const (
	phaseStarting phase = iota // a rank's death, or another node's failure, fails the start (the zero value)
	phaseServing               // started: a rank that dies is restarted; successors are answered
	phaseStopping              // stop began: nothing is restarted or answered any more
)

var phaseNames = [...]string{"starting", "serving", "stopping"}

func (p phase) String() string {
	if int(p) < len(phaseNames) {
		return phaseNames[p]
	}
	return fmt.Sprintf("phase(%d)", int(p))
}

// phaseMoves is every move the launcher makes: a start that fails stops
// before it serves.
var phaseMoves = map[phase][]phase{
	phaseStarting: {phaseServing, phaseStopping},
	phaseServing:  {phaseStopping},
	phaseStopping: nil,
}

// phaseOf is the launcher's phase, read by the rank watchers, the serve
// loop and handover answers on their own goroutines.
type phaseOf struct{ v atomic.Int32 }

func (p *phaseOf) now() phase { return phase(p.v.Load()) }

// move makes the move from the phase it is in to to, reporting whether it
// was there and the table allows it.
func (p *phaseOf) move(to phase) bool {
	for {
		from := p.now()
		allowed := false
		for _, s := range phaseMoves[from] {
			allowed = allowed || s == to
		}
		if !allowed {
			return false
		}
		if p.v.CompareAndSwap(int32(from), int32(to)) {
			return true
		}
	}
}
