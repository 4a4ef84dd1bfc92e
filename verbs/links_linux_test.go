package verbs

import (
	"encoding/binary"
	"testing"

	"github.com/rdmanet/sdk/internal/cabi"
	"github.com/rdmanet/sdk/internal/nlmsg"
)

func TestNetlinkConstantsMatchHeaders(t *testing.T) {
	want := map[string]int64{
		"RDMA_NL_NLDEV": rdmaNLNldev, "RDMA_NLDEV_CMD_GET": rdmaNldevGet, "RDMA_NLDEV_CMD_PORT_GET": rdmaNldevPortGet,
		"RDMA_NLDEV_ATTR_DEV_INDEX": rdmaNldevDevIndex,
		"RDMA_NLDEV_ATTR_DEV_NAME":  rdmaNldevDevName, "RDMA_NLDEV_ATTR_PORT_INDEX": rdmaNldevPortIndex,
		"RDMA_NLDEV_ATTR_PORT_STATE": rdmaNldevPortState, "RDMA_NLDEV_ATTR_NDEV_INDEX": rdmaNldevNdevIndex,
		"RDMA_NLDEV_ATTR_NDEV_NAME": rdmaNldevNdevName,
	}
	cabi.CheckConstants(t, want)
}

func TestParseLink(t *testing.T) {
	u32 := func(v uint32) []byte { return binary.NativeEndian.AppendUint32(nil, v) }
	var b []byte
	b = append(b, nlmsg.Attr(rdmaNldevDevName, []byte("rxe0\x00"))...)
	b = append(b, nlmsg.Attr(rdmaNldevPortIndex, u32(1))...)
	b = append(b, nlmsg.Attr(rdmaNldevPortState, []byte{4})...)
	b = append(b, nlmsg.Attr(rdmaNldevNdevIndex, u32(7))...)
	b = append(b, nlmsg.Attr(rdmaNldevNdevName, []byte("lab-a\x00"))...)
	want := Link{Device: "rxe0", Port: 1, State: PortActive, Netdev: "lab-a", NetdevIndex: 7}
	if got := parseLink(b); got != want {
		t.Errorf("parseLink = %+v, want %+v", got, want)
	}
	// Truncated and lying lengths end parsing; they never read out of bounds.
	for i := range b {
		parseLink(b[:i])
	}
	bad := nlmsg.Attr(rdmaNldevDevName, []byte("x"))
	binary.NativeEndian.PutUint16(bad, 200)
	if got := parseLink(bad); got != (Link{}) {
		t.Errorf("an attribute longer than its message was read: %+v", got)
	}
}
