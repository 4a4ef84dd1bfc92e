//go:build linux

package lab

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rdmanet/sdk/internal/labenv"
	"golang.org/x/sys/unix"
)

// Defaults for Config's zero values. TMPDIR in the guest is a tmpfs, so the
// memory also bounds what a test can write there.
const (
	DefaultMemoryMiB = 2048
	DefaultCPUs      = 2
)

// Config says what to run in the lab and how.
type Config struct {
	Args       []string      // the command and its arguments
	Kernel     string        // bzImage to boot; empty means the newest /boot/vmlinuz-*
	MemoryMiB  int           // guest memory; 0 means DefaultMemoryMiB
	CPUs       int           // guest CPUs; 0 means DefaultCPUs
	Timeout    time.Duration // kill the VM this long after it may start (another lab VM's run not counted); 0 means no limit
	Verbose    bool          // show QEMU, the kernel console and the set-up steps on Stderr
	ReportBoot bool          // print the boot time on Stderr even if not Verbose
	Stdout     io.Writer
	Stderr     io.Writer
}

// Run boots the lab and runs cfg.Args in it. It returns the command's exit
// status (128+N if a signal N killed it), or an error if the lab could not
// run it or report its status; ExitCode maps such errors to exit statuses.
// Cancelling ctx kills the VM, and Run returns context.Cause(ctx).
func Run(ctx context.Context, cfg Config) (int, error) {
	if len(cfg.Args) == 0 {
		return 0, errors.New("no command to run")
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return 0, fmt.Errorf("no cache directory for the initramfs: %w", err)
	}
	cache = filepath.Join(cache, "rdmanet-lab")
	m, sp, err := prepare(cfg, cache)
	if err != nil {
		return 0, err
	}
	unlock, err := lockVM(ctx, cache, cfg)
	if err != nil {
		return 0, err
	}
	defer unlock()
	// The VM's time starts once it may start: waiting for another lab VM
	// (go test -exec runs packages in parallel, one VM at a time) is not
	// its time.
	if cfg.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, cfg.Timeout, &TimeoutError{After: cfg.Timeout})
		defer cancel()
	}
	for try := 1; ; try++ {
		status, err := bootOnce(ctx, cfg, m, sp)
		var be *BootError
		if !errors.As(err, &be) || try == bootTries {
			return status, err
		}
		// The command never started, so running it again is safe.
		fmt.Fprintf(cfg.Stderr, "lab: %v; booting again\n", err)
	}
}

// bootTimeout bounds a boot, until the guest starts the command: boots
// take 5-20 s, about a minute on a loaded host. One make test's VM spent
// 9 minutes with its CPUs busy and never printed a line.
const bootTimeout = 3 * time.Minute

// bootTries is how many boots Run makes while they time out.
const bootTries = 2

