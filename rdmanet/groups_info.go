package rdmanet

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"

	"github.com/rdmanet/sdk/internal/group"
)

// GroupInfo is one link group (issue 25): the RDMA connections, one per
// path, that carry the connections between this process and a peer as
// streams, as Groups lists it and `rdmanet groups` shows it.
type GroupInfo struct {
	Side string // "dialed" or "accepted"
	// ID is the group's id (the listener names it), and PeerProcess the
	// peer process's identity, which every link of the group reaches.
	ID, PeerProcess string `json:",omitempty"`
	// Links are the group's links that work, one per path.
	Links []GroupLinkInfo
	// Streams are open now; Opened and Accepted count those this side
	// opened and those the peer opened, Refused the peer's this side
	// refused.
	Streams          int
	Opened, Accepted uint64
	Refused          uint64
	// Moved counts streams moved to another link after theirs failed,
	// MovesFailed those that found none in time, LinksDown the links that
	// failed, and Suspended the streams waiting for a link now.
	Moved, MovesFailed, LinksDown uint64
	Suspended                     int
	MostQueued                    int    // the most requests waiting on a link at once
	Malformed                     uint64 // malformed messages from the peer
}

// GroupLinkInfo is one link of a group: its path and its share.
type GroupLinkInfo struct {
	Local, Remote string
	// Transport is "rdma", or "tcp" for the group's last path: one TCP
	// connection its streams move to when no RDMA path is left.
	Transport string
	// Device, Port and QP are the link's RDMA device, port and queue
	// pair, which its streams share; DataPath as ConnInfo's.
	Device   string `json:",omitempty"`
	Port     uint8  `json:",omitempty"`
	QP       uint32 `json:",omitempty"`
	DataPath string `json:",omitempty"`
	Streams  int    // on this link now
	Posted   uint64 // requests posted on it
	// Pool and Granted are its receives for streams, and those committed.
	Pool, Granted int
}

// liveGroups are the process's groups, until they end.
var liveGroups struct {
	sync.Mutex
	m map[*group.Mux]groupName
}

// groupName is what the process knows of a group besides its mux.
type groupName struct {
	side        string
	id, process uint64 // the group's id, and the peer's process
}

// registerGroup lists m until it ends.
func registerGroup(m *group.Mux, side string, id, peerProcess uint64) {
	liveGroups.Lock()
	defer liveGroups.Unlock()
	if liveGroups.m == nil {
		liveGroups.m = map[*group.Mux]groupName{}
	}
	liveGroups.m[m] = groupName{side, id, peerProcess}
	metrics.groupsMade[sideIndex(side)].Add(1)
	go func() {
		<-m.Done()
		liveGroups.Lock()
		delete(liveGroups.m, m)
		liveGroups.Unlock()
	}()
}

// openGroups is how many groups are listed now.
func openGroups() int {
	liveGroups.Lock()
	defer liveGroups.Unlock()
	return len(liveGroups.m)
}

// Groups lists the process's link groups, those that ended dropped.
func Groups() []GroupInfo {
	liveGroups.Lock()
	muxes := make(map[*group.Mux]groupName, len(liveGroups.m))
	for m, n := range liveGroups.m {
		if m.Err() == nil {
			muxes[m] = n
		}
	}
	liveGroups.Unlock()
	var out []GroupInfo
	for m, n := range muxes {
		st := m.Stats()
		i := GroupInfo{Side: n.side, Streams: st.Streams, Opened: st.Opened, Accepted: st.Accepted, Refused: st.Refused,
			Moved: st.Moved, MovesFailed: st.MovesFailed, LinksDown: st.LinksDown, Suspended: st.Suspended,
			MostQueued: st.MostQueued, Malformed: st.Malformed}
		if n.id != 0 {
			i.ID, i.PeerProcess = fmt.Sprintf("%016x", n.id), fmt.Sprintf("%016x", n.process)
		}
		for _, ls := range m.Links() {
			local, remote := ls.Base.Addrs()
			li := GroupLinkInfo{Local: local.String(), Remote: remote.String(), Transport: ls.Base.Caps().Transport,
				Streams: ls.Streams, Posted: ls.Posted, Pool: ls.Pool, Granted: ls.Granted}
			if d, ok := ls.Base.(deviceLink); ok {
				li.Device, li.Port, li.QP = d.Endpoint()
				li.DataPath = d.DataPath()
			}
			i.Links = append(i.Links, li)
		}
		out = append(out, i)
	}
	slices.SortFunc(out, func(a, b GroupInfo) int {
		return cmp.Or(strings.Compare(firstLink(a).Local, firstLink(b).Local), strings.Compare(firstLink(a).Remote, firstLink(b).Remote),
			strings.Compare(a.Side, b.Side))
	})
	return out
}

func firstLink(g GroupInfo) GroupLinkInfo {
	if len(g.Links) == 0 {
		return GroupLinkInfo{}
	}
	return g.Links[0]
}

// WriteGroupTable writes groups as a table, a line for each link of each
// group (a group that has none for now, one line), with a header; a
// group's own counters are on each of its lines.
func WriteGroupTable(w io.Writer, groups []GroupInfo) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "LOCAL\tREMOTE\tSIDE\tDEVICE\tQP\tSTREAMS\tRECEIVES\tOPENED\tACCEPTED\tREFUSED\tMOVED\tDOWN\tWAITING")
	for _, g := range groups {
		links := g.Links
		if len(links) == 0 {
			links = []GroupLinkInfo{{Local: "-", Remote: "-"}}
		}
		for _, l := range links {
			device, qp := "-", "-"
			if l.Transport == "tcp" {
				device = "tcp"
			}
			if l.Device != "" {
				device, qp = fmt.Sprintf("%s/%d", l.Device, l.Port), fmt.Sprint(l.QP)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d/%d\t%d/%d\t%d\t%d\t%d\t%d\t%d\t%d\n",
				l.Local, l.Remote, g.Side, device, qp, l.Streams, g.Streams, l.Granted, l.Pool,
				g.Opened, g.Accepted, g.Refused, g.Moved, g.LinksDown, g.Suspended)
		}
	}
	return tw.Flush()
}
