package lossless

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/rdmanet/sdk/internal/cabi"
	"github.com/rdmanet/sdk/internal/nlmsg"
)

func TestConstantsMatchHeaders(t *testing.T) {
	want := map[string]int64{
		"DCB_CMD_PFC_GCFG": dcbCmdPFCGCfg, "DCB_CMD_IEEE_GET": dcbCmdIEEEGet,
		"DCB_ATTR_IFNAME": dcbAttrIfname, "DCB_ATTR_PFC_CFG": dcbAttrPFCCfg, "DCB_ATTR_IEEE": dcbAttrIEEE,
		"DCB_ATTR_IEEE_PFC": dcbAttrIEEEPFC, "DCB_ATTR_IEEE_APP_TABLE": dcbAttrIEEEAppTab,
		"DCB_ATTR_IEEE_APP": dcbAttrIEEEApp, "DCB_PFC_UP_ATTR_0": dcbPFCUpAttr0,
		"DCB_PFC_UP_ATTR_ALL": dcbPFCUpAttrAll, "IEEE_8021QAZ_APP_SEL_DSCP": appSelDSCP,
		"sizeof(struct ieee_pfc)":                  sizeofIEEEPFC,
		"offsetof(struct ieee_pfc, requests)":      ieeePFCRequestsOff,
		"offsetof(struct ieee_pfc, indications)":   ieeePFCIndOff,
		"offsetof(struct ieee_pfc, pfc_en)":        1,
		"sizeof(struct dcb_app)":                   sizeofDCBApp,
		"offsetof(struct dcb_app, selector)":       0,
		"ETHTOOL_GSSET_INFO":                       ethtoolGSSetInfo,
		"ETHTOOL_GSTRINGS":                         ethtoolGStrings,
		"ETHTOOL_GSTATS":                           ethtoolGStats,
		"ETH_SS_STATS":                             ethSSStats,
		"ETH_GSTRING_LEN":                          ethGStringLen,
		"SIOCETHTOOL":                              unix.SIOCETHTOOL,
		"offsetof(struct ethtool_sset_info, data)": 16,
		"offsetof(struct ethtool_gstrings, data)":  12,
		"offsetof(struct ethtool_stats, data)":     8,
	}
	cabi.CheckConstants(t, want)
}

func TestParseIEEE(t *testing.T) {
	pfc := make([]byte, sizeofIEEEPFC)
	pfc[1] = 1<<3 | 1<<5
	binary.NativeEndian.PutUint64(pfc[ieeePFCRequestsOff+3*8:], 42)
	binary.NativeEndian.PutUint64(pfc[ieeePFCIndOff+5*8:], 7)
	app := nlmsg.Attr(dcbAttrIEEEApp, []byte{appSelDSCP, 3, 26, 0})
	nest := append(nlmsg.Attr(dcbAttrIEEEPFC, pfc), nlmsg.Attr(dcbAttrIEEEAppTab, app)...)
	b := append(nlmsg.Attr(dcbAttrIfname, []byte("eth0\x00")), nlmsg.Attr(dcbAttrIEEE, nest)...)
	d := parseIEEE(b)
	if !d.hasPFC || d.pfc.Enabled != 1<<3|1<<5 || d.pfc.Source != "ieee" || d.pfc.Requests[3] != 42 || d.pfc.Indications[5] != 7 {
		t.Errorf("PFC = %+v", d.pfc)
	}
	if got := d.pfc.Priorities(); len(got) != 2 || got[0] != 3 || got[1] != 5 {
		t.Errorf("Priorities = %v", got)
	}
	if !d.hasApps || len(d.selectors) != 1 || d.selectors[0] != appSelDSCP {
		t.Errorf("APP table: %v %v", d.hasApps, d.selectors)
	}
	// A PFC attribute shorter than struct ieee_pfc is not PFC.
	short := append(nlmsg.Attr(dcbAttrIfname, []byte("eth0\x00")), nlmsg.Attr(dcbAttrIEEE, nlmsg.Attr(dcbAttrIEEEPFC, pfc[:20]))...)
	if d := parseIEEE(short); d.hasPFC {
		t.Error("a truncated ieee_pfc was read")
	}
	for i := range b {
		parseIEEE(b[:i])
	}
}

