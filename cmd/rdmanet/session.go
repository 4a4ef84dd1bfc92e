package main

import (
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/rdmanet/sdk/rdmanet"
)

// Resumable sessions in ping and bench (-resume): the connection survives
// a failed path by moving to another (rdmanet.Conn.Session), and the
// command shows each move as it happens and in its summary.

// sessionJSON is a resumable connection's session in --json.
type sessionJSON struct {
	ID        string     `json:"id"`
	Path      string     `json:"path"` // at the end ("" while suspended)
	Failovers int        `json:"failovers"`
	Failbacks int        `json:"failbacks"`
	Moves     []moveJSON `json:"moves"`
}

// moveJSON is one move of the session to a new link.
type moveJSON struct {
	AtS      float64 `json:"at_s"` // seconds since the command's start
	Reason   string  `json:"reason"`
	From     string  `json:"from"` // the transports
	To       string  `json:"to"`
	FromPath string  `json:"from_path"`
	ToPath   string  `json:"to_path"`
	PauseMS  float64 `json:"pause_ms"` // how long the session had no link
}

// sessionWatch reports the moves of a connection's session while a
// command runs: it samples the session every 10 ms (a move takes hundreds
// of them) and prints a line for each link lost and each move.
type sessionWatch struct {
	c     *rdmanet.Conn
	start time.Time
	p     *printer // nil: no lines (--json)

	mu   sync.Mutex
	out  sessionJSON
	stop chan struct{}
	done chan struct{}
}

// watchSession starts watching c's session; nil if c is not one.
func watchSession(c net.Conn, start time.Time, p *printer) *sessionWatch {
	rc, ok := c.(*rdmanet.Conn)
	if !ok || !rc.Session().Resumable {
		return nil
	}
	w := &sessionWatch{c: rc, start: start, p: p, stop: make(chan struct{}), done: make(chan struct{})}
	w.out.Moves = []moveJSON{}
	go w.run()
	return w
}

func (w *sessionWatch) run() {
	defer close(w.done)
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	var last time.Time
	suspended := false
	for {
		st := w.c.Session()
		if st.Suspended && !suspended && w.p != nil {
			w.p.printf("session: lost its link at %.2f s, resuming\n", time.Since(w.start).Seconds())
		}
		suspended = st.Suspended
		if m := st.LastMove; !m.At.IsZero() && !m.At.Equal(last) {
			last = m.At
			mj := moveJSON{AtS: m.At.Sub(w.start).Seconds(), Reason: m.Reason, From: string(m.From), To: string(m.To),
				FromPath: m.FromPath, ToPath: m.ToPath, PauseMS: float64(m.Pause) / float64(time.Millisecond)}
			w.mu.Lock()
			w.out.Moves = append(w.out.Moves, mj)
			w.mu.Unlock()
			if w.p != nil {
				w.p.printf("session: %s at %.2f s (%s): %s -> %s, no link for %.0f ms\n",
					moveKind(m.Reason), mj.AtS, m.Reason, m.FromPath, m.ToPath, mj.PauseMS)
			}
		}
		select {
		case <-w.stop:
			return
		case <-t.C:
		}
	}
}

// moveKind names a move for people: back to the first path, or away.
func moveKind(reason string) string {
	if reason == "failback" {
		return "failed back"
	}
	return "failed over"
}

// end stops the watch and returns the session's summary; nil for none.
func (w *sessionWatch) end() *sessionJSON {
	if w == nil {
		return nil
	}
	close(w.stop)
	<-w.done
	st := w.c.Session()
	// st.Failovers counts every move, failbacks too.
	w.out.ID, w.out.Path, w.out.Failovers, w.out.Failbacks = st.ID, st.Path, st.Failovers-st.Failbacks, st.Failbacks
	return &w.out
}

// printSessionSummary is the session's line in a command's summary.
func printSessionSummary(p *printer, s *sessionJSON) {
	if s == nil {
		return
	}
	var b strings.Builder
	b.WriteString("session: resumable")
	if s.Failovers+s.Failbacks == 0 {
		b.WriteString(", never moved")
	} else {
		pauses := make([]string, len(s.Moves))
		for i, m := range s.Moves {
			pauses[i] = fmt.Sprintf("%.0f ms", m.PauseMS)
		}
		fmt.Fprintf(&b, ", failovers %d, failbacks %d (no link for %s)", s.Failovers, s.Failbacks, strings.Join(pauses, ", "))
	}
	if s.Path == "" {
		b.WriteString("; suspended at the end\n")
	} else {
		b.WriteString("; now on " + s.Path + "\n")
	}
	p.printf("%s", b.String())
}
