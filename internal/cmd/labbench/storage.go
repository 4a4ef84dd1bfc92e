package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The storage section (issue 11's table): examples/blockstore, an NBD
// server on rdmanet, measured from two clients over RDMA and over TCP.
//
//   - The Go client: `blockstore bench -json`, one nbd.Client on an
//     rdmanet connection.
//   - fio on the kernel's /dev/nbdN: nbd-client connects the device to
//     `blockstore bridge`'s unix socket, and the bridge relays to the
//     server over rdmanet. The kernel's nbd client speaks only TCP and unix
//     sockets, so this is how a kernel block device's bytes cross the
//     network over RDMA.
//   - fio on /dev/nbdN connected by nbd-client straight to the server over
//     TCP: the same path as the bridge's TCP figures but for the bridge,
//     which is what the bridge costs.
//
// The commands are separate processes (bin/blockstore, built from the
// examples module, which the SDK's module does not depend on), as a user
// runs them. Every figure is one run of -storage-duration; workloads
// follow each other in the same order for every client and transport.

// storageID selects the section in -only.
const storageID = "storage"

// storageWorkload is one line of the table.
type storageWorkload struct {
	name  string // in the report
	rw    string // blockstore bench's and fio's -rw
	bs    int
	depth int
}

// storageWorkloads are issue 11's: the three of the published table's
// kind, each at queue depth 1 and 32.
var storageWorkloads = func() []storageWorkload {
	var ws []storageWorkload
	for _, w := range []storageWorkload{
		{name: "4 KiB sequential read", rw: "read", bs: 4 << 10},
		{name: "4 KiB random write", rw: "randwrite", bs: 4 << 10},
		{name: "128 KiB sequential read", rw: "read", bs: 128 << 10},
	} {
		for _, d := range []int{1, 32} {
			w.depth = d
			ws = append(ws, w)
		}
	}
	return ws
}()

// storageClient is a column group of the table: who issues the requests,
// over which transport.
type storageClient struct {
	id        string // for the report's problems
	label     string
	transport string // "rdma" or "tcp"
}

var (
	goRDMA     = storageClient{"go-rdma", "Go client, RDMA", "rdma"}
	goTCP      = storageClient{"go-tcp", "Go client, TCP", "tcp"}
	bridgeRDMA = storageClient{"fio-bridge-rdma", "fio on /dev/nbd0 via the bridge, RDMA", "rdma"}
	bridgeTCP  = storageClient{"fio-bridge-tcp", "fio on /dev/nbd0 via the bridge, TCP", "tcp"}
	directTCP  = storageClient{"fio-direct-tcp", "fio on /dev/nbd0, kernel TCP to the server (no bridge)", "tcp"}
)

// storageClients in the order measured and shown: the anchor first.
var storageClients = []storageClient{nvmeRDMA, nvmeTCP, goRDMA, goTCP, bridgeRDMA, bridgeTCP, directTCP}

const (
	storageExportSize = 512 << 20 // the memory export; also fio's -size
	storagePort       = 10809     // NBD's
)

// storageFigure is one measurement: throughput and mean and p99 latency.
type storageFigure struct {
	mbps, mean, p99 float64 // MB/s (10^6); µs
	how             string  // the command, for the report
	missing         string  // why there is no figure
	raw             string  // output that could not be parsed
	// A median of rounds (medianFigure): the throughputs of the rounds
	// that had a figure, and how many rounds had none.
	roundsMBps []float64
	missed     int
}

// storageRun is the section's result.
type storageRun struct {
	skipped  string // why the section was not measured, if it was not
	duration time.Duration
	rounds   int                               // made
	figures  map[storageClient][]storageFigure // by client, one per workload: the rounds' medians
	setup    []string                          // what went wrong outside a figure
}

// runStorage measures the section: -rounds rounds, each of every client
// and workload in the same order, the anchor's first; a figure is the
// median of its rounds (rxe's figures move by 1.6 x between rounds, and
// interleaved rounds spread that over every column alike).
func (b *bench) runStorage() {
	if !b.withStorage {
		return
	}
	run := &storageRun{duration: b.opt.storageDuration, figures: map[storageClient][]storageFigure{}}
	b.storage = run
	if b.opt.blockstore == "" {
		run.skipped = "labbench was not given -blockstore (`make bench` builds bin/blockstore and gives it)"
		return
	}
	for _, tool := range []string{b.opt.blockstore, "fio", "nbd-client"} {
		if _, err := exec.LookPath(tool); err != nil {
			run.skipped = fmt.Sprintf("%s cannot be run: %v", tool, err)
			return
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(b.opt.rounds)*10*time.Minute)
	defer cancel()
	addr := fmt.Sprintf("%s:%d", b.env.AddrB, storagePort)
	srv, err := startProcess(ctx, "serve", regexp.MustCompile(`serving .* over \[rdma tcp\]`),
		b.opt.blockstore, "serve", "-addr", addr, "-mem", strconv.Itoa(storageExportSize>>20)+"M")
	if err != nil {
		run.skipped = "the server did not start: " + err.Error()
		return
	}
	defer func() {
		if out := srv.stop(); strings.Contains(out, "level=ERROR") {
			run.setup = append(run.setup, "the server logged errors:\n"+out)
		}
	}()
	// Reads of memory never written would read the kernel's zero page;
	// write the export once first, as a disk would have been.
	fill := b.goBench(ctx, goTCP, addr, storageWorkload{rw: "write", bs: 1 << 20, depth: 8}, "-bytes", strconv.Itoa(storageExportSize), "-duration", "0")
	if fill.missing != "" {
		run.skipped = "filling the export failed: " + fill.missing
		return
	}
	target, err := b.startAnchorTarget(ctx)
	if err != nil {
		run.setup = append(run.setup, "the kernel's NVMe-oF target: "+err.Error())
	} else {
		defer func() {
			if err := target.stop(); err != nil {
				run.setup = append(run.setup, "removing the kernel's NVMe-oF target: "+err.Error())
			}
		}()
	}
	made := map[storageClient][][]storageFigure{} // by client, a round's figures of every workload
	for round := 1; round <= b.opt.rounds; round++ {
		for _, c := range storageClients {
			var figs []storageFigure
			switch c {
			case nvmeRDMA, nvmeTCP:
				if target == nil {
					figs = missingFigures("the kernel's NVMe-oF target was not set up")
				} else {
					figs, err = b.anchorClient(ctx, c, round)
				}
			case goRDMA, goTCP:
				for _, w := range storageWorkloads {
					b.logStorage(round, c, w)
					figs = append(figs, b.goBench(ctx, c, addr, w, "-duration", b.opt.storageDuration.String()))
				}
			default:
				figs, err = b.fioClient(ctx, c, addr, round)
			}
			if err != nil {
				run.setup = append(run.setup, fmt.Sprintf("round %d, %s: %v", round, c.label, err))
				err = nil
			}
			made[c] = append(made[c], figs)
		}
		run.rounds = round
	}
	for _, c := range storageClients {
		for i := range storageWorkloads {
			var rounds []storageFigure
			for _, figs := range made[c] {
				rounds = append(rounds, figs[i])
			}
			run.figures[c] = append(run.figures[c], medianFigure(rounds))
		}
	}
}

// logStorage says which figure of the storage section is measured now.
func (b *bench) logStorage(round int, c storageClient, w storageWorkload) {
	fmt.Fprintf(b.log, "labbench: storage, round %d/%d, %s: %s, queue depth %d\n", round, b.opt.rounds, c.label, w.name, w.depth)
}

// missingFigures is a figure for every workload, each missing for why.
func missingFigures(why string) []storageFigure {
	figs := make([]storageFigure, len(storageWorkloads))
	for i := range figs {
		figs[i].missing = why
	}
	return figs
}

// medianFigure combines a figure's rounds: the median of each value over
// the rounds that have one (the lower middle of an even count); missing
// only if every round is, and then for the first round's reason.
func medianFigure(rounds []storageFigure) storageFigure {
	var oks []storageFigure
	for _, f := range rounds {
		if f.missing == "" {
			oks = append(oks, f)
		}
	}
	if len(oks) == 0 {
		if len(rounds) == 0 {
			return storageFigure{missing: "not measured"}
		}
		return rounds[0]
	}
	med := func(v func(storageFigure) float64) float64 {
		vs := make([]float64, len(oks))
		for i, f := range oks {
			vs[i] = v(f)
		}
		return lowerMedian(vs)
	}
	f := storageFigure{how: oks[0].how, missed: len(rounds) - len(oks)}
	f.mbps = med(func(f storageFigure) float64 { return f.mbps })
	f.mean = med(func(f storageFigure) float64 { return f.mean })
	f.p99 = med(func(f storageFigure) float64 { return f.p99 })
	for _, r := range oks {
		f.roundsMBps = append(f.roundsMBps, r.mbps)
	}
	return f
}

// anchorClient connects the kernel's initiator over c's transport and runs
// fio on the namespace for every workload.
func (b *bench) anchorClient(ctx context.Context, c storageClient, round int) ([]storageFigure, error) {
	dev, disconnect, err := b.connectAnchor(ctx, c)
	if err != nil {
		return missingFigures(err.Error()), err
	}
	defer disconnect()
	var figs []storageFigure
	for _, w := range storageWorkloads {
		b.logStorage(round, c, w)
		figs = append(figs, b.fio(ctx, dev, w))
	}
	return figs, nil
}

// goBench runs `blockstore bench -json` for w over c's transport.
func (b *bench) goBench(ctx context.Context, c storageClient, addr string, w storageWorkload, extra ...string) storageFigure {
	args := append([]string{b.opt.blockstore, "bench", "-addr", addr, "-local", b.env.AddrA.String(), "-policy", c.transport,
		"-rw", w.rw, "-bs", strconv.Itoa(w.bs), "-qd", strconv.Itoa(w.depth), "-json"}, extra...)
	f := storageFigure{how: "`" + strings.Join(append([]string{"blockstore"}, args[1:]...), " ") + "`"}
	mctx, cancel := context.WithTimeout(ctx, b.opt.timeout)
	defer cancel()
	cmd := exec.CommandContext(mctx, args[0], args[1:]...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		f.missing, f.raw = fmt.Sprintf("blockstore bench: %v", err), string(out)+stderr.String()
		return f
	}
	var r struct {
		Transport      string  `json:"transport"`
		BytesPerSecond float64 `json:"bytes_per_second"`
		LatencyNS      struct {
			Mean, P99 float64
		} `json:"latency_ns"`
		Error string `json:"error"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		f.missing, f.raw = "its output does not parse: "+err.Error(), string(out)+stderr.String()
		return f
	}
	if r.Transport != c.transport {
		f.missing = fmt.Sprintf("it ran over %s, not %s", r.Transport, c.transport)
		return f
	}
	f.mbps, f.mean, f.p99 = r.BytesPerSecond/1e6, r.LatencyNS.Mean/1e3, r.LatencyNS.P99/1e3
	return f
}

// fioClient connects /dev/nbdN as c says (through a bridge, or straight to
// the server) and runs fio on it for every workload. A failure to set up
// leaves every figure missing.
func (b *bench) fioClient(ctx context.Context, c storageClient, addr string, round int) ([]storageFigure, error) {
	figs := make([]storageFigure, len(storageWorkloads))
	fail := func(err error) ([]storageFigure, error) {
		for i := range figs {
			if figs[i].missing == "" && figs[i].mbps == 0 {
				figs[i].missing = err.Error()
			}
		}
		return figs, err
	}
	dev, err := freeNBD()
	if err != nil {
		return fail(err)
	}
	connect := []string{"nbd-client", strings.Split(addr, ":")[0], strings.Split(addr, ":")[1], dev}
	if c != directTCP {
		dir, err := os.MkdirTemp("", "labbench-bridge")
		if err != nil {
			return fail(err)
		}
		defer os.RemoveAll(dir)
		sock := filepath.Join(dir, "nbd.sock")
		bridge, err := startProcess(ctx, "bridge", regexp.MustCompile(`relaying unix`),
			b.opt.blockstore, "bridge", "-listen", "unix:"+sock, "-to", addr, "-local", b.env.AddrA.String(), "-policy", c.transport)
		if err != nil {
			return fail(fmt.Errorf("the bridge did not start: %w", err))
		}
		defer bridge.stop()
		connect = []string{"nbd-client", "-unix", sock, dev}
	}
	connect = append(connect, "-block-size", "4096", "-timeout", "60")
	if out, err := exec.CommandContext(ctx, connect[0], connect[1:]...).CombinedOutput(); err != nil {
		return fail(fmt.Errorf("%s: %v: %s", strings.Join(connect, " "), err, bytes.TrimSpace(out)))
	}
	defer exec.Command("nbd-client", "-d", dev).Run()
	for i, w := range storageWorkloads {
		b.logStorage(round, c, w)
		figs[i] = b.fio(ctx, dev, w)
	}
	return figs, nil
}

// fio runs one fio job on dev for -storage-duration.
func (b *bench) fio(ctx context.Context, dev string, w storageWorkload) storageFigure {
	args := []string{"fio", "--name=" + w.rw, "--filename=" + dev, "--ioengine=libaio", "--direct=1",
		"--rw=" + w.rw, "--bs=" + strconv.Itoa(w.bs), "--iodepth=" + strconv.Itoa(w.depth),
		"--size=" + strconv.Itoa(storageExportSize), "--time_based", "--runtime=" + strconv.Itoa(int(b.opt.storageDuration.Seconds())) + "s",
		"--lat_percentiles=1", "--output-format=json"}
	f := storageFigure{how: "`" + strings.Join(args, " ") + "`"}
	mctx, cancel := context.WithTimeout(ctx, b.opt.timeout)
	defer cancel()
	out, err := exec.CommandContext(mctx, args[0], args[1:]...).CombinedOutput()
	if err != nil {
		f.missing, f.raw = fmt.Sprintf("fio: %v", err), string(out)
		return f
	}
	mbps, mean, p99, err := parseFio(string(out), w.rw)
	if err != nil {
		f.missing, f.raw = "fio's output does not parse: "+err.Error(), string(out)
		return f
	}
	f.mbps, f.mean, f.p99 = mbps, mean, p99
	return f
}

// parseFio reads the one job of fio's JSON report: the throughput in MB/s
// and the mean and 99th percentile of the whole latency (submission to
// completion, --lat_percentiles) in µs, of reads or writes as rw says.
func parseFio(out, rw string) (mbps, mean, p99 float64, err error) {
	if i := strings.IndexByte(out, '{'); i > 0 { // notes before the JSON
		out = out[i:]
	}
	type dir struct {
		BW    float64 `json:"bw_bytes"`
		IOs   int64   `json:"total_ios"`
		LatNS struct {
			Mean       float64            `json:"mean"`
			Percentile map[string]float64 `json:"percentile"`
		} `json:"lat_ns"`
	}
	var rep struct {
		Jobs []struct {
			Error int `json:"error"`
			Read  dir `json:"read"`
			Write dir `json:"write"`
		} `json:"jobs"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		return 0, 0, 0, err
	}
	if len(rep.Jobs) != 1 {
		return 0, 0, 0, fmt.Errorf("%d jobs in the report, want 1", len(rep.Jobs))
	}
	j := rep.Jobs[0]
	d := j.Read
	if strings.Contains(rw, "write") {
		d = j.Write
	}
	p, ok := d.LatNS.Percentile["99.000000"]
	switch {
	case j.Error != 0:
		return 0, 0, 0, fmt.Errorf("the job failed with error %d", j.Error)
	case d.IOs == 0:
		return 0, 0, 0, errors.New("no I/O done")
	case !ok:
		return 0, 0, 0, errors.New("no 99th percentile of the latency")
	}
	return d.BW / 1e6, d.LatNS.Mean / 1e3, p / 1e3, nil
}

// freeNBD returns the first /dev/nbdN not connected.
func freeNBD() (string, error) {
	for n := 0; ; n++ {
		name := "nbd" + strconv.Itoa(n)
		if _, err := os.Stat("/sys/block/" + name); err != nil {
			return "", errors.New("no free /dev/nbdN (is the nbd module loaded?)")
		}
		if _, err := os.Stat("/sys/block/" + name + "/pid"); errors.Is(err, os.ErrNotExist) {
			return "/dev/" + name, nil
		}
	}
}

// process is a command left running (a server, a bridge).
type process struct {
	cmd  *exec.Cmd
	out  *lockedBuffer
	done chan error
}

// startProcess starts argv and waits until its output matches ready.
func startProcess(ctx context.Context, what string, ready *regexp.Regexp, argv ...string) (*process, error) {
	p := &process{cmd: exec.CommandContext(ctx, argv[0], argv[1:]...), out: new(lockedBuffer), done: make(chan error, 1)}
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.Cancel = func() error { return p.cmd.Process.Signal(os.Interrupt) }
	p.cmd.WaitDelay = 10 * time.Second
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { p.done <- p.cmd.Wait() }()
	deadline := time.After(30 * time.Second)
	for !ready.MatchString(p.out.String()) {
		select {
		case err := <-p.done:
			return nil, fmt.Errorf("%s exited: %v: %s", what, err, p.out)
		case <-deadline:
			p.stop()
			return nil, fmt.Errorf("%s not ready after 30 s: %s", what, p.out)
		case <-time.After(20 * time.Millisecond):
		}
	}
	return p, nil
}

// stop interrupts the process, waits for it and returns its output.
func (p *process) stop() string {
	p.cmd.Process.Signal(os.Interrupt)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
	return p.out.String()
}

// lockedBuffer collects a process's output while it runs.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
