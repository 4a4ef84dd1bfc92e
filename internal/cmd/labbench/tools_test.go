package main

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"
)

// Outputs of perftest 4.5+0.17 and rstream (rdma-core 44) in the lab.
const (
	sendLatOut = `---------------------------------------------------------------------------------------
                    Send Latency Test
 Dual-port       : OFF		Device         : rxe0
 Link type       : Ethernet
 GID index       : 1
---------------------------------------------------------------------------------------
 #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] 
 64      2000          27.41          470.43       31.49    	       35.42       	15.50  		135.27  		220.34 
---------------------------------------------------------------------------------------
`
	writeBWOut = `---------------------------------------------------------------------------------------
                    RDMA_Write BW Test
 TX depth        : 128
---------------------------------------------------------------------------------------
 #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]
 65536      256              31.18              29.71  		   0.000475
---------------------------------------------------------------------------------------
`
	rstreamOut = `name      bytes   xfers   iters   total       time     Gb/sec    usec/xfer
custom    64k     256     1       32m         1.34s      0.20    2621.70
`
)

func TestParseSendLat(t *testing.T) {
	got, err := parseSendLat(sendLatOut, 64)
	if err != nil {
		t.Fatal(err)
	}
	// Round trips: twice what perftest prints.
	want := sendLat{typical: 62.98, p99: 270.54, avg: 70.84}
	if !near(got.typical, want.typical) || !near(got.p99, want.p99) || !near(got.avg, want.avg) {
		t.Errorf("got %+v, want %+v", got, want)
	}
	if _, err := parseSendLat(sendLatOut, 4096); err == nil {
		t.Error("a table for 64 bytes was accepted for 4096")
	}
}

func TestParseWriteBW(t *testing.T) {
	got, err := parseWriteBW(writeBWOut, 65536)
	if err != nil {
		t.Fatal(err)
	}
	if want := 29.71 * 1.048576; !near(got, want) {
		t.Errorf("got %v MB/s, want %v", got, want)
	}
	gbits := strings.ReplaceAll(strings.ReplaceAll(writeBWOut, "MB/sec", "Gb/sec"), "29.71", "0.25")
	if got, err := parseWriteBW(gbits, 65536); err != nil || !near(got, 31.25) {
		t.Errorf("Gb/sec: got %v, %v; want 31.25 MB/s", got, err)
	}
	mib := strings.ReplaceAll(writeBWOut, "MB/sec", "MiB/sec")
	if got, err := parseWriteBW(mib, 65536); err != nil || !near(got, 29.71*1.048576) {
		t.Errorf("MiB/sec: got %v, %v", got, err)
	}
}

func TestParseRstream(t *testing.T) {
	got, err := parseRstream(rstreamOut)
	if err != nil || got != 2621.70 {
		t.Errorf("got %v, %v; want 2621.70", got, err)
	}
}

// Output a parser cannot use is an error, never a figure.
func TestParseBroken(t *testing.T) {
	common := []string{
		"",
		"Couldn't connect to 198.18.0.2:18515\nUnable to open file descriptor for socket connection",
	}
	bw := append(common,
		strings.Replace(writeBWOut, "29.71", "n/a", 1),
		strings.Replace(writeBWOut, " 0.000475", "", 1),                              // a value short
		strings.Split(writeBWOut, " 65536      256")[0],                              // cut after the header
		strings.Replace(writeBWOut, "BW average[MB/sec]", "BW average[furlongs]", 1), // unknown unit
		strings.Replace(writeBWOut, "29.71", "0.00", 1),
		sendLatOut,
	)
	for _, out := range bw {
		if v, err := parseWriteBW(out, 65536); err == nil {
			t.Errorf("ib_write_bw: parsed %v from %q", v, out)
		}
	}
	lat := append(common,
		strings.Replace(sendLatOut, "t_typical[usec]", "t_typical[cycles]", 1), // -C
		strings.Replace(sendLatOut, "99% percentile[usec]", "99.5% percentile[usec]", 1),
		strings.Replace(sendLatOut, "135.27", "-", 1),
		writeBWOut,
	)
	for _, out := range lat {
		if v, err := parseSendLat(out, 64); err == nil {
			t.Errorf("ib_send_lat: parsed %+v from %q", v, out)
		}
	}
	rs := append(common,
		"rconnect: Connection refused",
		strings.Replace(rstreamOut, "2621.70", "", 1),
		strings.Replace(rstreamOut, "2621.70", "x", 1),
		strings.Split(rstreamOut, "\n")[0],
	)
	for _, out := range rs {
		if v, err := parseRstream(out); err == nil {
			t.Errorf("rstream: parsed %v from %q", v, out)
		}
	}
}

func TestServerClient(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	run, err := serverClient(ctx, []string{"sh", "-c", "echo server"}, []string{"sh", "-c", "echo client"})
	if err != nil || run.clientOut != "client\n" || run.serverOut != "server\n" || run.wall <= 0 {
		t.Errorf("%+v, %v", run, err)
	}

	// A failing client is retried while the server runs, then reported with both outputs.
	run, err = serverClient(ctx, []string{"sleep", "30"}, []string{"sh", "-c", "echo refused; exit 3"})
	if err == nil || !strings.Contains(run.raw(), "refused") {
		t.Errorf("failing client: %v\n%s", err, run.raw())
	}

	// A client that hangs ends with the context.
	short, cancel2 := context.WithTimeout(ctx, time.Second)
	defer cancel2()
	start := time.Now()
	_, err = serverClient(short, []string{"sleep", "30"}, []string{"sleep", "30"})
	if err == nil || !strings.Contains(err.Error(), "timed out") || time.Since(start) > 10*time.Second {
		t.Errorf("hanging client: %v after %v", err, time.Since(start))
	}
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-6*math.Max(1, math.Abs(b)) }
