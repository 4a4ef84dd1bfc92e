package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rdmanet/sdk/internal/lossless"
	"github.com/rdmanet/sdk/verbs"
)

func TestPortProtocol(t *testing.T) {
	root := t.TempDir()
	write := func(p, v string) {
		p = filepath.Join(root, p)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("rxe0/node_type", "1: CA\n")
	write("rxe0/ports/1/link_layer", "Ethernet\n")
	write("mlx5_1/node_type", "1: CA\n")
	write("mlx5_1/ports/1/link_layer", "InfiniBand\n")
	write("siw0/node_type", "4: RNIC\n")
	write("siw0/ports/1/link_layer", "Ethernet\n")
	old := losslessSysfs
	losslessSysfs = root
	defer func() { losslessSysfs = old }()
	for dev, want := range map[string]string{"rxe0": lossless.RoCE, "mlx5_1": lossless.InfiniBand, "siw0": lossless.IWARP} {
		if got := portProtocol(dev, 1); got != want {
			t.Errorf("%s: %s, want %s", dev, got, want)
		}
	}
	if got := portProtocol("gone0", 1); !strings.HasPrefix(got, "unknown") {
		t.Errorf("a device without sysfs: %s", got)
	}

	// iWARP and InfiniBand need no PFC, and the output says so; a RoCE
	// port without a netdev cannot be checked.
	ls := checkLossless([]verbs.Link{{Device: "siw0", Port: 1, Netdev: "eth0"}, {Device: "mlx5_1", Port: 1}, {Device: "rxe0", Port: 1}})
	var b bytes.Buffer
	printLossless(&b, ls)
	out := b.String()
	if strings.Count(out, "PFC is not needed") != 2 || !strings.Contains(out, "cannot tell") || !strings.Contains(out, "names no netdev") {
		t.Errorf("printLossless:\n%s", out)
	}
}
