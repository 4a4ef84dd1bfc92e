package portstat

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// fakePort writes a port's counters under root, as sysfs lays them out.
func fakePort(t *testing.T, root, dev string, port string, src string, vals map[string]string) {
	t.Helper()
	dir := filepath.Join(root, dev, "ports", port, src)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for n, v := range vals {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func find(iv Interval, name string) (Rate, bool) {
	for _, r := range iv.Rates {
		if r.Name == name {
			return r, true
		}
	}
	return Rate{}, false
}

func TestReadPortAndRates(t *testing.T) {
	root := t.TempDir()
	// rxe's hw_counters, with a settings file and junk that are not counters.
	fakePort(t, root, "rxe0", "1", SourceHW, map[string]string{
		"sent_pkts": "100\n", "rcvd_seq_err": "5\n", "completer_retry_err": "0\n", "lifespan": "10\n", "junk": "n/a\n",
	})
	prev, err := ReadPort(root, "rxe0", 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(prev.Counters) != 3 {
		t.Fatalf("read %+v, want the three counters", prev.Counters)
	}
	// Two seconds later: traffic, a counter reset (the driver reloaded its
	// counters), one vanished, one new.
	os.Remove(filepath.Join(root, "rxe0/ports/1/hw_counters/completer_retry_err"))
	fakePort(t, root, "rxe0", "1", SourceHW, map[string]string{"sent_pkts": "300\n", "rcvd_seq_err": "2\n", "send_rnr_err": "4\n"})
	cur, err := ReadPort(root, "rxe0", 1)
	if err != nil {
		t.Fatal(err)
	}
	cur.Time = prev.Time.Add(2 * time.Second)
	iv := Rates(prev, cur)
	if iv.Seconds != 2 {
		t.Errorf("interval %v s", iv.Seconds)
	}
	if r, _ := find(iv, "sent_pkts"); r.Delta != 200 || r.PerSecond == nil || *r.PerSecond != 100 || r.Reset {
		t.Errorf("sent_pkts: %+v", r)
	}
	if r, _ := find(iv, "rcvd_seq_err"); !r.Reset || r.PerSecond != nil || r.Delta != 0 || !strings.Contains(r.Meaning, "sequence") {
		t.Errorf("a counter that went down: %+v", r)
	}
	if r, ok := find(iv, "send_rnr_err"); !ok || r.Delta != 0 || r.PerSecond == nil || *r.PerSecond != 0 {
		t.Errorf("a new counter: %+v", r)
	}
	if !slices.Equal(iv.Vanished, []string{"hw_counters/completer_retry_err"}) {
		t.Errorf("vanished %v", iv.Vanished)
	}
	if _, err := ReadPort(root, "rxe0", 2); err == nil {
		t.Error("a port without counters was read")
	}
}

func TestPorts(t *testing.T) {
	root := t.TempDir()
	fakePort(t, root, "mlx5_0", "1", SourcePort, map[string]string{"port_rcv_errors": "0"})
	fakePort(t, root, "mlx5_0", "2", SourcePort, map[string]string{"port_rcv_errors": "0"})
	fakePort(t, root, "rxe0", "1", SourceHW, map[string]string{"sent_pkts": "0"})
	got, err := Ports(root)
	if err != nil || !slices.Equal(got["mlx5_0"], []int{1, 2}) || !slices.Equal(got["rxe0"], []int{1}) {
		t.Errorf("Ports = %v, %v", got, err)
	}
}

func TestLacks(t *testing.T) {
	rxe := Reading{Counters: []Counter{{SourceHW, "completer_retry_err", 0}, {SourceHW, "out_of_seq_request", 0},
		{SourceHW, "rcvd_rnr_err", 0}, {SourceHW, "sent_pkts", 0}}}
	want := []string{"local-ack-timeout", "cnp-sent", "cnp-handled", "port_rcv_errors", "port_xmit_discards", "pause"}
	if got := Lacks(rxe); !slices.Equal(got, want) {
		t.Errorf("rxe lacks %v, want %v", got, want)
	}
	mlx5 := Reading{Counters: []Counter{{SourceHW, "roce_adp_retrans", 0}, {SourceHW, "out_of_sequence", 0},
		{SourceHW, "rnr_nak_retry_err", 0}, {SourceHW, "local_ack_timeout_err", 0}, {SourceHW, "np_cnp_sent", 0},
		{SourceHW, "rp_cnp_handled", 0}, {SourcePort, "port_rcv_errors", 0}, {SourcePort, "port_xmit_discards", 0},
		{SourceNetdevHW, "rx_prio3_pause", 0}}}
	if got := Lacks(mlx5); len(got) != 0 {
		t.Errorf("mlx5 lacks %v", got)
	}
	if Meaning("sent_pkts") != "" || Meaning("tx_pause_ctrl_phy") == "" || Meaning("local_ack_timeout_err") == "" {
		t.Error("Meaning: a plain counter has a meaning, or a trouble one has none")
	}
}
