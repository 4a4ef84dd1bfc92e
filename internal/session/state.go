package session

import "log/slog"

// State is where a session is in its life. Link.mu guards it; setLocked
// changes it.
//
//	active ──its path is lost──▶ suspended ──a new path attached──▶ active
//	active ──failback (dialer)──▶ moving ──the first path attached──▶ active
//	                              moving ──the try failed──▶ active, or suspended if the path went
//	active, suspended ──a dialer asks to resume (server)──▶ attaching ──▶ active, or back
//	suspended, attaching ──no resume in time, or the peer left──▶ ended
//
// Whether the session has a path at the moment is Link.path != nil: a move
// or an attach goes on while the old path still runs or after it was lost.
// knocked (the server heard from the dialer since the loss) and
// unconfirmed (the server's new path has not heard the dialer yet) are
// details of suspended and active.
type State uint8

const (
	Active State = iota
	Suspended
	Moving
	Attaching
	Ended
	NumStates // how many
)

var stateNames = [NumStates]string{"active", "suspended", "moving", "attaching", "ended"}

func (s State) String() string {
	if s < NumStates {
		return stateNames[s]
	}
	return "State(?)"
}

// Transitions are the moves between states that the session makes.
var Transitions = [NumStates][NumStates]bool{
	Active:    {Suspended: true, Moving: true, Attaching: true},
	Suspended: {Active: true, Attaching: true, Ended: true},
	Moving:    {Active: true, Suspended: true},
	Attaching: {Active: true, Suspended: true, Ended: true},
}

// StateChanged, when set (by tests), sees every change of state.
var StateChanged func(l *Link, from, to State)

// setLocked moves the session to state to; l.mu is held. A move the table
// does not allow is a bug: it is logged, and tests fail on it.
func (l *Link) setLocked(to State) {
	from := l.state
	if from == to {
		return
	}
	if !Transitions[from][to] {
		slog.Error("rdmanet: session state: unexpected move", "session", l.cfg.ID, "from", from, "to", to)
	}
	l.state = to
	if f := StateChanged; f != nil {
		f(l, from, to)
	}
}

// stepEndedLocked ends a step that made no new path, a failback's move or
// the server's attach, if the session is still in it: active on its path,
// or suspended if the path went meanwhile; l.mu is held.
func (l *Link) stepEndedLocked(step State) {
	switch {
	case l.state != step:
	case l.path == nil:
		l.setLocked(Suspended)
	default:
		l.setLocked(Active)
	}
}
