module github.com/rdmanet/sdk

go 1.24.0

require (
	github.com/google/go-cmp v0.7.0
	golang.org/x/net v0.47.0
	golang.org/x/sys v0.41.0
)