func TestParseCEEPFC(t *testing.T) {
	var nest []byte
	for p := range Priorities {
		v := byte(0)
		if p == 4 {
			v = 1
		}
		nest = append(nest, nlmsg.Attr(uint16(dcbPFCUpAttr0+p), []byte{v})...)
	}
	got, err := parseCEEPFC(nlmsg.Attr(dcbAttrPFCCfg, nest))
	if err != nil || got.Enabled != 1<<4 || got.Source != "cee" {
		t.Errorf("parseCEEPFC = %+v, %v", got, err)
	}
	if _, err := parseCEEPFC(nlmsg.Attr(dcbAttrPFCCfg, nest[:16])); err == nil {
		t.Error("an answer with two priorities was taken for all eight")
	}
	if _, err := parseCEEPFC(nil); err == nil {
		t.Error("an empty answer was taken for PFC off")
	}
}

func writeTree(t *testing.T, files map[string]string) string {
	root := t.TempDir()
	for p, v := range files {
		p = filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestReadECN(t *testing.T) {
	files := map[string]string{}
	for p := range Priorities {
		on := "0\n"
		if p == 3 {
			on = "1\n"
		}
		files["eth0/ecn/roce_rp/enable/"+string(rune('0'+p))] = on
		files["eth0/ecn/roce_np/enable/"+string(rune('0'+p))] = on
	}
	root := writeTree(t, files)
	if e := readECN(root, "eth0"); e.Err != nil || e.RP != 1<<3 || e.NP != 1<<3 {
		t.Errorf("readECN = %+v", e)
	}
	if e := readECN(root, "veth0"); e.Err == nil || !strings.Contains(e.Err.Error(), "no ECN settings") {
		t.Errorf("a netdev without an ecn tree: %+v", e)
	}
}

func TestReadTrust(t *testing.T) {
	root := writeTree(t, map[string]string{"eth0/qos/trust": "dscp\n", "eth1/qos/trust": "bogus\n"})
	if tr := readTrust(root, "eth0", ieeeDCB{}, unix.EOPNOTSUPP); tr.Mode != TrustDSCP || tr.Source != "sysfs" {
		t.Errorf("sysfs dscp: %+v", tr)
	}
	if tr := readTrust(root, "eth1", ieeeDCB{}, nil); tr.Err == nil {
		t.Errorf("an unknown sysfs mode was accepted: %+v", tr)
	}
	if tr := readTrust(root, "eth2", ieeeDCB{hasApps: true, selectors: []uint8{1}}, nil); tr.Mode != TrustPCP {
		t.Errorf("an APP table without DSCP: %+v", tr)
	}
	if tr := readTrust(root, "eth2", ieeeDCB{hasApps: true, selectors: []uint8{appSelDSCP}}, nil); tr.Mode != TrustDSCP {
		t.Errorf("an APP table with DSCP: %+v", tr)
	}
	if tr := readTrust(root, "eth2", ieeeDCB{}, nil); tr.Err == nil {
		t.Errorf("no APP table was taken for a mode: %+v", tr)
	}
	if tr := readTrust(root, "eth2", ieeeDCB{}, unix.EOPNOTSUPP); !errors.Is(tr.Err, unix.EOPNOTSUPP) {
		t.Errorf("no DCB: %+v", tr)
	}
}

// TestReadLoopback reads the real kernel: lo has no DCB support and no
// driver statistics, which must come out as errors and "cannot tell".
func TestReadLoopback(t *testing.T) {
	c := Read("lo")
	if !errors.Is(c.PFC.Err, unix.EOPNOTSUPP) {
		t.Errorf("PFC on lo: %+v, want EOPNOTSUPP", c.PFC)
	}
	for _, f := range Assess(RoCE, c) {
		if f.Check != "trust" && f.Status != CannotTell {
			t.Errorf("lo: %+v, want cannot tell", f)
		}
	}
	if c := Read("no-such-netdev0"); c.PFC.Err == nil || c.Counters.Err == nil {
		t.Errorf("a netdev that does not exist: %+v", c)
	}
}
