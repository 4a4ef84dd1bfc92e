package rdmanet

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/rdmanet/sdk/internal/rdmalink"
)

// ConnsPath is where programs conventionally mount ConnsHandler, and
// where `rdmanet conns` looks when given only host:port.
const ConnsPath = "/debug/rdmanet/conns"

// ConnsHandler returns an http.Handler that lists the live connections
// (Connections), for a program's debug server, the way net/http/pprof's
// handlers serve profiles:
//
//	mux.Handle(rdmanet.ConnsPath, rdmanet.ConnsHandler())
//
// It answers JSON (a list of ConnInfo), or the table WriteConnTable writes
// when the request says ?format=text or accepts text/plain and not JSON.
// `rdmanet conns URL` reads it. With ?view=groups it lists the link groups
// instead (Groups, WriteGroupTable), which `rdmanet groups URL` reads.
func ConnsHandler() http.Handler { return http.HandlerFunc(serveConns) }

func serveConns(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	var list any
	var table func(io.Writer) error
	if r.URL.Query().Get("view") == "groups" {
		groups := Groups()
		list, table = groups, func(w io.Writer) error { return WriteGroupTable(w, groups) }
	} else {
		conns := Connections()
		list, table = conns, func(w io.Writer) error { return WriteConnTable(w, conns) }
	}
	if wantsText(r) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		table(w)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(list)
}

// wantsText reports whether r asks for the table rather than JSON.
func wantsText(r *http.Request) bool {
	switch r.URL.Query().Get("format") {
	case "text":
		return true
	case "json":
		return false
	}
	accept := r.Header.Get("Accept")
	return strings.Contains(accept, "text/plain") && !strings.Contains(accept, "json")
}

// WriteConnTable writes conns as a table, one line each, with a header:
// addresses, transport and protocol, device and queue pair (QP/stream for
// a stream of a link group, which shares its group's queue pair), bytes each
// way, the send queue and ring in use, the peer's room, idle time and
// the last error.
func WriteConnTable(w io.Writer, conns []ConnInfo) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "LOCAL\tREMOTE\tSIDE\tTRANSPORT\tDEVICE\tQP\tSENT\tRECEIVED\tSENDQ\tRING\tPEER-ROOM\tUNREAD\tIDLE\tERROR")
	for _, c := range conns {
		transport := string(c.Transport) + "/" + string(c.Protocol)
		if c.Session {
			transport += "+session"
		}
		if c.DataPath == rdmalink.DataPathNotice {
			transport += "+notices" // iWARP: writes without immediate data
		}
		device, qp := "-", "-"
		if c.Device != "" {
			device, qp = fmt.Sprintf("%s/%d", c.Device, c.Port), fmt.Sprint(c.QP)
		}
		if c.Stream != 0 {
			qp += fmt.Sprintf("/%#x", c.Stream) // a stream of the group on that queue pair
		}
		errText := c.LastError
		if errText == "" {
			errText = "-"
		}
		win := c.Window
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d/%d\t%d/%d\t%d\t%d\t%v\t%s\n",
			c.Local, c.Remote, c.Side, transport, device, qp,
			c.BytesSent, c.BytesReceived,
			win.SendInFlight, win.SendSlots, win.SendRingUsed, win.SendRing,
			win.PeerRoom, win.RecvUnread, c.Idle.Round(time.Millisecond), errText)
	}
	return tw.Flush()
}
