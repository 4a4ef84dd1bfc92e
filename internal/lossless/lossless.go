// Package lossless reads what the kernel knows of a netdev's lossless
// Ethernet configuration, the things RoCE needs from the network: Priority
// Flow Control per priority (DCB netlink, as `dcb pfc show`), the trust
// mode that maps packets to priorities, ECN/DCQCN where the driver exposes
// it, and the driver's pause and discard counters (ethtool statistics, as
// `ethtool -S`). Assess turns that into findings an operator can act on.
//
// Every part can be unknown: a driver without DCB support (rxe over a veth,
// most virtual NICs) answers EOPNOTSUPP, and that is "cannot tell", never
// "no PFC" and never "ok".
package lossless

import "errors"

// ErrNotSupported is returned off Linux, where none of this can be read.
var ErrNotSupported = errors.New("lossless: not supported on this platform")

// Priorities is the number of IEEE 802.1p priorities.
const Priorities = 8

// Config is one netdev's lossless configuration as the kernel reports it.
// A part whose Err is set could not be read; its other fields are then
// meaningless.
type Config struct {
	Netdev   string   `json:"netdev"`
	PFC      PFC      `json:"pfc"`
	Trust    Trust    `json:"trust"`
	ECN      ECN      `json:"ecn"`
	Counters Counters `json:"counters"`
}

// PFC is the Priority Flow Control configuration.
type PFC struct {
	// Enabled has bit p set when PFC is on for priority p (struct
	// ieee_pfc's pfc_en, or the CEE per-priority flags).
	Enabled uint8 `json:"enabled"`
	// Source is "ieee" (DCB_CMD_IEEE_GET) or "cee" (DCB_CMD_PFC_GCFG).
	Source string `json:"source,omitempty"`
	// Requests and Indications are the pause frames sent and received per
	// priority, where the IEEE interface reports them.
	Requests    []uint64 `json:"requests,omitempty"`
	Indications []uint64 `json:"indications,omitempty"`
	Err         error    `json:"-"`
}

// Priorities lists the priorities with PFC on.
func (p PFC) Priorities() []int {
	var out []int
	for i := range Priorities {
		if p.Enabled&(1<<i) != 0 {
			out = append(out, i)
		}
	}
	return out
}

// Trust modes.
const (
	TrustPCP  = "pcp"  // the VLAN tag's priority code point picks the priority
	TrustDSCP = "dscp" // the IP header's DSCP picks it
)

// Trust is how the NIC maps received packets to priorities.
type Trust struct {
	Mode string `json:"mode,omitempty"` // TrustPCP or TrustDSCP
	// Source says where Mode comes from: "dcb-app" (the IEEE APP table has,
	// or lacks, DSCP entries) or "sysfs" (mlx5's qos/trust).
	Source string `json:"source,omitempty"`
	Err    error  `json:"-"`
}

// ECN is the ECN/DCQCN configuration where the driver exposes it (mlx5's
// sysfs ecn tree): Reaction point (the sender slows on CNPs) and
// notification point (the receiver sends CNPs on ECN-marked packets), per
// priority.
type ECN struct {
	RP  uint8 `json:"rp_enabled"`
	NP  uint8 `json:"np_enabled"`
	Err error `json:"-"`
}

// Stat is one driver statistic.
type Stat struct {
	Name  string `json:"name"`
	Value uint64 `json:"value"`
}

// Counters are the driver's statistics that count pause frames and
// discards (ethtool -S), picked by name: drivers name them differently.
type Counters struct {
	Pause    []Stat `json:"pause"`
	Discards []Stat `json:"discards"`
	Total    int    `json:"total"` // how many statistics the driver has
	Err      error  `json:"-"`
}
