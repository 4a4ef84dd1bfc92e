package verbs

import "github.com/Mellanox/rdmamap"

func rdmaDeviceForNetdev(netdev string) (string, error) {
	return rdmamap.GetRdmaDeviceForNetdevice(netdev)
}
