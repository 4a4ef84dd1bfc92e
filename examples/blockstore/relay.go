package main

import (
	"errors"
	"io"
	"net"
)

// relay copies bytes both ways between two connections until both
// directions have ended, then closes both. When one side finishes sending
// (io.EOF), the other is told so with a half-close (CloseWrite) where it
// has one, and the other direction goes on: a client that sends
// NBD_CMD_DISC and stops writing still gets the replies in flight. When a
// direction fails, both connections close, which ends the other.
func relay(a, b net.Conn) error {
	errs := make(chan error, 2)
	pipe := func(dst, src net.Conn) {
		_, err := io.Copy(dst, src)
		if err == nil {
			if cw, ok := dst.(interface{ CloseWrite() error }); ok {
				err = cw.CloseWrite()
			} else {
				err = dst.Close()
			}
		}
		if err != nil {
			a.Close()
			b.Close()
		}
		errs <- err
	}
	go pipe(a, b)
	go pipe(b, a)
	err1, err2 := <-errs, <-errs
	a.Close()
	b.Close()
	// A direction that failed closed both connections, and so made the
	// other fail with net.ErrClosed: the first error says why.
	for _, err := range []error{err1, err2} {
		if err != nil && !errors.Is(err, net.ErrClosed) {
			return err
		}
	}
	return nil
}
