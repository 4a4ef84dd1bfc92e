package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/rdmanet/sdk/fallback"
	"github.com/rdmanet/sdk/rdmanet"
)

// serveEvent is one line of `rdmanet serve --json`: "listening" first, then
// "accepted" and "closed" for each connection, and "stopped" last.
type serveEvent struct {
	Event string    `json:"event"`
	Time  time.Time `json:"time"`

	// listening
	Addr       string               `json:"addr,omitempty"`
	Transports []fallback.Transport `json:"transports,omitempty"`
	NoRDMA     *fallbackJSON        `json:"no_rdma,omitempty"` // why the listener serves no RDMA
	Policy     *policyInfo          `json:"policy,omitempty"`

	// accepted, closed
	ID        int                `json:"id,omitempty"`
	Transport fallback.Transport `json:"transport,omitempty"`
	Fallback  *fallbackJSON      `json:"fallback,omitempty"`
	Remote    string             `json:"remote,omitempty"`
	Mode      string             `json:"mode,omitempty"` // "ping", "sink", "source"
	Size      int                `json:"size,omitempty"`
	BytesIn   uint64             `json:"bytes_in,omitempty"`
	BytesOut  uint64             `json:"bytes_out,omitempty"`
	Seconds   float64            `json:"seconds,omitempty"`
	Error     string             `json:"error,omitempty"`

	// stopped
	Connections map[fallback.Transport]int `json:"connections,omitempty"`
}

type server struct {
	g   *globals
	out printer

	mu     sync.Mutex
	conns  map[net.Conn]bool
	counts map[fallback.Transport]int
	nextID int
	wg     sync.WaitGroup
}

func runServe(ctx context.Context, g *globals, fs *flag.FlagSet, args []string) int {
	addr := fs.String("addr", ":7471", "`host:port` to listen on (an empty host: every address)")
	var pol policyFlag
	fs.Var(&pol, "policy", "`auto|rdma|tcp`: auto serves RDMA and TCP (or TCP alone where RDMA cannot be used), rdma RDMA only (network rdma), tcp TCP only")
	resume := fs.Duration("resume", 0, "keep resumable sessions, whose clients (with -resume) may resume on another path within `bound` (0: none)")
	keepAlive := fs.Duration("keepalive", 0, "how often an idle connection checks its path (0: rdmanet's default, 3s)")
	debug := fs.String("debug", "", "serve the live connections (rdmanet conns) over HTTP on `host:port` at "+rdmanet.ConnsPath)
	if _, code, ok := parse(g, fs, args, 0); !ok {
		return code
	}
	info, err := effectivePolicy(pol.p)
	if err != nil {
		fmt.Fprintf(g.stderr, "rdmanet serve: %v\n", err)
		return exitUsage
	}
	if *resume < 0 || *keepAlive < 0 {
		return usageError(g, fs, "-resume %v, -keepalive %v: want 0 or more", *resume, *keepAlive)
	}
	lc := rdmanet.ListenConfig{Policy: pol.p, Config: rdmanet.Config{ResumeTimeout: *resume, KeepAlive: *keepAlive}}
	network := "tcp"
	if pol.p == fallback.RDMAOnly {
		network = "rdma"
	}
	ln, err := lc.Listen(ctx, network, *addr)
	if err != nil {
		f := fallbackOf(err)
		if g.json {
			writeJSONLine(g.stdout, serveEvent{Event: "failed", Time: time.Now(), Addr: *addr, Policy: &info, NoRDMA: f, Error: err.Error()})
		} else {
			fmt.Fprintf(g.stderr, "rdmanet serve: %v\n", err)
			printFallback(g.stderr, "  ", f)
		}
		return exitFailure
	}
	if *debug != "" {
		stopDebug, err := serveDebug(*debug)
		if err != nil {
			ln.Close()
			fmt.Fprintf(g.stderr, "rdmanet serve: -debug: %v\n", err)
			return exitFailure
		}
		defer stopDebug()
	}
	s := &server{g: g, out: printer{w: g.stdout}, conns: map[net.Conn]bool{}, counts: map[fallback.Transport]int{}}
	noRDMA := fallbackOf(ln.RDMAError())
	if g.json {
		s.event(serveEvent{Event: "listening", Addr: ln.Addr().String(), Transports: ln.Transports(), NoRDMA: noRDMA, Policy: &info})
	} else {
		s.out.printf("rdmanet serve: listening on %s, serving %s, policy %s\n", ln.Addr(), joinTransports(ln.Transports()), info.human())
		if noRDMA != nil {
			s.out.printf("no RDMA:\n")
			var b lineBuffer
			printFallback(&b, "  ", noRDMA)
			s.out.printf("%s", b)
		}
	}

	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	code := exitOK
	failures := 0
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				break
			}
			s.logf("accept: %v", err)
			if failures++; failures > 100 {
				code = exitFailure
				break
			}
			time.Sleep(50 * time.Millisecond)
			continue
		}
		failures = 0
		s.wg.Add(1)
		go s.handle(c)
	}
	ln.Close()
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	if g.json {
		s.event(serveEvent{Event: "stopped", Connections: s.counts})
	} else {
		s.out.printf("rdmanet serve: stopped after %d connections (rdma %d, tcp %d)\n",
			s.counts[fallback.RDMA]+s.counts[fallback.TCP], s.counts[fallback.RDMA], s.counts[fallback.TCP])
	}
	return code
}

