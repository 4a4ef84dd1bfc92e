# rdmanet's build, tests and lab. `make test` is what CI runs (.ci/run).
SHELL := /bin/bash
GO ?= go
LAB := bin/rdmanet-lab

.PHONY: all deps build vet test host-test nocgo-test no-rdma-core-test lab-test demo selfcheck clean

all: build

deps:
	scripts/install-deps

build:
	$(GO) build ./...

$(LAB): FORCE
	@mkdir -p bin
	$(GO) build -o $@ ./cmd/rdmanet-lab

FORCE:

vet:
	$(GO) vet ./...
	CGO_ENABLED=0 $(GO) vet ./...

# Host tests with the race detector; ABI checks may not skip here (the headers
# are installed by deps).
host-test:
	RDMANET_REQUIRE_RDMA_HEADERS=1 $(GO) test -race -count=1 ./...

# The module must build and pass its host tests without cgo.
nocgo-test:
	CGO_ENABLED=0 $(GO) build ./...
	CGO_ENABLED=0 $(GO) test -count=1 ./...

# The module must build with cgo, and report why RDMA is unavailable, on a host
# with no rdma-core headers or libraries (hidden in a private mount namespace).
no-rdma-core-test:
	scripts/no-rdma-core-test

# RDMA tests inside the lab VM, on Soft-RoCE; fails if any test skips there.
lab-test: $(LAB)
	scripts/lab-test

test: deps vet host-test nocgo-test no-rdma-core-test lab-test

# The demo: for now the lab's self-check (ibv_devices, rping, perftest on rxe).
demo: deps selfcheck

selfcheck: $(LAB)
	$(LAB) -selfcheck

clean:
	rm -rf bin
