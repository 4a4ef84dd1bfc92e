package verbs

import (
	"testing"

	"github.com/rdmanet/sdk/internal/cabi"
)

// TestConstantsMatchHeaders checks this package's enums against rdma-core's.
func TestConstantsMatchHeaders(t *testing.T) {
	want := map[string]int64{
		"IBV_TRANSPORT_IB": int64(TransportIB), "IBV_TRANSPORT_IWARP": int64(TransportIWARP),
		"IBV_TRANSPORT_USNIC": int64(TransportUSNIC), "IBV_TRANSPORT_USNIC_UDP": int64(TransportUSNICUDP),
		"IBV_TRANSPORT_UNSPECIFIED": int64(TransportUnspecified),
		"IBV_PORT_DOWN":             int64(PortDown), "IBV_PORT_ACTIVE": int64(PortActive),
		"IBV_PORT_ACTIVE_DEFER":     int64(PortActiveDefer),
		"IBV_LINK_LAYER_INFINIBAND": int64(LinkLayerInfiniBand), "IBV_LINK_LAYER_ETHERNET": int64(LinkLayerEthernet),
		"IBV_MTU_256": 1, "IBV_MTU_4096": 5,
		"IBV_WC_SEND": int64(WCSend), "IBV_WC_RDMA_WRITE": int64(WCRDMAWrite), "IBV_WC_RDMA_READ": int64(WCRDMARead),
		"IBV_WC_RECV": int64(WCRecv), "IBV_WC_RECV_RDMA_WITH_IMM": int64(WCRecvRDMAWithImm),
		"IBV_WC_SUCCESS": int64(WCSuccess), "IBV_WC_LOC_LEN_ERR": int64(WCLocLenErr),
		"IBV_WC_LOC_QP_OP_ERR": int64(WCLocQPOpErr), "IBV_WC_LOC_PROT_ERR": int64(WCLocProtErr),
		"IBV_WC_WR_FLUSH_ERR": int64(WCWRFlushErr), "IBV_WC_REM_ACCESS_ERR": int64(WCRemAccessErr),
		"IBV_WC_REM_OP_ERR": int64(WCRemOpErr), "IBV_WC_RETRY_EXC_ERR": int64(WCRetryExcErr),
		"IBV_WC_RNR_RETRY_EXC_ERR": int64(WCRNRRetryExcErr), "IBV_WC_GENERAL_ERR": int64(WCGeneralErr),
		"IBV_WC_WITH_IMM": int64(WCWithImm),
	}
	names := make([]string, 0, len(want))
	for n := range want {
		names = append(names, n)
	}
	got := cabi.Constants(t, names)
	for n, w := range want {
		if got[n] != w {
			t.Errorf("%s = %d in rdma-core, %d here", n, got[n], w)
		}
	}
	if int64(len(wcStatusText)) != got["IBV_WC_GENERAL_ERR"]+1 {
		t.Errorf("wcStatusText has %d entries, rdma-core's statuses end at %d", len(wcStatusText), got["IBV_WC_GENERAL_ERR"])
	}
	if mtuBytes(int(got["IBV_MTU_256"])) != 256 || mtuBytes(int(got["IBV_MTU_4096"])) != 4096 {
		t.Error("mtuBytes disagrees with enum ibv_mtu")
	}
}
