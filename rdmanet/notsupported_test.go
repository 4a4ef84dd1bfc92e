package rdmanet

import (
	"testing"

	"github.com/rdmanet/sdk/verbs"
)

// TestNotSupportedIsOneError: a build without RDMA reports one sentinel,
// whichever package the caller matches it with.
func TestNotSupportedIsOneError(t *testing.T) {
	if ErrNotSupported != verbs.ErrNotSupported {
		t.Fatal("rdmanet.ErrNotSupported is not verbs.ErrNotSupported")
	}
}
