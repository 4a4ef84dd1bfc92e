package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/rdmanet/sdk/fallback"
	"github.com/rdmanet/sdk/internal/rdmalink"
	"github.com/rdmanet/sdk/verbs"
)

// devicesJSON is `rdmanet devices --json`.
type devicesJSON struct {
	Command string       `json:"command"` // "devices"
	Usable  bool         `json:"usable"`  // at least one device opened with an ACTIVE port
	Devices []deviceJSON `json:"devices"`
	// Links are the RDMA ports the kernel reports (over netlink, without
	// rdma-core): present even when rdma-core cannot be used.
	Links    []linkJSON    `json:"links"`
	Fallback *fallbackJSON `json:"fallback"` // why RDMA cannot be used here, or null
	Limits   limitsJSON    `json:"limits"`
	// Lossless is the lossless-network check of every RDMA port; it does
	// not change the exit code.
	Lossless []losslessJSON `json:"lossless"`
	TookMS   float64        `json:"took_ms"`
	ExitCode int            `json:"exit_code"`
}

type deviceJSON struct {
	Name      string `json:"name"`
	GUID      string `json:"guid"`
	Transport string `json:"transport"` // the device's transport: "IB" (InfiniBand and RoCE), "iWARP", ...
	Firmware  string `json:"firmware,omitempty"`
	VendorID  uint32 `json:"vendor_id"`
	PartID    uint32 `json:"vendor_part_id"`
	// Provider is the kernel driver where rdmanet knows it by its vendor
	// id ("rxe", "siw"), and QueueBytes what a connection end's queues
	// take of its memory with the default rdmanet.Config
	// (rdmanet.Footprint.Queues); "" and 0 for other devices.
	Provider   string     `json:"provider,omitempty"`
	QueueBytes int        `json:"queue_bytes_per_connection,omitempty"`
	MaxQP      int        `json:"max_qp"`
	MaxQPWR    int        `json:"max_qp_wr"`
	MaxCQE     int        `json:"max_cqe"`
	MaxMR      int        `json:"max_mr"`
	MaxMRSize  uint64     `json:"max_mr_size"`
	Ports      []portJSON `json:"ports"`
	Error      string     `json:"error,omitempty"` // opening or querying the device failed
}

type portJSON struct {
	Port        int       `json:"port"`
	State       string    `json:"state"`      // "ACTIVE", "DOWN", ...
	LinkLayer   string    `json:"link_layer"` // "Ethernet", "InfiniBand", "unspecified"
	Protocol    string    `json:"protocol"`   // "RoCE", "InfiniBand", "iWARP", ...
	MTU         int       `json:"mtu"`        // active MTU, bytes
	MaxMTU      int       `json:"max_mtu"`
	Netdev      string    `json:"netdev"` // "" when the port has none (InfiniBand) or it is unknown
	GIDTableLen int       `json:"gid_table_len"`
	GIDs        []gidJSON `json:"gids"` // the non-zero entries
	Error       string    `json:"error,omitempty"`
}

type gidJSON struct {
	Index  int    `json:"index"`
	GID    string `json:"gid"`            // e.g. "::ffff:198.18.0.1"
	Addr   string `json:"addr"`           // the IP address it holds (IPv4-mapped unmapped), e.g. "198.18.0.1"
	Type   string `json:"type,omitempty"` // "RoCE v2", "IB/RoCE v1", from sysfs
	Netdev string `json:"netdev,omitempty"`
}

type linkJSON struct {
	Device string `json:"device"`
	Port   int    `json:"port"`
	State  string `json:"state"`
	Netdev string `json:"netdev"`
}

