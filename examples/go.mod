module github.com/rdmanet/sdk/examples

go 1.24.0

require (
	github.com/google/go-cmp v0.7.0
	github.com/rdmanet/sdk v0.0.0-00010101000000-000000000000
	github.com/redis/go-redis/v9 v9.22.0
	golang.org/x/sys v0.41.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	go.uber.org/atomic v1.11.0 // indirect
)

replace github.com/rdmanet/sdk => ../
