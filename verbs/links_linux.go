package verbs

import (
	"encoding/binary"
	"fmt"
	"iter"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// The kernel's RDMA netlink interface (include/uapi/rdma/rdma_netlink.h);
// verbs/constants_test.go checks these against the header.
const (
	rdmaNLNldev        = 5  // RDMA_NL_NLDEV
	rdmaNldevGet       = 1  // RDMA_NLDEV_CMD_GET
	rdmaNldevPortGet   = 5  // RDMA_NLDEV_CMD_PORT_GET
	rdmaNldevDevIndex  = 1  // RDMA_NLDEV_ATTR_DEV_INDEX
	rdmaNldevDevName   = 2  // RDMA_NLDEV_ATTR_DEV_NAME
	rdmaNldevPortIndex = 3  // RDMA_NLDEV_ATTR_PORT_INDEX
	rdmaNldevPortState = 12 // RDMA_NLDEV_ATTR_PORT_STATE
	rdmaNldevNdevIndex = 50 // RDMA_NLDEV_ATTR_NDEV_INDEX
	rdmaNldevNdevName  = 51 // RDMA_NLDEV_ATTR_NDEV_NAME
)

// links asks the kernel for every RDMA port and the netdev it runs over:
// what `rdma link show` prints. A dump of the devices, then one of each
// device's ports (the kernel dumps ports per device). Reading the same from
// sysfs means one file per GID table entry (1,024 per rxe port), which costs
// a second under an emulated CPU.
func links() ([]Link, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_RDMA)
	if err != nil {
		return nil, fmt.Errorf("verbs: RDMA netlink socket: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("verbs: RDMA netlink bind: %w", err)
	}
	devs, err := netlinkDump(fd, rdmaNldevGet, nil)
	if err != nil {
		return nil, err
	}
	var out []Link
	for _, d := range devs {
		var index []byte
		for a := range netlinkAttrs(d) {
			if a.typ == rdmaNldevDevIndex && len(a.val) >= 4 {
				index = a.val[:4]
			}
		}
		if index == nil {
			continue
		}
		ports, err := netlinkDump(fd, rdmaNldevPortGet, netlinkAttr(rdmaNldevDevIndex, index))
		if err != nil {
			return nil, err
		}
		for _, p := range ports {
			out = append(out, parseLink(p))
		}
	}
	return out, nil
}

// netlinkDump sends a dump request for command cmd of RDMA_NL_NLDEV with
// the given attributes and returns the payload of every answer.
func netlinkDump(fd int, cmd uint16, attrs []byte) ([][]byte, error) {
	typ := uint16(rdmaNLNldev<<10) + cmd
	req := make([]byte, unix.NLMSG_HDRLEN, unix.NLMSG_HDRLEN+len(attrs))
	req = append(req, attrs...)
	binary.NativeEndian.PutUint32(req[0:], uint32(len(req)))
	binary.NativeEndian.PutUint16(req[4:], typ)
	binary.NativeEndian.PutUint16(req[6:], unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("verbs: RDMA netlink request: %w", err)
	}
	var out [][]byte
	buf := make([]byte, 64<<10)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return nil, fmt.Errorf("verbs: RDMA netlink reply: %w", err)
		}
		msgs, err := parseNetlink(buf[:n])
		if err != nil {
			return nil, err
		}
		for _, m := range msgs {
			switch m.typ {
			case unix.NLMSG_DONE, unix.NLMSG_ERROR:
				// Both carry an int: 0, or a negative errno.
				if len(m.data) >= 4 {
					if errno := int32(binary.NativeEndian.Uint32(m.data)); errno < 0 {
						return nil, fmt.Errorf("verbs: RDMA netlink: %w", unix.Errno(-errno))
					}
				}
				return out, nil
			case typ:
				out = append(out, append([]byte(nil), m.data...))
			}
		}
	}
}

// netlinkAttr encodes one attribute, padded.
func netlinkAttr(typ uint16, v []byte) []byte {
	b := make([]byte, nlmAlign(unix.SizeofNlAttr+len(v)))
	binary.NativeEndian.PutUint16(b, uint16(unix.SizeofNlAttr+len(v)))
	binary.NativeEndian.PutUint16(b[2:], typ)
	copy(b[unix.SizeofNlAttr:], v)
	return b
}

type netlinkAttribute struct {
	typ uint16
	val []byte
}

// netlinkAttrs iterates over a message's attributes; a length that does not
// fit ends the iteration.
func netlinkAttrs(b []byte) iter.Seq[netlinkAttribute] {
	return func(yield func(netlinkAttribute) bool) {
		for len(b) >= unix.SizeofNlAttr {
			n := int(binary.NativeEndian.Uint16(b))
			if n < unix.SizeofNlAttr || n > len(b) {
				return
			}
			typ := binary.NativeEndian.Uint16(b[2:]) &^ (unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)
			if !yield(netlinkAttribute{typ, b[unix.SizeofNlAttr:n]}) {
				return
			}
			b = b[min(nlmAlign(n), len(b)):]
		}
	}
}

type netlinkMessage struct {
	typ  uint16
	data []byte
}

// parseNetlink splits a datagram into netlink messages, refusing lengths
// that do not fit.
func parseNetlink(b []byte) ([]netlinkMessage, error) {
	var msgs []netlinkMessage
	for len(b) >= unix.NLMSG_HDRLEN {
		l := int(binary.NativeEndian.Uint32(b))
		if l < unix.NLMSG_HDRLEN || l > len(b) {
			return nil, fmt.Errorf("verbs: RDMA netlink: malformed message")
		}
		msgs = append(msgs, netlinkMessage{typ: binary.NativeEndian.Uint16(b[4:]), data: b[unix.NLMSG_HDRLEN:l]})
		b = b[min(nlmAlign(l), len(b)):]
	}
	return msgs, nil
}

func nlmAlign(n int) int { return (n + unix.NLMSG_ALIGNTO - 1) &^ (unix.NLMSG_ALIGNTO - 1) }

// parseLink reads one port's attributes.
func parseLink(b []byte) Link {
	var l Link
	for a := range netlinkAttrs(b) {
		v := a.val
		switch {
		case a.typ == rdmaNldevDevName:
			l.Device = strings.TrimRight(string(v), "\x00")
		case a.typ == rdmaNldevPortIndex && len(v) >= 4:
			l.Port = uint8(binary.NativeEndian.Uint32(v))
		case a.typ == rdmaNldevPortState && len(v) >= 1:
			l.State = PortState(v[0])
		case a.typ == rdmaNldevNdevIndex && len(v) >= 4:
			l.NetdevIndex = int(binary.NativeEndian.Uint32(v))
		case a.typ == rdmaNldevNdevName:
			l.Netdev = strings.TrimRight(string(v), "\x00")
		}
	}
	return l
}

// lowerNetdevs lists the netdevs under netdev (a VLAN's parent, a bond's
// members), from sysfs's lower_* links, recursively.
func lowerNetdevs(netdev string) []string {
	var out []string
	seen := map[string]bool{netdev: true}
	queue := []string{netdev}
	for len(queue) > 0 {
		d := queue[0]
		queue = queue[1:]
		ents, _ := os.ReadDir(filepath.Join("/sys/class/net", d))
		for _, e := range ents {
			if low, ok := strings.CutPrefix(e.Name(), "lower_"); ok && !seen[low] {
				seen[low] = true
				out = append(out, low)
				queue = append(queue, low)
			}
		}
	}
	return out
}
