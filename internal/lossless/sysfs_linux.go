package lossless

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// sysfsNet is where netdevs are; tests use a fake tree.
var sysfsNet = "/sys/class/net"

// readTrust tells the trust mode: mlx5's sysfs qos/trust (its out-of-tree
// driver) says it outright; otherwise a readable IEEE APP table with DSCP
// entries means DSCP trust and one without means PCP, as mlnx_qos and `dcb
// app` set it.
func readTrust(root, netdev string, ieee ieeeDCB, ieeeErr error) Trust {
	if b, err := os.ReadFile(filepath.Join(root, netdev, "qos", "trust")); err == nil {
		switch m := strings.TrimSpace(string(b)); m {
		case TrustPCP, TrustDSCP:
			return Trust{Mode: m, Source: "sysfs"}
		default:
			return Trust{Err: fmt.Errorf("qos/trust: unknown mode %q", m)}
		}
	}
	if ieeeErr != nil {
		return Trust{Err: ieeeErr}
	}
	if !ieee.hasApps {
		return Trust{Err: errors.New("the driver's DCB answer has no APP table")}
	}
	for _, s := range ieee.selectors {
		if s == appSelDSCP {
			return Trust{Mode: TrustDSCP, Source: "dcb-app"}
		}
	}
	return Trust{Mode: TrustPCP, Source: "dcb-app"}
}

// readECN reads mlx5's sysfs ecn tree: ecn/roce_rp/enable/<prio> and
// ecn/roce_np/enable/<prio>, "1" when on. Other drivers have no such tree,
// and then ECN cannot be told.
func readECN(root, netdev string) ECN {
	var e ECN
	for _, side := range []struct {
		dir  string
		bits *uint8
	}{{"roce_rp", &e.RP}, {"roce_np", &e.NP}} {
		for p := range Priorities {
			path := filepath.Join(root, netdev, "ecn", side.dir, "enable", strconv.Itoa(p))
			b, err := os.ReadFile(path)
			if err != nil {
				if errors.Is(err, os.ErrNotExist) {
					err = fmt.Errorf("the driver exposes no ECN settings (no %s)", filepath.Join(root, netdev, "ecn"))
				}
				return ECN{Err: err}
			}
			if strings.TrimSpace(string(b)) == "1" {
				*side.bits |= 1 << p
			}
		}
	}
	return e
}
