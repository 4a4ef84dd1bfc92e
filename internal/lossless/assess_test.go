package lossless

import (
	"errors"
	"strings"
	"testing"
)

func status(fs []Finding, check string) Finding {
	for _, f := range fs {
		if f.Check == check {
			return f
		}
	}
	return Finding{}
}

func TestAssess(t *testing.T) {
	noDCB := errors.New("DCB netlink: operation not supported")
	good := Config{Netdev: "eth0", PFC: PFC{Enabled: 1 << 3, Source: "ieee"}, Trust: Trust{Mode: TrustDSCP, Source: "dcb-app"},
		ECN: ECN{RP: 1 << 3, NP: 1 << 3}, Counters: pickCounters([]Stat{{"rx_prio3_pause", 5}, {"rx_discards_phy", 0}})}
	for _, f := range Assess(RoCE, good) {
		if f.Status != OK {
			t.Errorf("a good config: %+v", f)
		}
	}

	noPFC := good
	noPFC.PFC = PFC{Source: "ieee"}
	f := status(Assess(RoCE, noPFC), "pfc")
	if f.Status != Warn || !strings.Contains(f.Detail, "retransmissions") || !strings.Contains(f.Fix, "dcb pfc set dev eth0 prio-pfc 3:on") {
		t.Errorf("RoCE without PFC: %+v", f)
	}

	nothing := noPFC
	nothing.ECN = ECN{}
	if f := status(Assess(RoCE, nothing), "pfc"); f.Status != Fail {
		t.Errorf("RoCE with neither PFC nor ECN: %+v", f)
	}
	if f := status(Assess(RoCE, nothing), "ecn"); f.Status != Warn || f.Fix == "" {
		t.Errorf("RoCE without ECN: %+v", f)
	}

	unknown := Config{Netdev: "lab-a", PFC: PFC{Err: noDCB}, Trust: Trust{Err: noDCB}, ECN: ECN{Err: noDCB}, Counters: pickCounters(nil)}
	for _, f := range Assess(RoCE, unknown) {
		if f.Status != CannotTell {
			t.Errorf("nothing known: %+v, want cannot tell", f)
		}
	}

	dropped := good
	dropped.Counters = pickCounters([]Stat{{"tx_pause_ctrl_phy", 1}, {"rx_discards_phy", 12}, {"rx_bytes", 9}})
	if f := status(Assess(RoCE, dropped), "counters"); f.Status != Warn || !strings.Contains(f.Detail, "rx_discards_phy 12") {
		t.Errorf("discards: %+v", f)
	}

	for _, p := range []string{IWARP, InfiniBand} {
		fs := Assess(p, unknown)
		if len(fs) != 1 || fs[0].Status != OK || !strings.Contains(fs[0].Detail, "PFC is not needed") {
			t.Errorf("%s: %+v", p, fs)
		}
	}
	if fs := Assess("usNIC", good); fs[0].Status != CannotTell {
		t.Errorf("an unknown protocol: %+v", fs)
	}
}

func TestPickCounters(t *testing.T) {
	c := pickCounters([]Stat{{"rx_pause_ctrl_phy", 1}, {"tx_prio3_pause", 2}, {"link_xoff_rx", 3}, {"rx_pfc_ena_frames_pri3", 4},
		{"rx_discards_phy", 5}, {"rx_out_of_buffer", 6}, {"rx_packets", 7}, {"peer_ifindex", 8}})
	if len(c.Pause) != 4 || len(c.Discards) != 2 || c.Total != 8 {
		t.Errorf("pickCounters = %+v", c)
	}
}
