# rdmanet's build, tests and lab. `make test` is what CI runs (.ci/run).
SHELL := /bin/bash
GO ?= go
LAB := bin/rdmanet-lab

# The modules: the SDK, examples/, a module of its own so that what only
# the examples need (go-redis) is not a requirement of programs that import
# rdmanet, and metrics/prometheus, likewise so that the Prometheus client
# library is not. `./...` stops at a nested module's go.mod, so every target that
# covers the tree runs in each module's directory.
MODULES := . examples metrics/prometheus
# $(call in-modules,COMMAND): COMMAND in each module's directory, stopping at
# the first failure.
in-modules = set -e; for m in $(MODULES); do echo "[$$m] $(1)"; (cd $$m && $(1)); done

.PHONY: all deps build vet test host-test nocgo-test no-rdma-core-test lab-test demo selfcheck clean

all: build

deps:
	scripts/install-deps

build:
	@$(call in-modules,$(GO) build ./...)

$(LAB): FORCE
	@mkdir -p bin
	$(GO) build -o $@ ./cmd/rdmanet-lab

FORCE:

vet:
	@$(call in-modules,$(GO) vet ./...)
	@$(call in-modules,CGO_ENABLED=0 $(GO) vet ./...)
	@$(call in-modules,for os in $(CROSS_OS); do GOOS=$$os GOARCH=amd64 CGO_ENABLED=0 $(GO) vet ./... || exit 1; done)

# Programs that import rdmanet must build where Go builds: vet (which
# type-checks every package and its tests) for other systems too. RDMA
# itself is Linux's; elsewhere the package falls back to TCP.
CROSS_OS := darwin windows freebsd

# Host tests with the race detector; ABI checks may not skip here (the headers
# are installed by deps).
host-test:
	@$(call in-modules,RDMANET_REQUIRE_RDMA_HEADERS=1 RDMANET_REQUIRE_TOOLS=1 $(GO) test -race -count=1 ./...)

# The modules must build and pass their host tests without cgo. -short:
# the long stress runs (and building the lab's siw module) ran in
# host-test already, with -race; what differs here is the build. Of
# rdmanet's, those that meet a host without RDMA (dials and listeners that
# fall back, and say why; scripts/rdmanet-without-rdma.run) and the
# Examples: the rest is its engine over in-memory links, the same code with
# cgo or without (only internal/rdmacore differs), 58 s of this target.
nocgo-test:
	@$(call in-modules,CGO_ENABLED=0 $(GO) build ./...)
	@$(call in-modules,$(GO) list ./... | grep -vx 'github.com/rdmanet/sdk/rdmanet' | CGO_ENABLED=0 xargs $(GO) test -short -count=1)
	CGO_ENABLED=0 $(GO) test -short -count=1 -run "$$(cat scripts/rdmanet-without-rdma.run)" ./rdmanet

# The module must build with cgo, and report why RDMA is unavailable, on a host
# with no rdma-core headers or libraries (hidden in a private mount namespace).
no-rdma-core-test:
	scripts/no-rdma-core-test

# RDMA tests inside the lab VM, on Soft-RoCE; fails if any test skips there.
lab-test: $(LAB)
	scripts/lab-test

test: deps vet host-test nocgo-test no-rdma-core-test lab-test

