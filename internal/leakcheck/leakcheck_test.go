package leakcheck

import (
	"fmt"
	"testing"

	"github.com/rdmanet/sdk/verbs"
)

// recorder is a test that keeps its cleanups and errors for the test of
// the check to look at.
type recorder struct {
	testing.TB
	cleanups []func()
	errors   []string
}

func (r *recorder) Helper()                   {}
func (r *recorder) Cleanup(f func())          { r.cleanups = append(r.cleanups, f) }
func (r *recorder) Logf(string, ...any)       {}
func (r *recorder) Errorf(f string, a ...any) { r.errors = append(r.errors, fmt.Sprintf(f, a...)) }

// check runs one test's check and returns its errors.
func check() []string {
	r := &recorder{}
	CheckWithin(r, 0)
	for _, f := range r.cleanups {
		f()
	}
	return r.errors
}

// One leak fails the test that left it, not every test after it; a leak
// beyond it fails again, and nothing left open passes.
func TestALeakFailsOneTest(t *testing.T) {
	if errs := check(); len(errs) != 0 {
		t.Fatalf("nothing open: %q", errs)
	}
	newBuffer := func() *verbs.Buffer {
		b, err := verbs.NewBuffer(4096)
		if err != nil {
			t.Skip(err)
		}
		return b
	}
	first := newBuffer()
	defer first.Close()
	if errs := check(); len(errs) != 1 {
		t.Fatalf("a buffer left open: %q, want one error", errs)
	}
	if errs := check(); len(errs) != 0 {
		t.Fatalf("the same buffer, still open, in the next test: %q, want none", errs)
	}
	second := newBuffer()
	defer second.Close()
	if errs := check(); len(errs) != 1 {
		t.Fatalf("a second buffer left open: %q, want one error", errs)
	}
	first.Close()
	second.Close()
	if errs := check(); len(errs) != 0 {
		t.Fatalf("both closed: %q", errs)
	}
	third := newBuffer()
	defer third.Close()
	if errs := check(); len(errs) != 1 {
		t.Fatalf("a buffer left open after the earlier leaks were freed: %q, want one error", errs)
	}
	third.Close()
	if errs := check(); len(errs) != 0 {
		t.Fatalf("all closed: %q", errs)
	}
}
