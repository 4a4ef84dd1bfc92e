package main

import (
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/rdmanet/sdk/internal/lossless"
	"github.com/rdmanet/sdk/verbs"
)

// losslessJSON is the lossless-network check of one RDMA port, in doctor's
// and devices' --json.
type losslessJSON struct {
	Device   string `json:"device"`
	Port     int    `json:"port"`
	Netdev   string `json:"netdev"`
	Protocol string `json:"protocol"` // "RoCE", "iWARP", "InfiniBand"
	// Findings are the checks: "pfc", "trust", "ecn", "counters" for RoCE,
	// one "flow control" for the others. Status is "ok", "warn", "fail" or
	// "cannot tell".
	Findings []lossless.Finding `json:"findings"`
	Config   *lossless.Config   `json:"config,omitempty"` // what was read, for RoCE
}

// losslessSysfs is where the port's node type and link layer are read.
var losslessSysfs = "/sys/class/infiniband"

// checkLossless checks every RDMA port the kernel reports (verbs.Links,
// over netlink, so it works without rdma-core).
func checkLossless(links []verbs.Link) []losslessJSON {
	out := []losslessJSON{}
	for _, l := range links {
		lj := losslessJSON{Device: l.Device, Port: int(l.Port), Netdev: l.Netdev, Protocol: portProtocol(l.Device, int(l.Port))}
		switch {
		case lj.Protocol == lossless.RoCE && l.Netdev == "":
			lj.Findings = []lossless.Finding{{Check: "pfc", Status: lossless.CannotTell,
				Detail: "the kernel names no netdev for this RoCE port, so its lossless configuration cannot be read"}}
		case lj.Protocol == lossless.RoCE:
			c := lossless.Read(l.Netdev)
			lj.Config = &c
			lj.Findings = lossless.Assess(lj.Protocol, c)
		default:
			lj.Findings = lossless.Assess(lj.Protocol, lossless.Config{Netdev: l.Netdev})
		}
		out = append(out, lj)
	}
	return out
}

func printLossless(w io.Writer, ls []losslessJSON) {
	if len(ls) == 0 {
		return
	}
	fmt.Fprintln(w, "lossless network (RoCE needs PFC or ECN from every hop):")
	for _, l := range ls {
		fmt.Fprintf(w, "  %s port %d, %s over netdev %s:\n", l.Device, l.Port, l.Protocol, orDash(l.Netdev))
		for _, f := range l.Findings {
			fmt.Fprintf(w, "    %-11s  %-12s %s\n", f.Status, f.Check, f.Detail)
			if f.Fix != "" {
				fmt.Fprintf(w, "    %-11s  %-12s fix: %s\n", "", "", f.Fix)
			}
		}
	}
}

// portProtocol tells a port's protocol from sysfs: an RNIC node speaks
// iWARP; a CA speaks RoCE on an Ethernet link and InfiniBand on an
// InfiniBand one.
func portProtocol(dev string, port int) string {
	node := readSysfs(filepath.Join(losslessSysfs, dev, "node_type"))
	ll := readSysfs(filepath.Join(losslessSysfs, dev, "ports", strconv.Itoa(port), "link_layer"))
	switch {
	case strings.Contains(node, "RNIC"):
		return lossless.IWARP
	case ll == "Ethernet":
		return lossless.RoCE
	case ll == "InfiniBand":
		return lossless.InfiniBand
	}
	return "unknown (node type " + strconv.Quote(node) + ", link layer " + strconv.Quote(ll) + ")"
}
