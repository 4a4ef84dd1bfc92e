package labenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"
)

// clientHang bounds one run of a tool's client in ServerClient: rping's
// three round trips and perftest's short runs take seconds even on a
// loaded host; a client still running after this has hung.
var clientHang = 25 * time.Second

// ServerClient runs an RDMA tool's server (rping -s, ib_write_bw, ...),
// then its client against it, and returns the client's output; an error
// quotes both outputs.
//
// The server needs a moment before it listens, so a client that fails is
// tried again, up to 10 times, while the server runs. A client that neither
// finishes nor fails within 25 s has hung: once, under two busy
// loops, rping's client and server over siw both waited silently until the
// test's 90 s were up. Then both are killed and the pair runs afresh, up to
// 3 times, and logf reports each hang, with what both ends printed.
func ServerClient(ctx context.Context, server, client []string, logf func(format string, args ...any)) (string, error) {
	for round := 1; ; round++ {
		out, err := serverClientOnce(ctx, server, client)
		var hung *hangError
		if !errors.As(err, &hung) || round == 3 || ctx.Err() != nil {
			return out, err
		}
		logf("%v; running the pair again", err)
	}
}

// hangError: the client ran for clientHang.
type hangError struct{ after time.Duration }

func (e *hangError) Error() string {
	return fmt.Sprintf("client hung (still running after %v)", e.after)
}

// serverClientOnce is one run of ServerClient's pair.
func serverClientOnce(ctx context.Context, server, client []string) (string, error) {
	var srvOut bytes.Buffer
	srv := exec.CommandContext(ctx, server[0], server[1:]...)
	srv.Stdout, srv.Stderr = &srvOut, &srvOut
	if err := srv.Start(); err != nil {
		return "", err
	}
	srvDone := make(chan error, 1)
	go func() { srvDone <- srv.Wait() }()

	const attempts = 10
	var (
		cliOut []byte
		cliErr error
		hung   bool
	)
retry:
	for attempt := 1; ; attempt++ {
		cctx, cancel := context.WithTimeout(ctx, clientHang)
		cliOut, cliErr = exec.CommandContext(cctx, client[0], client[1:]...).CombinedOutput()
		hung = cctx.Err() != nil && ctx.Err() == nil
		cancel()
		if cliErr == nil || hung || ctx.Err() != nil || attempt == attempts {
			break
		}
		select {
		case err := <-srvDone: // the server gave up: retrying cannot help
			srvDone <- err
			break retry
		case <-time.After(500 * time.Millisecond):
		}
	}
	if cliErr != nil {
		srv.Process.Kill() // it would wait for a client until the timeout
	}
	srvErr := <-srvDone
	var err error
	switch {
	case ctx.Err() != nil:
		err = ctx.Err()
	case hung:
		err = &hangError{after: clientHang}
	case cliErr != nil:
		err = fmt.Errorf("client: %v", cliErr)
	case srvErr != nil:
		err = fmt.Errorf("server: %v", srvErr)
	}
	if err != nil {
		return "", fmt.Errorf("%w\n$ %s\n%s$ %s\n%s", err,
			strings.Join(client, " "), cliOut, strings.Join(server, " "), srvOut.Bytes())
	}
	return string(cliOut), nil
}