func runDevices(ctx context.Context, g *globals, fs *flag.FlagSet, args []string) int {
	if _, code, ok := parse(g, fs, args, 0); !ok {
		return code
	}
	start := time.Now()
	out := devicesJSON{Command: "devices", Devices: []deviceJSON{}, Links: []linkJSON{}, Limits: readLimits()}

	links, _ := verbs.Links() // for the netdevs; an error here leaves them unknown
	netdevOf := map[string]string{}
	for _, l := range links {
		netdevOf[l.Device+"/"+strconv.Itoa(int(l.Port))] = l.Netdev
		out.Links = append(out.Links, linkJSON{Device: l.Device, Port: int(l.Port), State: l.State.String(), Netdev: l.Netdev})
	}

	devs, err := verbs.Devices()
	if err == nil && len(devs) == 0 {
		err = verbs.ErrNoDevice
	}
	if err != nil {
		out.Fallback = reasonOnly(fallback.Classify(err), err)
	}
	var firstErr error
	for _, d := range devs {
		dj := queryDevice(d, netdevOf)
		if dj.Error != "" && firstErr == nil {
			firstErr = errors.New(dj.Name + ": " + dj.Error)
		}
		for _, p := range dj.Ports {
			if p.State == verbs.PortActive.String() && dj.Error == "" {
				out.Usable = true
			}
		}
		out.Devices = append(out.Devices, dj)
	}
	if len(devs) > 0 && !out.Usable {
		why := firstErr
		if why == nil {
			why = errors.New("no port of any RDMA device is ACTIVE")
		}
		r := fallback.Classify(why)
		if r == fallback.ReasonRDMAError {
			r = fallback.ReasonNoDevice // a device that cannot be used is as good as none
		}
		out.Fallback = reasonOnly(r, why)
	}
	out.Lossless = checkLossless(links)
	out.TookMS = ms(time.Since(start))
	out.ExitCode = exitOK
	if !out.Usable {
		out.ExitCode = exitNoRDMA
	}
	if g.json {
		writeJSON(g.stdout, out)
	} else {
		printDevices(g.stdout, &out)
	}
	return out.ExitCode
}

// queueBytesOf is what the default Footprint says a connection end's
// queues take on provider, or 0 where it does not say.
func queueBytesOf(provider string) int {
	for _, q := range defaultFootprint().Queues {
		if q.Provider == provider {
			return q.Bytes()
		}
	}
	return 0
}

// queryDevice opens d and reads its attributes, ports and GIDs.
func queryDevice(d verbs.Device, netdevOf map[string]string) deviceJSON {
	dj := deviceJSON{Name: d.Name, GUID: formatGUID(d.GUID), Transport: d.Transport.String(), Ports: []portJSON{}}
	c, err := verbs.Open(d.Name)
	if err != nil {
		dj.Error = err.Error()
		return dj
	}
	defer c.Close()
	a, err := c.QueryDevice()
	if err != nil {
		dj.Error = err.Error()
		return dj
	}
	dj.Firmware, dj.VendorID, dj.PartID = a.FirmwareVersion, a.VendorID, a.VendorPartID
	dj.Provider = rdmalink.ProviderOf(a.VendorID)
	dj.QueueBytes = queueBytesOf(dj.Provider)
	dj.MaxQP, dj.MaxQPWR, dj.MaxCQE, dj.MaxMR, dj.MaxMRSize = a.MaxQP, a.MaxQPWR, a.MaxCQE, a.MaxMR, a.MaxMRSize
	for port := 1; port <= a.PhysPortCount && port <= 255; port++ {
		pj := portJSON{Port: port, GIDs: []gidJSON{}, Netdev: netdevOf[d.Name+"/"+strconv.Itoa(port)]}
		pa, err := c.QueryPort(uint8(port))
		if err != nil {
			pj.Error = err.Error()
			dj.Ports = append(dj.Ports, pj)
			continue
		}
		pj.State, pj.LinkLayer = pa.State.String(), pa.LinkLayer.String()
		pj.Protocol = protocolOf(d.Transport, pa.LinkLayer)
		pj.MTU, pj.MaxMTU, pj.GIDTableLen = pa.ActiveMTU, pa.MaxMTU, pa.GIDTableLen
		pj.GIDs, err = readGIDs(c, d.Name, port, pa.GIDTableLen)
		if err != nil {
			pj.Error = err.Error()
		}
		if d.Transport == verbs.TransportIWARP {
			// sysfs calls an iWARP GID "IB/RoCE v1" (siw's, made of the
			// MAC address): a GID type means nothing to iWARP, which
			// addresses by IP and TCP port.
			for i := range pj.GIDs {
				pj.GIDs[i].Type = ""
			}
		}
		dj.Ports = append(dj.Ports, pj)
	}
	return dj
}

// protocolOf names what a port speaks: a device of transport IB is
// InfiniBand on an InfiniBand link and RoCE on Ethernet.
func protocolOf(t verbs.Transport, ll verbs.LinkLayer) string {
	switch {
	case t == verbs.TransportIWARP:
		return "iWARP"
	case t == verbs.TransportIB && ll == verbs.LinkLayerEthernet:
		return "RoCE"
	case t == verbs.TransportIB && ll == verbs.LinkLayerInfiniBand:
		return "InfiniBand"
	case t == verbs.TransportIB:
		return "InfiniBand" // old kernels report no link layer for IB ports
	}
	return t.String()
}

// maxGIDScan bounds the GID table scan, whatever the port claims.
const maxGIDScan = 4096

