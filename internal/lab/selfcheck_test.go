//go:build linux

package lab

import (
	"maps"
	"testing"
)

// TestDevinfoTransports reads the transports out of ibv_devinfo's output
// (rdma-core 44's layout), ports and all.
func TestDevinfoTransports(t *testing.T) {
	out := "hca_id:\trxe0\n" +
		"\ttransport:\t\t\tInfiniBand (0)\n" +
		"\tfw_ver:\t\t\t\t0.0.0\n" +
		"\t\tport:\t1\n" +
		"\t\t\tstate:\t\t\tPORT_ACTIVE (4)\n" +
		"\t\t\tlink_layer:\t\tEthernet\n" +
		"\n" +
		"hca_id:\tsiw0\n" +
		"\ttransport:\t\t\tiWARP (1)\n" +
		"\t\tport:\t1\n" +
		"\t\t\tlink_layer:\t\tEthernet\n"
	want := map[string]string{"rxe0": "InfiniBand", "siw0": "iWARP"}
	if got := devinfoTransports(out); !maps.Equal(got, want) {
		t.Errorf("devinfoTransports = %v, want %v", got, want)
	}
	if got := devinfoTransports("No IB devices found\n"); len(got) != 0 {
		t.Errorf("devinfoTransports of no devices = %v", got)
	}
}