# The benchmark comparison, BENCHMARKS.md: one run in the lab of rdmanet, Go's
# TCP, rsockets, kernel TCP and perftest on the same rxe pair, and of rdmanet
# and perftest -R on the siw pair (about a minute more per round, 3 rounds;
# labbench's -budget allows for it), then a
# resumable session's failover and failback (see internal/cmd/labbench; about
# 20 s per failover cycle, 12 by default), then the connections table (issue
# 23: descriptors, goroutines, pinned and resident memory a connection pair,
# and pairs opened a second, at 100, 1,000 and 2,000 pairs open at once,
# rdmanet beside Go's TCP, and the default Config at 100 and 5,000 pairs,
# which need the VM's 8 GiB, and 100 under an ordinary container's 8 MiB of
# RLIMIT_MEMLOCK; about 4 minutes), then the link groups section (issue 25:
# connections opened a second as streams of a group beside Go's TCP and
# connections of their own, a stream's round trip and throughput, 8 streams
# over two paths and over one, and a group of 100 streams through path 1's
# failure beside the session's; about 40 s a round, 3 rounds, and the
# failover about 25 s, measured with -only groups,failover), then
# examples/blockstore's storage table beside the kernel's NVMe-oF over RDMA
# and TCP on the same rxe pair (issue 26's anchor: 7 columns, 6 workloads,
# 3 s a figure, 3 interleaved rounds; about 8 minutes).
# Every rdmanet row outside the link groups section is a connection with a
# queue pair of its own (Config.NoLinkGroups; groups are rdmanet's default).
# Not part of `make test`. The report replaces
# BENCHMARKS.md only if the run completed and the report ends with labbench's
# end marker.
LABBENCH := bin/labbench
.PHONY: bench

$(LABBENCH): FORCE
	@mkdir -p bin
	$(GO) build -o $@ ./internal/cmd/labbench

# The storage section's server, bridge and Go client: built from the
# examples module, which the SDK's module does not depend on.
BLOCKSTORE := bin/blockstore
$(BLOCKSTORE): FORCE
	@mkdir -p bin
	cd examples && $(GO) build -o ../$@ ./blockstore

bench: $(LAB) $(LABBENCH) $(BLOCKSTORE)
	@start=$$(date +%s); tmp=bin/BENCHMARKS.md.tmp; \
	rev=$$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown); \
	git diff --quiet HEAD 2>/dev/null || rev="$$rev with uncommitted changes"; \
	host="$$(nproc) CPUs, load average $$(cut -d' ' -f1-3 /proc/loadavg) as the run started"; \
	if ! $(GO) test -run '^$$' -bench Host -benchmem -count 5 ./rdmanet/ > bin/hostbench.txt; then \
		echo "bench: the host benchmarks failed; BENCHMARKS.md unchanged (bin/hostbench.txt)" >&2; exit 1; fi; \
	if ! $(LAB) -m 8192 -timeout 35m $(LABBENCH) -budget 14m -rev "$$rev" -host "$$host" -blockstore $(CURDIR)/$(BLOCKSTORE) > $$tmp; then \
		echo "bench: the run failed; BENCHMARKS.md unchanged (output so far: $$tmp)" >&2; exit 1; fi; \
	if [ "$$(tail -n 1 $$tmp)" != '<!-- labbench: end of report -->' ]; then \
		echo "bench: the report is incomplete; BENCHMARKS.md unchanged (output: $$tmp)" >&2; exit 1; fi; \
	{ head -n -1 $$tmp; echo; echo "## The engine's own cost, on the host"; echo; \
	  echo "rdmanet's connection over the in-memory link (internal/link.Pipe: no device, no kernel), beside Go's TCP over loopback, in the same run before the lab's (\`go test -run '^\$$' -bench Host -benchmem -count 5 ./rdmanet/\`, medians of 5):"; echo; \
	  $(GO) run ./internal/cmd/benchtable < bin/hostbench.txt; echo; tail -n 1 $$tmp; } > $$tmp.host && mv $$tmp.host $$tmp; \
	mv $$tmp BENCHMARKS.md; cat BENCHMARKS.md; \
	echo "bench: wrote BENCHMARKS.md in $$(( $$(date +%s) - start ))s"

# The demo: for now the lab's self-check (ibv_devices, rping, perftest on rxe).
# The main demo: the lab's self-check (rxe devices, rping, perftest), then
# the examples over RDMA in the lab and over TCP fallback on this host.
demo: deps selfcheck
	scripts/demo

selfcheck: $(LAB)
	$(LAB) -selfcheck

clean:
	rm -rf bin
