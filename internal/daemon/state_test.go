package daemon

import "testing"

func TestTransitions(t *testing.T) {
	for from, tos := range transitions {
		if from != stateDraining && !allowed(from, stateDraining) {
			t.Errorf("%s cannot drain: Shutdown must reach draining from every state", from)
		}
		for _, to := range tos {
			if _, ok := transitions[to]; !ok {
				t.Errorf("%s moves to %s, which the table does not list", from, to)
			}
		}
	}
	if allowed(stateReady, stateLoading) || allowed(stateDraining, stateReady) {
		t.Error("a ready or draining daemon must not go back")
	}
}
