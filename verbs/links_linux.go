package verbs

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/rdmanet/sdk/internal/nlmsg"
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
	fd, err := nlmsg.Socket(unix.NETLINK_RDMA)
	if err != nil {
		return nil, fmt.Errorf("verbs: RDMA %w", err)
	}
	defer unix.Close(fd)
	devs, err := netlinkDump(fd, rdmaNldevGet, nil)
	if err != nil {
		return nil, err
	}
	var out []Link
	for _, d := range devs {
		var index []byte
		for a := range nlmsg.Attrs(d) {
			if a.Type == rdmaNldevDevIndex && len(a.Value) >= 4 {
				index = a.Value[:4]
			}
		}
		if index == nil {
			continue
		}
		ports, err := netlinkDump(fd, rdmaNldevPortGet, nlmsg.Attr(rdmaNldevDevIndex, index))
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
	msgs, err := nlmsg.Exchange(fd, uint16(rdmaNLNldev<<10)+cmd, unix.NLM_F_DUMP, attrs)
	if err != nil {
		return nil, fmt.Errorf("verbs: RDMA %w", err)
	}
	return msgs, nil
}

// parseLink reads one port's attributes.
func parseLink(b []byte) Link {
	var l Link
	for a := range nlmsg.Attrs(b) {
		v := a.Value
		switch {
		case a.Type == rdmaNldevDevName:
			l.Device = strings.TrimRight(string(v), "\x00")
		case a.Type == rdmaNldevPortIndex && len(v) >= 4:
			l.Port = uint8(binary.NativeEndian.Uint32(v))
		case a.Type == rdmaNldevPortState && len(v) >= 1:
			l.State = PortState(v[0])
		case a.Type == rdmaNldevNdevIndex && len(v) >= 4:
			l.NetdevIndex = int(binary.NativeEndian.Uint32(v))
		case a.Type == rdmaNldevNdevName:
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
