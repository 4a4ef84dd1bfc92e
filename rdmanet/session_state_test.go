package rdmanet

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rdmanet/sdk/internal/session"
)

// Every session in this package's tests reports its changes of state
// here. A change the table does not allow panics: the tests that make it
// fail, whichever they are.
var sessionStateLog = struct {
	sync.Mutex
	moves map[*session.Link][]session.State // the states each session went through, its first one included
}{moves: make(map[*session.Link][]session.State)}

func init() {
	session.StateChanged = func(s *session.Link, from, to session.State) {
		if !session.Transitions[from][to] {
			panic(fmt.Sprintf("session %v: state %v to %v, which the table does not allow", s.ID(), from, to))
		}
		sessionStateLog.Lock()
		defer sessionStateLog.Unlock()
		if len(sessionStateLog.moves[s]) == 0 {
			sessionStateLog.moves[s] = []session.State{from}
		}
		sessionStateLog.moves[s] = append(sessionStateLog.moves[s], to)
	}
}

// statesOf returns the states c's session went through.
func statesOf(c *Conn) []session.State {
	sessionStateLog.Lock()
	defer sessionStateLog.Unlock()
	return append([]session.State(nil), sessionStateLog.moves[c.sess]...)
}

func eventuallySession(t *testing.T, c *Conn, what string, ok func(SessionState) bool) {
	t.Helper()
	for end := time.Now().Add(20 * time.Second); !ok(c.Session()); time.Sleep(time.Millisecond) {
		if time.Now().After(end) { // a hang guard, not a timing check
			t.Fatalf("no %s: %+v", what, c.Session())
		}
	}
}

// TestSessionStateMachine drives sessions through every state, over pipes
// with faults: a cut link (active, suspended, the server attaching, active
// again), a failback (moving), and a resume that never comes (ended).
func TestSessionStateMachine(t *testing.T) {
	seen := map[session.State]bool{}
	note := func(who string, c *Conn) []session.State {
		states := statesOf(c)
		t.Logf("%s: %v", who, states)
		for _, s := range states {
			seen[s] = true
		}
		return states
	}
	t.Run("failover", func(t *testing.T) {
		p := newSessionPair(t, Config{KeepAlive: 250 * time.Millisecond})
		defer closeAndWait(t, p.server)
		defer closeAndWait(t, p.client)
		a, _ := p.pipes()
		a.Cut(nil)
		eventuallySession(t, p.client, "resume", func(s SessionState) bool { return s.Failovers == 1 && !s.Suspended })
		eventuallySession(t, p.server, "resume", func(s SessionState) bool { return s.Failovers == 1 && !s.Suspended })
		roundTrip(t, p.client, p.server)
		if got := note("client", p.client); !sameStates(got, session.Active, session.Suspended, session.Active) {
			t.Errorf("the dialer went through %v, want active, suspended, active", got)
		}
		// The server's loss and the dialer's resume race: it attaches from
		// suspended, or, if the resume comes first, from active.
		if got := note("server", p.server); !sameStates(got, session.Active, session.Suspended, session.Attaching, session.Active) &&
			!sameStates(got, session.Active, session.Attaching, session.Suspended, session.Active) &&
			!sameStates(got, session.Active, session.Attaching, session.Active) {
			t.Errorf("the server went through %v", got)
		}
	})
	t.Run("failback", func(t *testing.T) {
		p, broken := newTwoPathSessionPair(t, Config{KeepAlive: time.Second, FailbackInterval: 20 * time.Millisecond})
		defer closeAndWait(t, p.server)
		defer closeAndWait(t, p.client)
		broken.Store(true)
		a, _ := p.pipes()
		a.Cut(nil)
		eventuallySession(t, p.client, "failover", func(s SessionState) bool { return s.Path == "secondary" })
		broken.Store(false)
		eventuallySession(t, p.client, "failback", func(s SessionState) bool { return s.Path == "primary" && s.Failbacks == 1 })
		roundTrip(t, p.client, p.server)
		got := note("client", p.client)
		// Tries that failed while the first path was down moved it and
		// back; the last one stays moving while the old link is retired,
		// and becomes active on the new one.
		if n := len(got); n < 4 || got[n-2] != session.Moving || got[n-1] != session.Active {
			t.Errorf("the dialer went through %v, want a move to the first path at the end", got)
		}
		note("server", p.server)
	})
	t.Run("no resume", func(t *testing.T) {
		p := newSessionPair(t, Config{KeepAlive: 250 * time.Millisecond, ResumeTimeout: 300 * time.Millisecond})
		defer closeAndWait(t, p.server)
		defer closeAndWait(t, p.client)
		p.mu.Lock()
		p.refuse = errors.New("test: no route to host")
		p.mu.Unlock()
		a, _ := p.pipes()
		a.Cut(nil)
		var b [1]byte
		var re *ResumeError
		if _, err := p.client.Read(b[:]); !errors.As(err, &re) {
			t.Fatalf("Read: %v, want a *ResumeError", err)
		}
		if _, err := p.server.Read(b[:]); !errors.As(err, &re) {
			t.Fatalf("server Read: %v, want a *ResumeError", err)
		}
		for who, c := range map[string]*Conn{"client": p.client, "server": p.server} {
			if got := note(who, c); !sameStates(got, session.Active, session.Suspended, session.Ended) {
				t.Errorf("the %s went through %v, want active, suspended, ended", who, got)
			}
		}
	})
	for s := range session.NumStates {
		if !seen[s] {
			t.Errorf("no session went through state %v", s)
		}
	}
}

func sameStates(got []session.State, want ...session.State) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		if got[i] != want[i] {
			return false
		}
	}
	return true
}
