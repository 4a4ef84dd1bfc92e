//go:build linux

package lab

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Guest runs the guest stage inside the VM, as root in the chroot /init
// made: it builds the lab's network, runs the command described by the spec
// at specPath and reports its exit status to the host. It returns the lab
// binary's own exit status, 0 once the host has the command's; anything it
// cannot report on a port goes to its standard error, the console.
func Guest(specPath string) int {
	g, err := openGuestPorts()
	if err != nil {
		fmt.Fprintf(os.Stderr, "rdmanet-lab guest: %v\n", err)
		return ExitLabError
	}
	status := g.run(specPath)
	if err := g.report(status); err != nil {
		fmt.Fprintf(os.Stderr, "rdmanet-lab guest: reporting exit status %d: %v\n", status, err)
		return ExitLabError
	}
	return 0
}

// guest holds the guest stage's virtio-serial ports.
type guest struct {
	ctl            *os.File
	stdout, stderr *portWriter
	verbose        bool
}

// portWriter writes to a port and counts the bytes written, which the exit
// report tells the host. It is shared by the command's output copier and the
// lab's own messages, hence the lock.
type portWriter struct {
	mu sync.Mutex
	f  *os.File
	n  int64
}

func (p *portWriter) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n, err := p.f.Write(b)
	p.n += int64(n)
	return n, err
}

func (p *portWriter) count() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}

// openGuestPorts opens the ports by name. The kernel registers them shortly
// after virtio_console loads, so it waits for them a little.
func openGuestPorts() (*guest, error) {
	files := map[string]*os.File{portCtl: nil, portStdout: nil, portStderr: nil}
	deadline := time.Now().Add(5 * time.Second)
	for {
		dirs, _ := filepath.Glob("/sys/class/virtio-ports/*")
		for _, d := range dirs {
			name, err := os.ReadFile(filepath.Join(d, "name"))
			if err != nil {
				continue
			}
			n := strings.TrimSpace(string(name))
			if f, ok := files[n]; !ok || f != nil {
				continue
			}
			f, err := os.OpenFile(filepath.Join("/dev", filepath.Base(d)), os.O_RDWR, 0)
			if err != nil {
				return nil, fmt.Errorf("opening port %s: %w", n, err)
			}
			files[n] = f
		}
		var missing []string
		for n, f := range files {
			if f == nil {
				missing = append(missing, n)
			}
		}
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("virtio-serial ports %s not found", strings.Join(missing, ", "))
		}
		time.Sleep(20 * time.Millisecond)
	}
	return &guest{
		ctl:    files[portCtl],
		stdout: &portWriter{f: files[portStdout]},
		stderr: &portWriter{f: files[portStderr]},
	}, nil
}

// logf prints a set-up step on the command's stderr, if verbose, stamped
// with the guest's uptime like the kernel's own messages.
func (g *guest) logf(format string, args ...any) {
	if !g.verbose {
		return
	}
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts)
	fmt.Fprintf(g.stderr, "[%5d.%06d] lab: "+format+"\n", append([]any{ts.Sec, ts.Nsec / 1000}, args...)...)
}

// run sets up the lab and runs the command; it returns the status to report.
func (g *guest) run(specPath string) int {
	var sp spec
	js, err := os.ReadFile(specPath)
	if err == nil {
		err = json.Unmarshal(js, &sp)
	}
	if err != nil {
		fmt.Fprintf(g.stderr, "lab: reading the run spec: %v\n", err)
		return ExitLabError
	}
	g.verbose = sp.Verbose

	ns, err := newNetSetup(sp.SiwModule, g.logf)
	if err == nil {
		err = ns.build()
	}
	if err == nil {
		err = verifyNetwork()
	}
	if err != nil {
		fmt.Fprintf(g.stderr, "lab: setting up the RDMA network: %v\n", err)
		return ExitLabError
	}
	// RDMA registers memory by pinning it: the command may lock any amount.
	inf := unix.Rlimit{Cur: unix.RLIM_INFINITY, Max: unix.RLIM_INFINITY}
	if err := unix.Setrlimit(unix.RLIMIT_MEMLOCK, &inf); err != nil {
		fmt.Fprintf(g.stderr, "lab: raising RLIMIT_MEMLOCK: %v\n", err)
		return ExitLabError
	}
	g.logf("running %s in %s", strings.Join(sp.Args, " "), sp.Dir)
	return g.command(sp)
}

// command runs the command with its output piped to the ports and returns
// its exit status as a shell would.
func (g *guest) command(sp spec) int {
	// Pipes rather than the ports themselves, so that the guest knows how
	// many bytes the command wrote and can wait for the host to receive them.
	outR, outW, err := os.Pipe()
	if err != nil {
		fmt.Fprintf(g.stderr, "lab: %v\n", err)
		return ExitLabError
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		fmt.Fprintf(g.stderr, "lab: %v\n", err)
		return ExitLabError
	}
	var copies sync.WaitGroup
	for _, c := range []struct {
		dst io.Writer
		src *os.File
	}{{g.stdout, outR}, {g.stderr, errR}} {
		copies.Add(1)
		go func() {
			defer copies.Done()
			io.Copy(c.dst, c.src)
		}()
	}

	cmd := &exec.Cmd{
		Path: sp.Path, Args: sp.Args, Env: sp.Env, Dir: sp.Dir,
		Stdout: outW, Stderr: errW,
		// Its own process group, so whatever it leaves behind can be killed
		// and release the pipes.
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true},
	}
	fmt.Fprintln(g.ctl, msgStart)
	status := 0
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(g.stderr, "lab: %v\n", err)
		status = ExitNotExec
		if errors.Is(err, os.ErrNotExist) {
			status = ExitNotFound
		}
	} else {
		cmd.Wait()
		ws := cmd.ProcessState.Sys().(syscall.WaitStatus)
		if ws.Signaled() {
			status = 128 + int(ws.Signal())
		} else {
			status = ws.ExitStatus()
		}
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	outW.Close()
	errW.Close()
	if !waitTimeout(&copies, outputDrainTimeout) {
		// A process outside the group still holds a pipe open; stop reading.
		outR.SetReadDeadline(time.Now())
		errR.SetReadDeadline(time.Now())
		copies.Wait()
	}
	return status
}

// report sends the exit status and output counts on the control port and
// waits for the host's acknowledgement. The host always answers, once it has
// the output or has given up on it; if the host is gone, so is QEMU.
func (g *guest) report(status int) error {
	if _, err := fmt.Fprintf(g.ctl, "%s %d %d %d\n", msgExit, status, g.stdout.count(), g.stderr.count()); err != nil {
		return err
	}
	line, err := bufio.NewReader(g.ctl).ReadString('\n')
	if err == nil && strings.TrimSpace(line) != msgAck {
		err = fmt.Errorf("unexpected reply %q", line)
	}
	return err
}
