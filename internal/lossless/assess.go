package lossless

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"syscall"
)

// Status is a finding's verdict.
type Status string

const (
	OK         Status = "ok"
	Warn       Status = "warn"
	Fail       Status = "fail"
	CannotTell Status = "cannot tell" // the check could not be made
)

// Finding is one check of a port's lossless configuration.
type Finding struct {
	Check  string `json:"check"` // "pfc", "trust", "ecn", "counters", "flow control"
	Status Status `json:"status"`
	Detail string `json:"detail"`
	Fix    string `json:"fix,omitempty"` // one line: what to do
}

// Protocols Assess knows. A port's protocol is what rdmanet devices shows.
const (
	RoCE       = "RoCE"
	IWARP      = "iWARP"
	InfiniBand = "InfiniBand"
)

// The risk of RoCE on a lossy network, in the words of those who met it.
const lossRisk = "drops under load cost go-back-N retransmissions, RNR and ACK timeouts, and stalls (volumes going offline)"

// Assess judges a port speaking protocol over a netdev configured as c.
// iWARP and InfiniBand need no PFC, and Assess says so without looking
// further.
func Assess(protocol string, c Config) []Finding {
	switch protocol {
	case InfiniBand:
		return []Finding{{Check: "flow control", Status: OK,
			Detail: "InfiniBand: the link's credit-based flow control makes it lossless; PFC is not needed"}}
	case IWARP:
		return []Finding{{Check: "flow control", Status: OK,
			Detail: "iWARP runs over TCP, which recovers from loss; PFC is not needed"}}
	case RoCE:
	default:
		return []Finding{{Check: "flow control", Status: CannotTell,
			Detail: "unknown protocol " + strconv.Quote(protocol) + ": no lossless checks"}}
	}
	dev := c.Netdev
	var out []Finding

	pfc := Finding{Check: "pfc"}
	pfcOff := false
	switch {
	case c.PFC.Err != nil:
		pfc.Status, pfc.Detail = CannotTell, "cannot read PFC through DCB netlink: "+why(c.PFC.Err)
		pfc.Fix = "check PFC with the NIC vendor's tool and on every switch port in the path"
	case c.PFC.Enabled == 0:
		pfcOff = true
		pfc.Status, pfc.Detail = Warn, "PFC is off on every priority: "+lossRisk
		pfc.Fix = "enable PFC on the priority RoCE uses (often 3): dcb pfc set dev " + dev + " prio-pfc 3:on, and on every switch port in the path"
	default:
		pfc.Status, pfc.Detail = OK, "PFC on priority "+joinInts(c.PFC.Priorities())+" ("+c.PFC.Source+")"
		if c.PFC.Requests != nil {
			var sent, rcvd uint64
			for p := range Priorities {
				sent += c.PFC.Requests[p]
				rcvd += c.PFC.Indications[p]
			}
			pfc.Detail += fmt.Sprintf("; %d pause frames sent, %d received", sent, rcvd)
		}
	}

	trust := Finding{Check: "trust"}
	switch {
	case c.Trust.Err != nil:
		trust.Status, trust.Detail = CannotTell, "cannot tell the trust mode: "+why(c.Trust.Err)
	case c.Trust.Mode == TrustDSCP:
		trust.Status, trust.Detail = OK, "DSCP trust: the IP header's DSCP picks the priority ("+c.Trust.Source+")"
	default:
		trust.Status, trust.Detail = OK, "PCP trust: only VLAN-tagged RoCE traffic gets its priority ("+c.Trust.Source+")"
		trust.Fix = "untagged RoCE needs DSCP trust: dcb app add dev " + dev + " dscp-prio 26:3 (and the switch must agree)"
	}

	ecn := Finding{Check: "ecn"}
	ecnOff := false
	switch {
	case c.ECN.Err != nil:
		ecn.Status, ecn.Detail = CannotTell, "cannot tell whether ECN/DCQCN is on: "+why(c.ECN.Err)
	case c.ECN.RP == 0 || c.ECN.NP == 0:
		ecnOff = true
		ecn.Status, ecn.Detail = Warn, "ECN/DCQCN is off: congestion is only met by pause frames, which spread it (head-of-line blocking, pause storms)"
		ecn.Fix = "echo 1 > /sys/class/net/" + dev + "/ecn/roce_rp/enable/3 and .../roce_np/enable/3, and ECN marking on the switches"
	default:
		ecn.Status, ecn.Detail = OK, "ECN/DCQCN: reaction point on priority "+joinInts(bits(c.ECN.RP))+", notification point on priority "+joinInts(bits(c.ECN.NP))
	}
	if pfcOff && ecnOff {
		pfc.Status = Fail
		pfc.Detail = "neither PFC nor ECN: nothing prevents or signals loss; " + lossRisk
	}
	out = append(out, pfc, trust, ecn)

	cnt := Finding{Check: "counters"}
	switch {
	case c.Counters.Err != nil:
		cnt.Status, cnt.Detail = CannotTell, "cannot read the driver's statistics: "+why(c.Counters.Err)
	case len(c.Counters.Pause) == 0 && len(c.Counters.Discards) == 0:
		cnt.Status = CannotTell
		cnt.Detail = fmt.Sprintf("the driver's %d statistics (ethtool -S %s) count no pause frames or discards", c.Counters.Total, dev)
	default:
		var discards uint64
		for _, s := range c.Counters.Discards {
			discards += s.Value
		}
		cnt.Status = OK
		cnt.Detail = fmt.Sprintf("pause: %s; discards: %s", statList(c.Counters.Pause), statList(c.Counters.Discards))
		if discards > 0 {
			cnt.Status = Warn
			cnt.Fix = "packets were discarded: watch rdmanet stat " + dev + " under load and the switches' buffer counters"
		}
	}
	return append(out, cnt)
}

// why says an error in an operator's words: EOPNOTSUPP from DCB netlink
// means the driver has no DCB support.
func why(err error) string {
	if errors.Is(err, syscall.EOPNOTSUPP) {
		return err.Error() + " (the driver has no DCB support, as with rxe over a veth)"
	}
	return err.Error()
}

func bits(b uint8) []int {
	var out []int
	for i := range Priorities {
		if b&(1<<i) != 0 {
			out = append(out, i)
		}
	}
	return out
}

func joinInts(v []int) string {
	if len(v) == 0 {
		return "none"
	}
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}

func statList(s []Stat) string {
	if len(s) == 0 {
		return "none counted"
	}
	parts := make([]string, len(s))
	for i, st := range s {
		parts[i] = st.Name + " " + strconv.FormatUint(st.Value, 10)
	}
	return strings.Join(parts, ", ")
}
