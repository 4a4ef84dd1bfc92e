module github.com/rdmanet/sdk

go 1.24.0

require (
	github.com/Mellanox/rdmamap v1.1.0
	github.com/google/go-cmp v0.7.0
	golang.org/x/net v0.47.0
	golang.org/x/sys v0.41.0
)

require (
	github.com/vishvananda/netlink v1.1.0 // indirect
	github.com/vishvananda/netns v0.0.0-20191106174202-0a2b9b5464df // indirect
)