// bootOnce boots the lab in a run directory of its own and runs the
// command there.
func bootOnce(ctx context.Context, cfg Config, m machine, sp spec) (int, error) {
	runDir, err := os.MkdirTemp("", "rdmanet-lab-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(runDir)
	m.runDir = runDir
	if err := writeRunDir(runDir, m.hostTmp, sp); err != nil {
		return 0, err
	}
	b := &boot{cfg: cfg, machine: m, bootTimeout: bootTimeout, started: make(chan struct{})}
	return b.run(ctx)
}

// prepare checks everything the lab needs on the host, before booting, so
// that what is missing is reported with the package that provides it, and
// builds or finds in cache what QEMU boots.
func prepare(cfg Config, cache string) (machine, spec, error) {
	sp, err := commandSpec(cfg)
	if err != nil {
		return machine{}, spec{}, err
	}
	qemuPath, err := toolQEMU.find()
	if err != nil {
		return machine{}, spec{}, err
	}
	modprobe, err := toolModprobe.find()
	if err != nil {
		return machine{}, spec{}, err
	}
	// The guest sets up its network with the host's ip and rdma.
	for _, t := range []tool{toolIP, toolRDMA} {
		if _, err := t.find(); err != nil {
			return machine{}, spec{}, err
		}
	}
	busybox, err := findBusybox()
	if err != nil {
		return machine{}, spec{}, err
	}
	k, err := findKernel(cfg.Kernel)
	if err != nil {
		return machine{}, spec{}, err
	}
	if err := checkModules(modprobe, k); err != nil {
		return machine{}, spec{}, err
	}
	initrd, err := initramfs(k, modprobe, busybox, cache)
	if err != nil {
		return machine{}, spec{}, fmt.Errorf("building the initramfs: %w", err)
	}
	siw, err := siwModule(k, cache, func(msg string) { fmt.Fprintf(cfg.Stderr, "lab: %s\n", msg) })
	if err != nil {
		return machine{}, spec{}, err
	}
	sp.SiwModule = siw
	image, err := pvhKernel(k, cache)
	if err != nil {
		image = k.image
		if cfg.Verbose {
			fmt.Fprintf(cfg.Stderr, "lab: booting the compressed kernel, which is slower: %v\n", err)
		}
	}
	hostTmp, err := filepath.EvalSymlinks(os.TempDir())
	if err != nil {
		return machine{}, spec{}, fmt.Errorf("temporary directory: %w", err)
	}
	m := machine{
		qemu: qemuPath, kernel: image, initrd: initrd,
		memoryMiB: cmp.Or(cfg.MemoryMiB, DefaultMemoryMiB), cpus: cmp.Or(cfg.CPUs, DefaultCPUs),
		verbose: cfg.Verbose, hostTmp: hostTmp,
	}
	return m, sp, nil
}

// lockVM waits until no other lab VM of this user runs, and returns the
// function that lets the next one start. One VM at a time: TCG keeps every
// host core it is given busy, and two VMs sharing cores make each other's
// timing-sensitive RDMA tests flaky ("go test -exec" runs packages in
// parallel).
func lockVM(ctx context.Context, cache string, cfg Config) (func(), error) {
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(cache, "vm.lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	for waited := false; ; waited = true {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("locking %s: %w", f.Name(), err)
		}
		if !waited && cfg.Verbose {
			fmt.Fprintln(cfg.Stderr, "lab: waiting for another lab VM to finish")
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, context.Cause(ctx)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// commandSpec resolves the command on the host, so that a typo fails before
// a boot, and gives it the host's environment and working directory plus the
// lab's variables.
func commandSpec(cfg Config) (spec, error) {
	name := cfg.Args[0]
	p, err := exec.LookPath(name)
	if err != nil {
		return spec{}, &CommandError{Name: name, Err: err}
	}
	if p, err = filepath.Abs(p); err != nil {
		return spec{}, &CommandError{Name: name, Err: err}
	}
	dir, err := os.Getwd()
	if err != nil {
		return spec{}, err
	}
	return spec{
		Path:    p,
		Args:    cfg.Args,
		Env:     guestEnviron(os.Environ()),
		Dir:     dir,
		Verbose: cfg.Verbose,
	}, nil
}

// guestEnviron returns host with the lab's variables and TMPDIR replacing
// any the host had.
func guestEnviron(host []string) []string {
	add := append(labenv.Default.Environ(), "TMPDIR="+guestTmpDir)
	replaced := map[string]bool{}
	for _, kv := range add {
		k, _, _ := strings.Cut(kv, "=")
		replaced[k] = true
	}
	var env []string
	for _, kv := range host {
		if k, _, _ := strings.Cut(kv, "="); !replaced[k] {
			env = append(env, kv)
		}
	}
	return append(env, add...)
}

// writeRunDir writes what /init and the guest stage read from the run
// directory.
func writeRunDir(dir, hostTmp string, sp spec) error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding the lab binary: %w", err)
	}
	js, err := json.Marshal(sp)
	if err != nil {
		return err
	}
	for name, data := range map[string][]byte{
		specName:   js,
		exeName:    []byte(exe),
		tmpdirName: []byte(hostTmp),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// boot is one run of QEMU.
type boot struct {
	cfg     Config
	machine machine
	start   time.Time

	stdout, stderr stream      // the command's output
	console        *tailBuffer // the end of the console, unless verbose

	// bootTimeout bounds the time until the guest starts the command
	// (msgStart, which closes started once).
	bootTimeout time.Duration
	started     chan struct{}
	startOnce   sync.Once

	mu        sync.Mutex
	status    int
	hasStatus bool
}

func (b *boot) run(ctx context.Context) (int, error) {
	m := b.machine
	var (
		qemuErr  = newTailBuffer(8 << 10)
		handlers sync.WaitGroup
	)
	b.start = time.Now()
	b.stdout.w, b.stderr.w = b.cfg.Stdout, b.cfg.Stderr
	consoleOut := io.Writer(b.cfg.Stderr)
	var qemuStderr io.Writer = qemuErr
	if b.cfg.Verbose {
		qemuStderr = io.MultiWriter(qemuErr, b.cfg.Stderr)
	} else {
		b.console = newTailBuffer(16 << 10)
		consoleOut = b.console
	}

	// Listen before QEMU starts: it connects its character devices at
	// start-up and fails if nobody listens.
	var listeners []net.Listener
	defer func() {
		for _, l := range listeners {
			l.Close()
		}
	}()
	for _, s := range []struct {
		name   string
		handle func(net.Conn)
	}{
		{sockets.console, func(c net.Conn) { io.Copy(consoleOut, c) }},
		{sockets.stdout, b.stdout.copyFrom},
		{sockets.stderr, b.stderr.copyFrom},
		{sockets.ctl, b.control},
	} {
		l, err := net.Listen("unix", filepath.Join(m.runDir, s.name))
		if err != nil {
			return 0, err
		}
		listeners = append(listeners, l)
		handlers.Add(1)
		go func() {
			defer handlers.Done()
			c, err := l.Accept()
			l.Close() // QEMU connects once
			if err != nil {
				return
			}
			defer c.Close()
			s.handle(c)
		}()
	}

	cmd := exec.Command(m.qemu, m.args()...)
	cmd.Stdout, cmd.Stderr = qemuStderr, qemuStderr
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// Its own process group, so a terminal's Ctrl-C reaches only
		// rdmanet-lab, which then kills QEMU; and if rdmanet-lab dies
		// without cleaning up, the kernel kills QEMU.
		Setpgid:   true,
		Pdeathsig: syscall.SIGKILL,
	}
	if b.cfg.Verbose {
		fmt.Fprintf(b.cfg.Stderr, "lab: %s %s\n", m.qemu, strings.Join(m.args(), " "))
	}
	if err := cmd.Start(); err != nil {
		return 0, &QEMUError{Err: err}
	}
	waitc := make(chan error, 1)
	go func() { waitc <- cmd.Wait() }()

	var waitErr error
	bootLimit := time.NewTimer(b.bootTimeout)
	defer bootLimit.Stop()
	started := b.started
	for done := false; !done; {
		select {
		case waitErr = <-waitc:
			done = true
		case <-ctx.Done():
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-waitc
			return 0, context.Cause(ctx)
		case <-started:
			bootLimit.Stop()
			started = nil // the command runs: only ctx bounds it now
		case <-bootLimit.C:
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-waitc
			be := &BootError{After: b.bootTimeout}
			if b.console != nil {
				be.Console = b.console.String()
			}
			return 0, be
		}
	}

	// QEMU is gone, so its sockets are closed and the copies end; closing
	// the listeners ends the accepts that never got a connection.
	for _, l := range listeners {
		l.Close()
	}
	if !waitTimeout(&handlers, outputDrainTimeout) {
		fmt.Fprintln(b.cfg.Stderr, "lab: warning: output still being copied after QEMU exited")
	}
	b.mu.Lock()
	status, ok := b.status, b.hasStatus
	b.mu.Unlock()
	if ok {
		return status, nil
	}
	if waitErr != nil {
		return 0, &QEMUError{Err: waitErr, Stderr: qemuErr.String()}
	}
	nse := &NoStatusError{}
	if b.console != nil {
		nse.Console = b.console.String()
	}
	return 0, nse
}

// control serves the guest's control port; see msgStart and msgExit.
func (b *boot) control(c net.Conn) {
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		switch {
		case f[0] == msgStart:
			b.startOnce.Do(func() { close(b.started) })
			if b.cfg.Verbose || b.cfg.ReportBoot {
				fmt.Fprintf(b.cfg.Stderr, "lab: booted in %.1fs\n", time.Since(b.start).Seconds())
			}
		case f[0] == msgExit && len(f) == 4:
			var status int
			var nout, nerr int64
			if _, err := fmt.Sscan(strings.Join(f[1:], " "), &status, &nout, &nerr); err != nil {
				fmt.Fprintf(b.cfg.Stderr, "lab: bad control message %q\n", sc.Text())
				continue
			}
			b.mu.Lock()
			b.status, b.hasStatus = status, true
			b.mu.Unlock()
			b.awaitOutput(nout, nerr)
			fmt.Fprintln(c, msgAck)
		default:
			fmt.Fprintf(b.cfg.Stderr, "lab: bad control message %q\n", sc.Text())
		}
	}
}

// awaitOutput waits until the host has received nout bytes of stdout and
// nerr of stderr, the counts the guest sent: the guest powers off once
// acknowledged, and some of its output may still sit in QEMU's buffers. It
// gives up when no byte has arrived for outputDrainTimeout.
func (b *boot) awaitOutput(nout, nerr int64) {
	missing := func() int64 { return nout - b.stdout.n.Load() + nerr - b.stderr.n.Load() }
	last, progress := missing(), time.Now()
	for last > 0 && time.Since(progress) < outputDrainTimeout {
		time.Sleep(5 * time.Millisecond)
		if m := missing(); m < last {
			last, progress = m, time.Now()
		}
	}
	if last > 0 {
		fmt.Fprintf(b.cfg.Stderr, "lab: warning: %d bytes of the command's output did not arrive\n", last)
	}
}

// stream copies one of the command's output streams from its socket to w,
// counting the bytes received.
type stream struct {
	w io.Writer
	n atomic.Int64
}

func (s *stream) copyFrom(c net.Conn) {
	buf := make([]byte, 64<<10)
	var werr error
	for {
		n, err := c.Read(buf)
		if n > 0 {
			// After a write error, go on reading: a guest whose output
			// nobody reads would block and never report its status.
			if werr == nil {
				_, werr = s.w.Write(buf[:n])
			}
			s.n.Add(int64(n))
		}
		if err != nil {
			return
		}
	}
}

// tailBuffer keeps the last bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func newTailBuffer(max int) *tailBuffer { return &tailBuffer{max: max} }

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}

// waitTimeout waits for wg for at most d and reports whether it finished.
func waitTimeout(wg *sync.WaitGroup, d time.Duration) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}