// readGIDs returns a port's non-zero GID entries. The table is read with
// ibv_query_gid, entry by entry up to the table's length (1,024 entries on
// rxe: about 10 ms under the lab's emulated CPU, where reading the same
// from sysfs takes half a second); the type and netdev of the few non-zero
// entries come from sysfs.
func readGIDs(c *verbs.Context, dev string, port, tableLen int) ([]gidJSON, error) {
	out := []gidJSON{}
	attrs := filepath.Join("/sys/class/infiniband", dev, "ports", strconv.Itoa(port), "gid_attrs")
	for i := 0; i < min(tableLen, maxGIDScan); i++ {
		gid, err := c.QueryGID(uint8(port), i)
		if err != nil {
			// Some providers fail on entries past the ones in use.
			if len(out) > 0 {
				break
			}
			return out, err
		}
		if gid.IsZero() {
			continue
		}
		gj := gidJSON{Index: i, GID: gid.String(), Addr: gid.Addr().String()}
		gj.Type = readSysfs(filepath.Join(attrs, "types", strconv.Itoa(i)))
		gj.Netdev = readSysfs(filepath.Join(attrs, "ndevs", strconv.Itoa(i)))
		out = append(out, gj)
	}
	return out, nil
}

func readSysfs(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// formatGUID writes a GUID as ibv_devinfo does: four groups of 16 bits.
func formatGUID(g uint64) string {
	return fmt.Sprintf("%04x:%04x:%04x:%04x", g>>48, g>>32&0xffff, g>>16&0xffff, g&0xffff)
}

func printDevices(w io.Writer, out *devicesJSON) {
	if len(out.Devices) == 0 {
		fmt.Fprintln(w, "no RDMA devices")
	}
	for _, d := range out.Devices {
		fmt.Fprintf(w, "%s  transport %s, GUID %s", d.Name, d.Transport, d.GUID)
		if d.Error != "" {
			fmt.Fprintf(w, "\n  error: %s\n\n", d.Error)
			continue
		}
		fmt.Fprintf(w, ", firmware %s, vendor %#x part %d\n", orDash(d.Firmware), d.VendorID, d.PartID)
		if d.Provider != "" {
			fmt.Fprintf(w, "  provider %s: a connection end's queues take %s of its memory, mapped into the process (not pinned)\n",
				d.Provider, iec(uint64(d.QueueBytes)))
		}
		fmt.Fprintf(w, "  max QPs %d, max QP WRs %d, max CQEs %d, max MRs %d, max MR size %s\n",
			d.MaxQP, d.MaxQPWR, d.MaxCQE, d.MaxMR, mrSize(d.MaxMRSize))
		for _, p := range d.Ports {
			if p.Error != "" && p.State == "" {
				fmt.Fprintf(w, "  port %d: error: %s\n", p.Port, p.Error)
				continue
			}
			fmt.Fprintf(w, "  port %d: %s, %s (link layer %s), MTU %d (max %d), netdev %s, %d of %d GIDs in use\n",
				p.Port, p.State, p.Protocol, p.LinkLayer, p.MTU, p.MaxMTU, orDash(p.Netdev), len(p.GIDs), p.GIDTableLen)
			for _, gd := range p.GIDs {
				line := fmt.Sprintf("    GID %-4d %-28s", gd.Index, gd.GID)
				if gd.Addr != gd.GID {
					line += " " + fmt.Sprintf("%-16s", gd.Addr)
				} else {
					line += " " + fmt.Sprintf("%-16s", "")
				}
				line += " " + fmt.Sprintf("%-11s", orDash(gd.Type)) + " " + orDash(gd.Netdev)
				fmt.Fprintln(w, strings.TrimRight(line, " "))
			}
			if p.Error != "" {
				fmt.Fprintf(w, "    error: %s\n", p.Error)
			}
		}
		fmt.Fprintln(w)
	}
	if out.Fallback != nil {
		fmt.Fprintln(w, "RDMA cannot be used on this host:")
		printFallback(w, "  ", out.Fallback)
		if len(out.Links) > 0 {
			fmt.Fprintln(w, "  the kernel has these RDMA ports:")
			for _, l := range out.Links {
				fmt.Fprintf(w, "    %s port %d: %s, netdev %s\n", l.Device, l.Port, l.State, orDash(l.Netdev))
			}
		}
		fmt.Fprintln(w)
	}
	if len(out.Lossless) > 0 {
		printLossless(w, out.Lossless)
		fmt.Fprintln(w)
	}
	printLimits(w, out.Limits)
}

func mrSize(n uint64) string {
	if n == ^uint64(0) {
		return "unlimited"
	}
	return iec(n)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
