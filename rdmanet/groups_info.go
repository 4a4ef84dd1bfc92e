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

// GroupInfo is one link group (issue 25): the RDMA connection that carries
// connections between this process and a peer as streams, as Groups lists
// it and `rdmanet groups` shows it.
type GroupInfo struct {
	Local, Remote string // the group's link's addresses
	Side          string // "dialed" or "accepted"
	// Device, Port and QP are the group's link's RDMA device, port and
	// queue pair, which its streams share; DataPath as ConnInfo's.
	Device   string `json:",omitempty"`
	Port     uint8  `json:",omitempty"`
	QP       uint32 `json:",omitempty"`
	DataPath string `json:",omitempty"`
	// Streams are open now; Opened and Accepted count those this side
	// opened and those the peer opened, Refused the peer's this side
	// refused.
	Streams           int
	Opened, Accepted  uint64
	Refused           uint64
	Pool, Granted     int    // the link's receives for streams, and those committed to them
	MostQueued        int    // the most requests waiting in the group at once
	Posted, Malformed uint64 // requests posted on the link; malformed messages from the peer
}

// liveGroups are the process's groups, until they end.
var liveGroups struct {
	sync.Mutex
	m map[*group.Mux]string // the side
}

// registerGroup lists m until it ends.
func registerGroup(m *group.Mux, side string) {
	liveGroups.Lock()
	defer liveGroups.Unlock()
	if liveGroups.m == nil {
		liveGroups.m = map[*group.Mux]string{}
	}
	liveGroups.m[m] = side
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
	muxes := make(map[*group.Mux]string, len(liveGroups.m))
	for m, side := range liveGroups.m {
		if m.Err() == nil {
			muxes[m] = side
		}
	}
	liveGroups.Unlock()
	var out []GroupInfo
	for m, side := range muxes {
		st := m.Stats()
		i := GroupInfo{Side: side, Streams: st.Streams, Opened: st.Opened, Accepted: st.Accepted, Refused: st.Refused,
			Pool: st.Pool, Granted: st.Granted, MostQueued: st.MostQueued, Posted: st.Posted, Malformed: st.Malformed}
		l := m.Base()
		local, remote := l.Addrs()
		i.Local, i.Remote = local.String(), remote.String()
		if d, ok := l.(deviceLink); ok {
			i.Device, i.Port, i.QP = d.Endpoint()
			i.DataPath = d.DataPath()
		}
		out = append(out, i)
	}
	slices.SortFunc(out, func(a, b GroupInfo) int {
		return cmp.Or(strings.Compare(a.Local, b.Local), strings.Compare(a.Remote, b.Remote))
	})
	return out
}

// WriteGroupTable writes groups as a table, one line each, with a header.
func WriteGroupTable(w io.Writer, groups []GroupInfo) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "LOCAL\tREMOTE\tSIDE\tDEVICE\tQP\tSTREAMS\tOPENED\tACCEPTED\tREFUSED\tRECEIVES")
	for _, g := range groups {
		device, qp := "-", "-"
		if g.Device != "" {
			device, qp = fmt.Sprintf("%s/%d", g.Device, g.Port), fmt.Sprint(g.QP)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d/%d\n",
			g.Local, g.Remote, g.Side, device, qp, g.Streams, g.Opened, g.Accepted, g.Refused, g.Granted, g.Pool)
	}
	return tw.Flush()
}
