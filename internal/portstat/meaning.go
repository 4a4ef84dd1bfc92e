package portstat

import "strings"

// Signal is one of the kinds of counter that tell of trouble on a RoCE
// network, whichever name a driver gives it.
type Signal struct {
	Key  string // short name, as `rdmanet stat` lists what a device lacks
	What string
}

// Signals are the kinds operators watch, in order.
var Signals = []Signal{
	{"retransmissions", "packets resent after a loss"},
	{"out-of-sequence", "packets that arrived after a gap"},
	{"rnr-nak", "RNR NAKs: a receiver had no receive buffer posted"},
	{"local-ack-timeout", "no ACK in time"},
	{"cnp-sent", "congestion notifications sent"},
	{"cnp-handled", "congestion notifications acted on"},
	{"port_rcv_errors", "received packets with errors"},
	{"port_xmit_discards", "packets discarded on transmit"},
	{"pause", "pause frames"},
}

type meaning struct {
	signal string
	text   string
}

// meanings maps counter names (mlx5's, rxe's, the IB port counters) to
// their kind and a one-line meaning.
var meanings = map[string]meaning{
	// Retransmissions.
	"completer_retry_err": {"retransmissions", "retransmissions: the requester resent after a NAK or timeout (loss in the path)"},
	"roce_adp_retrans":    {"retransmissions", "adaptive retransmissions: resent after a timeout (loss in the path)"},
	"duplicate_request":   {"retransmissions", "duplicate requests received: the peer retransmitted"},
	"retry_exceeded_err":  {"retransmissions", "retries exhausted: a QP gave up and its connection broke"},
	// Out of sequence.
	"out_of_sequence":    {"out-of-sequence", "packets received out of sequence: a drop upstream"},
	"out_of_seq_request": {"out-of-sequence", "requests received out of sequence: a drop upstream"},
	"rcvd_seq_err":       {"out-of-sequence", "sequence-error NAKs received: the peer saw a gap and asked to resend"},
	"packet_seq_err":     {"out-of-sequence", "sequence-error NAKs received: the peer saw a gap and asked to resend"},
	// RNR.
	"rnr_nak_retry_err":      {"rnr-nak", "RNR NAK retries exhausted: the receiver had no receive buffer posted"},
	"rcvd_rnr_err":           {"rnr-nak", "RNR NAKs received: the peer had no receive buffer posted"},
	"send_rnr_err":           {"rnr-nak", "RNR NAKs sent: this side had no receive buffer posted"},
	"retry_rnr_exceeded_err": {"rnr-nak", "RNR retries exhausted: a QP gave up waiting for receive buffers"},
	// ACK timeouts.
	"local_ack_timeout_err": {"local-ack-timeout", "local ACK timeouts: no ACK in time, a retransmission followed"},
	// Congestion control (DCQCN).
	"np_cnp_sent":                {"cnp-sent", "CNPs sent: this receiver got ECN-marked packets (congestion in the path)"},
	"rp_cnp_handled":             {"cnp-handled", "CNPs handled: this sender slowed down for congestion"},
	"np_ecn_marked_roce_packets": {"", "ECN-marked RoCE packets received: a switch saw congestion"},
	// IB port counters.
	"port_rcv_errors":                 {"port_rcv_errors", "received packets with errors (bad CRC or length): cabling or a failing port"},
	"port_xmit_discards":              {"port_xmit_discards", "packets discarded on transmit: the port was congested or down"},
	"port_rcv_remote_physical_errors": {"", "packets received marked bad by a remote port"},
	"link_downed":                     {"", "times the link went down"},
	"link_error_recovery":             {"", "link error recoveries"},
}

// Meaning is a one-line meaning for a counter that signals trouble, or ""
// for the others. Driver statistics with "pause", "xoff", "xon" or "pfc"
// in their names are pause frames, whatever the driver.
func Meaning(name string) string {
	if m, ok := meanings[name]; ok {
		return m.text
	}
	if isPause(name) {
		return "pause frames: the link paused traffic (PFC at work; a steady rate means congestion)"
	}
	if strings.Contains(name, "discard") || strings.Contains(name, "out_of_buffer") {
		return "discards: packets dropped for lack of buffer"
	}
	return ""
}

func isPause(name string) bool {
	n := strings.ToLower(name)
	return strings.Contains(n, "pause") || strings.Contains(n, "xoff") || strings.Contains(n, "xon") || strings.Contains(n, "pfc")
}

// Lacks lists the Signals none of whose counters r has.
func Lacks(r Reading) []string {
	have := map[string]bool{}
	for _, c := range r.Counters {
		if m, ok := meanings[c.Name]; ok && m.signal != "" {
			have[m.signal] = true
		}
		if isPause(c.Name) {
			have["pause"] = true
		}
	}
	out := []string{}
	for _, s := range Signals {
		if !have[s.Key] {
			out = append(out, s.Key)
		}
	}
	return out
}