// lineBuffer collects printFallback's lines for one printer call.
type lineBuffer []byte

func (b *lineBuffer) Write(p []byte) (int, error) { *b = append(*b, p...); return len(p), nil }
func (b lineBuffer) String() string               { return string(b) }

func writeJSONLine(w io.Writer, v any) {
	b, _ := json.Marshal(v)
	w.Write(append(b, '\n'))
}

func (s *server) event(e serveEvent) {
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	b, _ := json.Marshal(e)
	s.out.printf("%s\n", b)
}

func (s *server) logf(format string, a ...any) {
	if s.g.json {
		s.event(serveEvent{Event: "error", Error: fmt.Sprintf(format, a...)})
		return
	}
	s.out.printf("%s %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, a...))
}

func (s *server) handle(c net.Conn) {
	defer s.wg.Done()
	ci := connInfoOf(c)
	s.mu.Lock()
	s.nextID++
	id := s.nextID
	s.conns[c] = true
	s.counts[ci.Transport]++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	start := time.Now()

	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	mode, size, err := readHeader(c)
	c.SetReadDeadline(time.Time{})
	if s.g.json {
		e := serveEvent{Event: "accepted", ID: id, Transport: ci.Transport, Fallback: ci.Fallback, Remote: ci.Remote}
		if err == nil {
			e.Mode, e.Size = modeName(mode), size
		}
		s.event(e)
	} else {
		what := fmt.Sprintf("%s, %d-byte messages", modeName(mode), size)
		switch {
		case errors.Is(err, io.EOF):
			what = "closed before sending a header (a probe, such as rdmanet doctor's)"
		case err != nil:
			what = "no valid header: " + err.Error()
		}
		s.logf("#%d %s from %s: %s", id, ci.human(), ci.Remote, what)
	}
	var in, out uint64
	if errors.Is(err, io.EOF) {
		err = nil // a probe
	} else if err == nil {
		switch mode {
		case modePing:
			in, out, err = echo(c, size)
		case modeSink:
			in, out, err = sink(c, size)
		case modeSource:
			out = source(c, size)
		}
	}
	took := time.Since(start)
	if s.g.json {
		e := serveEvent{Event: "closed", ID: id, Transport: ci.Transport, Remote: ci.Remote, BytesIn: in, BytesOut: out, Seconds: took.Seconds()}
		if err != nil {
			e.Error = err.Error()
		}
		s.event(e)
		return
	}
	end := ""
	if err != nil {
		end = ": " + err.Error()
	}
	s.logf("#%d closed after %.3f s: %d bytes in, %d bytes out%s", id, took.Seconds(), in, out, end)
}

// echo sends back what it receives until EOF.
func echo(c net.Conn, size int) (in, out uint64, err error) {
	buf := make([]byte, max(size, 64<<10))
	for {
		n, rerr := c.Read(buf)
		in += uint64(n)
		if n > 0 {
			m, werr := c.Write(buf[:n])
			out += uint64(m)
			if werr != nil {
				return in, out, werr
			}
		}
		if rerr == io.EOF {
			return in, out, nil
		}
		if rerr != nil {
			return in, out, rerr
		}
	}
}

// sink reads until EOF, then sends the byte count.
func sink(c net.Conn, size int) (in, out uint64, err error) {
	buf := make([]byte, max(size, 64<<10))
	for {
		n, rerr := c.Read(buf)
		in += uint64(n)
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return in, 0, rerr
		}
	}
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], in)
	n, err := c.Write(b[:])
	return in, uint64(n), err
}

// source writes size-byte chunks until a write fails, which is how it
// ends: the client closes.
func source(c net.Conn, size int) (out uint64) {
	buf := make([]byte, size)
	fillPattern(buf, 0)
	for {
		n, err := c.Write(buf)
		out += uint64(n)
		if err != nil {
			return out
		}
	}
}

// fillPattern fills b with a byte pattern that starts at offset off.
func fillPattern(b []byte, off uint64) {
	for i := range b {
		b[i] = byte(off + uint64(i))
	}
}

// serveDebug serves rdmanet.ConnsHandler on addr until stop is called.
func serveDebug(addr string) (stop func(), err error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle(rdmanet.ConnsPath, rdmanet.ConnsHandler())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(l)
	return func() { srv.Close() }, nil
}
