package lossless

// Read reads netdev's lossless configuration. It does not fail as a whole:
// each part carries its own error.
func Read(netdev string) Config {
	c := Config{Netdev: netdev}
	ieee, ieeeErr := readIEEE(netdev)
	c.PFC = ieee.pfc
	if ieeeErr != nil || !ieee.hasPFC {
		// The driver has no IEEE DCB interface, or one without PFC: ask
		// the older CEE one, as `dcb pfc show` does not but lldpad does.
		cee, err := readCEEPFC(netdev)
		if err == nil {
			c.PFC = cee
		} else if ieeeErr != nil {
			c.PFC.Err = ieeeErr
		} else {
			c.PFC.Err = err
		}
	}
	c.Trust = readTrust(sysfsNet, netdev, ieee, ieeeErr)
	c.ECN = readECN(sysfsNet, netdev)
	c.Counters = ReadCounters(netdev)
	return c
}
