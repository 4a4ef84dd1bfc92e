package lossless

import (
	"encoding/binary"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/rdmanet/sdk/internal/nlmsg"
)

// The kernel's DCB netlink interface (include/uapi/linux/dcbnl.h);
// dcb_linux_test.go checks these against the header.
const (
	dcbCmdPFCGCfg      = 7  // DCB_CMD_PFC_GCFG
	dcbCmdIEEEGet      = 21 // DCB_CMD_IEEE_GET
	dcbAttrIfname      = 1  // DCB_ATTR_IFNAME
	dcbAttrPFCCfg      = 4  // DCB_ATTR_PFC_CFG
	dcbAttrIEEE        = 13 // DCB_ATTR_IEEE
	dcbAttrIEEEPFC     = 2  // DCB_ATTR_IEEE_PFC
	dcbAttrIEEEAppTab  = 3  // DCB_ATTR_IEEE_APP_TABLE
	dcbAttrIEEEApp     = 1  // DCB_ATTR_IEEE_APP
	dcbPFCUpAttr0      = 1  // DCB_PFC_UP_ATTR_0; _1 to _7 follow
	dcbPFCUpAttrAll    = 9  // DCB_PFC_UP_ATTR_ALL
	appSelDSCP         = 5  // IEEE_8021QAZ_APP_SEL_DSCP
	sizeofIEEEPFC      = 136
	ieeePFCRequestsOff = 8  // offsetof(struct ieee_pfc, requests)
	ieeePFCIndOff      = 72 // offsetof(struct ieee_pfc, indications)
	sizeofDCBApp       = 4
)

// ieeeDCB is what DCB_CMD_IEEE_GET tells.
type ieeeDCB struct {
	pfc    PFC
	hasPFC bool
	// apps are the APP table's entries' selectors; hasApps says the table
	// was there at all.
	selectors []uint8
	hasApps   bool
}

// dcbRequest sends one DCB command about netdev and returns the
// attributes of the answer (after struct dcbmsg).
func dcbRequest(netdev string, cmd uint8, attrs []byte) ([]byte, error) {
	fd, err := nlmsg.Socket(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	// struct dcbmsg: family, command, padding.
	body := []byte{unix.AF_UNSPEC, cmd, 0, 0}
	body = append(body, nlmsg.Attr(dcbAttrIfname, append([]byte(netdev), 0))...)
	body = append(body, attrs...)
	msgs, err := nlmsg.Exchange(fd, unix.RTM_GETDCB, unix.NLM_F_ACK, body)
	if err != nil {
		return nil, fmt.Errorf("DCB netlink: %w", err)
	}
	if len(msgs) == 0 || len(msgs[0]) < 4 {
		return nil, fmt.Errorf("DCB netlink: no answer")
	}
	return msgs[0][4:], nil
}

func readIEEE(netdev string) (ieeeDCB, error) {
	b, err := dcbRequest(netdev, dcbCmdIEEEGet, nil)
	if err != nil {
		return ieeeDCB{}, err
	}
	return parseIEEE(b), nil
}

// parseIEEE reads DCB_CMD_IEEE_GET's answer: the DCB_ATTR_IEEE nest's PFC
// and APP table.
func parseIEEE(b []byte) ieeeDCB {
	var d ieeeDCB
	for a := range nlmsg.Attrs(b) {
		if a.Type != dcbAttrIEEE {
			continue
		}
		for in := range nlmsg.Attrs(a.Value) {
			switch in.Type {
			case dcbAttrIEEEPFC:
				if len(in.Value) < sizeofIEEEPFC {
					continue
				}
				d.hasPFC = true
				d.pfc = PFC{Enabled: in.Value[1], Source: "ieee",
					Requests: make([]uint64, Priorities), Indications: make([]uint64, Priorities)}
				for p := range Priorities {
					d.pfc.Requests[p] = binary.NativeEndian.Uint64(in.Value[ieeePFCRequestsOff+8*p:])
					d.pfc.Indications[p] = binary.NativeEndian.Uint64(in.Value[ieeePFCIndOff+8*p:])
				}
			case dcbAttrIEEEAppTab:
				d.hasApps = true
				for app := range nlmsg.Attrs(in.Value) {
					if app.Type == dcbAttrIEEEApp && len(app.Value) >= sizeofDCBApp {
						d.selectors = append(d.selectors, app.Value[0])
					}
				}
			}
		}
	}
	return d
}

func readCEEPFC(netdev string) (PFC, error) {
	b, err := dcbRequest(netdev, dcbCmdPFCGCfg, nlmsg.Attr(dcbAttrPFCCfg, nlmsg.Attr(dcbPFCUpAttrAll, nil)))
	if err != nil {
		return PFC{}, err
	}
	return parseCEEPFC(b)
}

// parseCEEPFC reads DCB_CMD_PFC_GCFG's answer: one u8 per priority in the
// DCB_ATTR_PFC_CFG nest.
func parseCEEPFC(b []byte) (PFC, error) {
	for a := range nlmsg.Attrs(b) {
		if a.Type != dcbAttrPFCCfg {
			continue
		}
		p := PFC{Source: "cee"}
		seen := 0
		for in := range nlmsg.Attrs(a.Value) {
			prio := int(in.Type) - dcbPFCUpAttr0
			if prio < 0 || prio >= Priorities || len(in.Value) < 1 {
				continue
			}
			seen++
			if in.Value[0] != 0 {
				p.Enabled |= 1 << prio
			}
		}
		if seen == Priorities {
			return p, nil
		}
		return PFC{}, fmt.Errorf("DCB netlink: CEE PFC answer has %d of %d priorities", seen, Priorities)
	}
	return PFC{}, fmt.Errorf("DCB netlink: CEE PFC answer without DCB_ATTR_PFC_CFG")
}
