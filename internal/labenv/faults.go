package labenv

import (
	"os/exec"
	"testing"
)

// DropAll makes the path drop every packet, netem on both of its netdevs,
// until Heal or the end of t: the "RDMA path dead" fault that leaves rxe
// usable and TCP between the lab's hosts (which goes through lo) alive
// (docs/lab.md). It fails t outside the lab.
func (p Path) DropAll(t testing.TB) {
	t.Helper()
	if !InLab() {
		t.Fatalf("labenv: DropAll outside the lab (%s is not 1)", VarLab)
	}
	for _, dev := range []string{p.NetdevA, p.NetdevB} {
		if out, err := exec.Command("tc", "qdisc", "add", "dev", dev, "root", "netem", "loss", "100%").CombinedOutput(); err != nil {
			t.Fatalf("tc netem on %s: %v\n%s", dev, err, out)
		}
		t.Cleanup(func() { exec.Command("tc", "qdisc", "del", "dev", dev, "root").Run() })
	}
}

// Heal ends DropAll.
func (p Path) Heal(t testing.TB) {
	t.Helper()
	for _, dev := range []string{p.NetdevA, p.NetdevB} {
		if out, err := exec.Command("tc", "qdisc", "del", "dev", dev, "root").CombinedOutput(); err != nil {
			t.Fatalf("healing %s: %v\n%s", dev, err, out)
		}
	}
}
