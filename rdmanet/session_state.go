package rdmanet

import "log/slog"

// sessionState is where a resumable session is in its life. Conn.mu
// guards it (session.state); setStateLocked changes it.
//
//	active ──its link is lost──▶ suspended ──a new link attached──▶ active
//	active ──failback (dialer)──▶ moving ──the first path's link attached──▶ active
//	                              moving ──the try failed──▶ active, or suspended if the old link went
//	active, suspended ──a dialer asks to resume (server)──▶ attaching ──▶ active, or back
//	suspended, attaching ──no resume in time, or the peer left──▶ ended
//
// Whether the session has a link at the moment is c.link != s.lost: a
// move or an attach goes on while the old link still runs or after it was
// lost. knocked (the server heard from the dialer since the loss) and
// unconfirmed (the server's new link has not heard the dialer yet) are
// details of suspended and active.
type sessionState uint8

const (
	sessionActive sessionState = iota
	sessionSuspended
	sessionMoving
	sessionAttaching
	sessionEnded
	sessionStates // how many
)

var sessionStateNames = [sessionStates]string{"active", "suspended", "moving", "attaching", "ended"}

func (s sessionState) String() string {
	if s < sessionStates {
		return sessionStateNames[s]
	}
	return "sessionState(?)"
}

// sessionTransitions are the transitions the session code makes.
var sessionTransitions = [sessionStates][sessionStates]bool{
	sessionActive:    {sessionSuspended: true, sessionMoving: true, sessionAttaching: true},
	sessionSuspended: {sessionActive: true, sessionAttaching: true, sessionEnded: true},
	sessionMoving:    {sessionActive: true, sessionSuspended: true},
	sessionAttaching: {sessionActive: true, sessionSuspended: true, sessionEnded: true},
}

// sessionStateChanged, when set (by tests), sees every change of state.
var sessionStateChanged func(s *session, from, to sessionState)

// setStateLocked moves the session to state to; c.mu is held. A move the
// table does not allow is a bug: it is logged, and tests fail on it.
func (s *session) setStateLocked(to sessionState) {
	from := s.state
	if from == to {
		return
	}
	if !sessionTransitions[from][to] {
		slog.Error("rdmanet: session state: unexpected move", "session", s.id, "from", from, "to", to)
	}
	s.state = to
	if f := sessionStateChanged; f != nil {
		f(s, from, to)
	}
}
