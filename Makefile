# mwrpc build and test entry points.
#
#   make test          everything CI runs (.ci/run calls exactly this)
#   make cross         go build and go vet for macOS, Windows, FreeBSD and Linux on arm64 (a step of make test)
#   make fuzz          every native Fuzz target for FUZZTIME each (default 60s)
#   make bench-verbs   verbs and pool micro-benchmarks, 5 runs each (for benchstat)
#   make test-faults   the fault suite (netem, kill) in the rxe VM: soft TCP (adaptive lanes,
#                      then three with lent memory) and ibv
#   make soak          three long runs (soft TCP on adaptive and on 4 lanes, shm on 4):
#                      1,000,000 calls each, callers killed, leaks checked
#   make test-rxe      the ibv provider (cgo, libibverbs) on Soft-RoCE in a throw-away VM:
#                      conformance suite, the transport's, rpc's and the KV example's tests
#                      and gRPC-Go's interop cases over mwnet over it, latency against
#                      perftest (root and Debian; the last step
#                      of `make test`, which skips it elsewhere with a SKIPPED line, and
#                      fails instead with CI=true)
#   make bench-rxe     the harness inside the rxe VM: mwrpc over ibv (rxe0) against
#                      mwrpc-tcp and raw TCP in the same VM, two processes each, and
#                      perftest's latency on rxe0; writes benchmarks/results/rxe/ (not part
#                      of `make test`)
#   make clean         remove the project-local tools in .bin/
#
# The recipes need only Go (and, for -race, a C compiler: cgo). Go is taken from PATH,
# then from /usr/local/go/bin. With CI=true a step that cannot run fails instead of being
# skipped; without it, a skipped step says so in a SKIPPED line.

SHELL       := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.NOTPARALLEL:
.DEFAULT_GOAL := test

export PATH := $(PATH):/usr/local/go/bin
GO ?= go
BIN := $(CURDIR)/.bin

# Pinned tools. staticcheck v0.8.2 (2026.2.2) is the newest release on the module proxy
# (`go list -m -versions honnef.co/go/tools`); it requires Go 1.26.
STATICCHECK_VERSION := v0.8.2
STATICCHECK         := $(BIN)/staticcheck

# Packages tested with the race detector: the concurrent ones. Patterns whose directory does
# not exist yet are dropped, so the list can name packages that are still being written.
RACE_DIRS     := transport pool codec rpc mwnet examples internal/parcopy internal/idle
RACE_PATTERNS := $(strip $(foreach d,$(RACE_DIRS),$(if $(wildcard $(d)/.),./$(d)/...)))
TEST_TIMEOUT  := 15m

# fuzz-smoke counts executions rather than seconds: with a wall-clock -fuzztime, Go 1.26's
# fuzz coordinator can fail a target with a bare "context deadline exceeded" at the deadline
# (golang/go#75804, fixed in Go 1.27); a count never races a deadline. 500000 runs take 5 to
# 15 s per target on a 2-core machine.
FUZZ_SMOKE_TIME ?= 500000x
FUZZTIME        ?= 60s

BENCH_DIRS     := transport/verbs pool
BENCH_PATTERNS := $(strip $(foreach d,$(BENCH_DIRS),$(if $(wildcard $(d)/.),./$(d)/...)))

# The steps of `make test`, in order. A step that cannot run on this machine (test-rxe: not
# root, not Debian) reports a skip with $(call skip,...), which CI=true turns into a failure.
TEST_STEPS := fmt vet cross staticcheck generate-check test-race test-norace test-hostile test-benchmarks test-otlp test-grpc test-readme fuzz-smoke test-scripts test-rxe test-faults

# $(call header,title) prints a step header, with the time of day so that CI logs show
# how long each step took.
header = printf '\n==> %s  [%s]\n' "$(1)" "$$(date +%T)"
# $(call skip,step,reason): fail in CI (CI set to anything but "", 0 or false), otherwise
# print a SKIPPED line.
skip = case "$${CI:-}" in ""|0|false) echo "SKIPPED: $(1): $(2)";; \
       *) echo "FAIL: $(1) cannot run in CI: $(2)" >&2; exit 1;; esac

.PHONY: test $(TEST_STEPS) fuzz bench-verbs test-rxe tools clean

test: $(TEST_STEPS)
	@printf '\n==> make test: all steps passed (%s)  [%s]\n' "$(TEST_STEPS)" "$$(date +%T)"

fmt:
	@$(call header,fmt: gofmt -l)
	@files=$$(find . -type d \( -name .git -o -name .bin -o -name testdata -o -name vendor \) -prune \
	        -o -type f -name '*.go' -print | sort); \
	 [ -n "$$files" ] || { echo "no Go files"; exit 0; }; \
	 bad=$$(gofmt -l $$files); \
	 if [ -n "$$bad" ]; then echo "gofmt would change these files (run gofmt -w):"; echo "$$bad"; exit 1; fi; \
	 echo "ok: $$(echo "$$files" | grep -c .) files formatted"

vet:
	@$(call header,vet: go vet ./...)
	$(GO) vet ./...

# cross builds and vets (test files included) the library, the benchmarks module and the
# examples that are modules of their own (examples/*/go.mod) for every OS the soft
# provider runs on besides Linux, and for Linux on arm64: `go vet` type-checks
# each package with its tests for the target, `go build` compiles it (and links the
# commands, into /dev/null: no binary is left in the tree). Any error fails the
# step. The ibv provider is Linux's (build tag ibverbs, cgo) and is not built here.
CROSS_TARGETS ?= darwin/amd64 darwin/arm64 windows/amd64 freebsd/amd64 linux/arm64
CROSS_MODULES := . benchmarks $(patsubst %/go.mod,%,$(sort $(wildcard examples/*/go.mod)))

cross:
	@$(call header,cross: go build and go vet for $(CROSS_TARGETS))
	@for t in $(CROSS_TARGETS); do \
	   for m in $(CROSS_MODULES); do \
	     echo "$$t: $$m"; \
	     (cd $$m && GOOS=$${t%/*} GOARCH=$${t#*/} CGO_ENABLED=0 $(GO) build -o /dev/null ./... && \
	      GOOS=$${t%/*} GOARCH=$${t#*/} CGO_ENABLED=0 $(GO) vet ./...) || { echo "FAIL: cross: $$t: $$m" >&2; exit 1; }; \
	   done; \
	 done; \
	 echo "ok: $(CROSS_TARGETS) build and vet"

# Generated stubs must be what the generator writes today.
generate-check:
	@$(call header,generate-check: go generate ./... leaves no diff)
	$(GO) generate ./...
	@changed=$$(git status --porcelain -- '*_mwrpc.go' ':!benchmarks'); \
	 if [ -n "$$changed" ]; then echo "generated files are stale (run go generate ./... and commit):"; echo "$$changed"; git diff -- '*_mwrpc.go' ':!benchmarks' | head -40; exit 1; fi; \
	 echo "ok: generated files up to date"

# Installs the pinned staticcheck when .bin/staticcheck is missing or another version.
define install-staticcheck
	@if ! "$(STATICCHECK)" -version 2>/dev/null | grep -qF '($(STATICCHECK_VERSION:v%=%))'; then \
	   echo "installing staticcheck $(STATICCHECK_VERSION) into $(BIN)"; \
	   GOBIN="$(BIN)" $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION); \
	 fi
endef

tools:
	$(install-staticcheck)

staticcheck:
	@$(call header,staticcheck $(STATICCHECK_VERSION))
	$(install-staticcheck)
	$(STATICCHECK) ./...

test-race:
	@$(call header,go test -race: $(RACE_PATTERNS))
	@if [ -z "$(RACE_PATTERNS)" ]; then echo "no race-tested packages exist yet"; exit 0; fi; \
	 if [ "$$($(GO) env CGO_ENABLED)" != 1 ]; then \
	   $(call skip,test-race,the race detector needs cgo and a C compiler (apt-get install -y gcc libc6-dev)); \
	   exit 0; \
	 fi; \
	 $(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) $(RACE_PATTERNS)

# Every package once more without the race detector: the race build switches on debug
# checks (the pool's, for one), so this is what runs in production.
test-norace:
	@$(call header,go test ./... (no race detector))
	$(GO) test -count=1 -timeout $(TEST_TIMEOUT) ./...

# The hostile-peer suite once more, alone on the machine, with its latency bound on: a
# good client's p99 during each attack within 2x of its p99 alone (4x for connection
# floods). Under go test ./... other packages' tests share the cores, so there the suite
# checks everything but that bound (transport/hostile_test.go, docs/security.md).
test-hostile:
	@$(call header,hostile-peer suite with its latency bound)
	@log=$$(mktemp); \
	 if MWRPC_HOSTILE_P99=1 $(GO) test -count=1 -timeout 5m -run '^TestHostilePeers$$' -v ./transport/ >$$log 2>&1; then \
	   grep -E '^(=== RUN|\s*--- |\s+hostile_test|ok|PASS)' $$log; rm -f $$log; \
	 else cat $$log; rm -f $$log; exit 1; fi

# The benchmark harness is a module of its own (so gRPC never enters the library's
# go.mod), which ./... does not reach: vet it and run its small self-test.
test-benchmarks:
	@$(call header,benchmarks module: go vet and go test)
	cd benchmarks && $(GO) vet ./... && $(GO) test -count=1 -timeout $(TEST_TIMEOUT) ./...

# examples/otlp is a module of its own too (the OTLP exporters require gRPC's modules): its
# test exports over OTLP/HTTP to a receiver inside the test.
test-otlp:
	@$(call header,examples/otlp module: go vet, staticcheck and go test)
	cd examples/otlp && $(GO) vet ./... && $(STATICCHECK) ./... && $(GO) test -count=1 -timeout $(TEST_TIMEOUT) ./...

# examples/grpc is a module of its own (gRPC stays out of the library's go.mod): gRPC-Go's
# own interop cases over mwnet, on the soft TCP fabric and on shm.
test-grpc:
	@$(call header,examples/grpc module: vet + staticcheck + gRPC interop cases over mwnet)
	$(install-staticcheck)
	@race=; if [ "$$($(GO) env CGO_ENABLED)" = 1 ]; then race=-race; else echo "no cgo: interop cases without the race detector"; fi; \
	 cd examples/grpc && $(GO) vet ./... && $(STATICCHECK) ./... && $(GO) test $$race -count=1 -timeout 5m ./...

# test-readme follows the README's "Your own service in a new module" in a new module in
# a temporary directory (go get -tool, go generate, the client started before the server):
# behind the build tag readme because it runs the go command and downloads the new module's
# dependencies through the module proxy.
test-readme:
	@$(call header,test-readme: the README's new-module recipe as two processes)
	$(GO) vet -tags readme ./examples/readme/ && $(GO) test -tags readme -count=1 -timeout $(TEST_TIMEOUT) ./examples/readme/

# fuzz-smoke and fuzz find every `func FuzzX(` in the module's test files and run each
# target on its own (go test -fuzz takes one target per invocation).
define run-fuzz
	@pkgs=$$($(GO) list -f '{{.ImportPath}} {{.Dir}} {{join .TestGoFiles " "}} {{join .XTestGoFiles " "}}' ./...); \
	 found=0; \
	 while read -r pkg dir files; do \
	   [ -n "$$files" ] || continue; \
	   for fn in $$(cd "$$dir" && { grep -ho '^func Fuzz[A-Za-z0-9_]*' $$files || true; } | sed 's/^func //' | sort -u); do \
	     found=$$((found+1)); \
	     echo "--- $$fn ($$pkg, $(1))"; \
	     $(GO) test -run '^$$' -fuzz "^$$fn\$$" -fuzztime $(1) "$$pkg"; \
	   done; \
	 done <<<"$$pkgs"; \
	 echo "ran $$found fuzz target(s)"
endef

fuzz-smoke:
	@$(call header,fuzz-smoke: every Fuzz target for -fuzztime $(FUZZ_SMOKE_TIME))
	$(call run-fuzz,$(FUZZ_SMOKE_TIME))

fuzz:
	@$(call header,fuzz: every Fuzz target for -fuzztime $(FUZZTIME))
	$(call run-fuzz,$(FUZZTIME))

bench-verbs:
	@$(call header,bench-verbs: $(BENCH_PATTERNS))
	$(GO) test -run '^$$' -bench . -benchmem -count 5 $(BENCH_PATTERNS)

# test-rxe builds the ibv provider's tests (build tag ibverbs) and runs them against the
# kernel's Soft-RoCE (rdma_rxe) inside a throw-away qemu VM (scripts/rxe-vm/), then compares
# its 64 B READ and SEND latency with perftest's in the same VM. It installs the Debian
# packages it needs when they are missing; it needs root (apt-get; qemu reads /boot).
RXE_PACKAGES := qemu-system-x86 linux-image-amd64 busybox-static rdma-core ibverbs-providers \
                ibverbs-utils libibverbs-dev perftest gcc libc6-dev
RXE_TESTBIN  := /var/tmp/mwrpc-ibv.test
RXE_TESTDIR  := /var/tmp/mwrpc-ibv
# The transport's end-to-end tests that range over the fabrics, only their ibv subtests
# (the soft fabrics are tested by `make test`).
RXE_RUN_TRANSPORT := ^(TestIBVFabric|TestEchoSizes|TestConcurrentCalls|TestRevocation|TestDeadPeer|TestLeaseReclaim|TestBootstrapLiveness|TestReleasesWaitForReposts|TestSharedReceives|TestStreamEcho|TestStreamFlowControl|TestStreamEnds|TestStreamBlockedSender|TestStreamAcksRide)$$/^ibv$$

# $(call rxe-prereqs,step): skip (or fail in CI) unless root on Debian, then install the
# VM's packages when missing. The rest of the recipe line follows it.
define rxe-prereqs
	if [ "$$(id -u)" -ne 0 ]; then \
	   $(call skip,$(1),needs root (apt-get; qemu reads /boot)); exit 0; \
	 fi; \
	 if ! command -v apt-get >/dev/null || ! command -v dpkg-query >/dev/null; then \
	   $(call skip,$(1),needs Debian (apt-get installs qemu and the kernel with rdma_rxe)); exit 0; \
	 fi; \
	 missing=$$(for p in $(RXE_PACKAGES); do \
	   [ "$$(dpkg-query -W -f='$${Status}' "$$p" 2>/dev/null)" = "install ok installed" ] || echo "$$p"; done); \
	 if [ -n "$$missing" ]; then \
	   echo "installing" $$missing; \
	   export DEBIAN_FRONTEND=noninteractive; apt-get update; apt-get install -y $$missing; \
	 fi
endef

test-rxe:
	@$(call header,test-rxe: the ibv provider on Soft-RoCE in a VM)
	@$(call rxe-prereqs,test-rxe); \
	 $(GO) vet -tags ibverbs ./transport/... ./rpc/... ./examples/kv/...; \
	 $(GO) test -c -tags ibverbs -o $(RXE_TESTBIN) ./transport/verbs/ibv/; \
	 $(GO) test -c -tags ibverbs -o $(RXE_TESTDIR)-transport.test ./transport/; \
	 $(GO) test -c -tags ibverbs -o $(RXE_TESTDIR)-rpc.test ./rpc/; \
	 $(GO) test -c -tags ibverbs -o $(RXE_TESTDIR)-kv.test ./examples/kv/; \
	 (cd examples/grpc && $(GO) vet -tags ibverbs ./... && $(GO) test -c -tags ibverbs -o $(RXE_TESTDIR)-grpc.test .); \
	 SUITE_RUN_transport='$(RXE_RUN_TRANSPORT)' SUITE_RUN_rpc='^TestIBV$$' SUITE_RUN_kv='^TestRunBothIBV$$' \
	   SUITE_RUN_grpc='^TestInteropIBV$$' \
	   scripts/rxe-vm/test-rxe.sh $(RXE_TESTBIN) transport=$(RXE_TESTDIR)-transport.test \
	     rpc=$(RXE_TESTDIR)-rpc.test kv=$(RXE_TESTDIR)-kv.test grpc=$(RXE_TESTDIR)-grpc.test

# test-scripts checks the VM scripts without a VM: from a copy of scripts/ under /tmp (where
# the guest mounts an empty tmpfs), run-in-vm.sh's dry run hands the guest only files it can
# see, so test-rxe, test-faults and bench-rxe work from a checkout anywhere. A second.
test-scripts:
	@$(call header,test-scripts: the VM steps from a checkout under /tmp)
	scripts/rxe-vm/paths-test.sh

# test-faults runs the fault suite (benchmarks/cmd/mwrpcload faults) inside the rxe VM,
# whose kernel has netem (this machine's has not): a veth pair, 10% loss, 200±50 ms delay,
# reordering, a 10 s partition, SIGKILL of the server and of a client, for soft TCP and ibv
# over rxe; it prints a table per fabric and fails on a hung call, a response to the wrong
# call, a window or buffer left behind, or a slow recovery. The VM has no network device to
# the outside (-nic none): every address is on the veth pair. About 5 minutes.
FAULTS_BIN := /var/tmp/mwrpcload-ibv

test-faults:
	@$(call header,test-faults: loss; delay; reordering; partition and kill -9 in the rxe VM)
	@$(call rxe-prereqs,test-faults); \
	 (cd benchmarks && $(GO) build -tags ibverbs -o $(FAULTS_BIN) ./cmd/mwrpcload); \
	 RXE_VM_TIMEOUT=1500 scripts/rxe-vm/run-in-vm.sh scripts/faults/guest-faults.sh $(FAULTS_BIN) \
	   2> >(grep -v -e ' WARN mwrpc: connection' -e ' WARN mwrpc: connection setup failed' >&2)

# soak: three soaks of 1,000,000 calls of mixed sizes from 8 caller processes, one
# SIGKILLed and replaced every 3 s: over soft TCP on loopback with each caller's Client on
# its adaptive lanes, then on four pinned lanes, then over the shm fabric on four lanes.
# Each samples the server's RSS, goroutines, connections, descriptors and memfd mappings
# each second and checks at the end that no window stays bound, no pooled buffer is held,
# no descriptor or mapping of a dead caller's is left and RSS is within 10% of where it was
# after warm-up. Writes benchmarks/results/soak/{tcp,tcp-lanes4,shm-lanes4}/ (JSON, CSV,
# soak.png). Not part of `make test`; each bounded by -max-time (15 min).
SOAK_BIN := /var/tmp/mwrpcload-soak
.PHONY: soak
soak:
	@$(call header,soak: benchmarks/cmd/mwrpcload soak over soft TCP and shm)
	cd benchmarks && $(GO) build -o $(SOAK_BIN) ./cmd/mwrpcload
	cd benchmarks && $(SOAK_BIN) soak -out results/soak/tcp
	cd benchmarks && $(SOAK_BIN) soak -lanes 4 -out results/soak/tcp-lanes4
	cd benchmarks && $(SOAK_BIN) soak -fabric shm -lanes 4 -out results/soak/shm-lanes4

clean:
	rm -rf "$(BIN)"

# bench-quick and bench run the side-by-side harness (benchmarks/, its own module: gRPC-Go
# and gonum/plot never enter the library's go.mod) against gRPC-Go, net/rpc and a raw TCP
# ping-pong. Both run in two-process mode, the default: each system's server in a process
# of its own, started and stopped by the harness (allocs/op and CPU/op are then the
# client's); add BENCHFLAGS='-mode inproc' for client and server in one process.
# bench-quick: 64 B, 64 KiB and 1 MiB at concurrency 1 and 16, and the streaming cell at
# 256 MiB each way, into benchmarks/results/quick/ (about a minute). bench: the full matrix
# (64 B to 16 MiB x concurrency 1, 4, 16, 64) and the streaming cell at 1 GiB each way (a
# server stream and a client stream in 1 MiB messages: raw TCP, gRPC-Go, mwrpc) into
# benchmarks/results/ (a few minutes), which docs/performance.md shows. BENCHFLAGS='-cells
# stream' runs the streaming cell alone. Not part of `make test` (test-benchmarks runs the
# harness's self-test, tiny two-process runs of both).
.PHONY: bench-quick bench timeline

BENCHFLAGS ?=

bench-quick:
	@$(call header,bench-quick: benchmarks/cmd/mwrpcbench -quick (two-process unless BENCHFLAGS says -mode inproc))
	cd benchmarks && $(GO) run ./cmd/mwrpcbench -quick $(BENCHFLAGS)

bench:
	@$(call header,bench: benchmarks/cmd/mwrpcbench (full matrix; two-process unless BENCHFLAGS says -mode inproc))
	cd benchmarks && $(GO) run ./cmd/mwrpcbench $(BENCHFLAGS)

# manycore-build: what a many-core machine without network needs to run the two-process
# matrix (scripts/manycore.sh): the harness built here as one static binary
# (CGO_ENABLED=0, stripped) into manycore/, a folder git ignores (.git/info/exclude: it is
# never committed, and worktrees share the exclusion). Copy or carry manycore/ and
# scripts/ (manycore.sh sources pinned.sh) to the machine and run, from the repository root,
# scripts/manycore.sh: server processes on cores 0-7, the clients on 8-15, every system
# of the echo matrix in one run, JSON, table and charts into $$OUT (default
# manycore/results). Not part of `make test`.
.PHONY: manycore-build
MANYCORE_DIR := manycore

manycore-build:
	@$(call header,manycore-build: static mwrpcbench into $(MANYCORE_DIR)/ for scripts/manycore.sh)
	@mkdir -p $(MANYCORE_DIR)
	@ex="$$(git rev-parse --git-common-dir)/info/exclude"; mkdir -p "$$(dirname "$$ex")"; \
	 grep -qxF '/$(MANYCORE_DIR)/' "$$ex" 2>/dev/null || echo '/$(MANYCORE_DIR)/' >> "$$ex"
	cd benchmarks && CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w' -o ../$(MANYCORE_DIR)/mwrpcbench ./cmd/mwrpcbench
	@{ echo "commit $$(git rev-parse --short=12 HEAD)$$(git diff --quiet HEAD -- . ':(exclude)benchmarks/results' || echo ' with uncommitted changes')"; \
	   echo "built $$(date -u +%Y-%m-%dT%H:%M:%SZ) with $$($(GO) version)"; } > $(MANYCORE_DIR)/BUILD
	@du -sh $(MANYCORE_DIR) | sed 's/^/manycore-build: /'

# manycore-ab-build BASE=<commit>: what scripts/manycore-ab.sh needs on a many-core machine
# to A/B two builds there: the harness built static at BASE (in a temporary worktree) and
# from this tree, their BUILD lines, and cmd/mwrpcab (which links the harness's report
# types, and with them its peers), all gzipped (two stripped harnesses alone are over a
# device call's 64 MiB), into manycore-ab/ (ignored, as manycore/ is). Carry
# manycore-ab/ and run scripts/manycore-ab.sh from the repository root. Not part of
# `make test`.
.PHONY: manycore-ab-build
MANYCORE_AB_DIR := manycore-ab

manycore-ab-build:
	@$(call header,manycore-ab-build: static mwrpcbench at $(BASE) and at this tree into $(MANYCORE_AB_DIR)/ for scripts/manycore-ab.sh)
	@[ -n "$(BASE)" ] || { echo "manycore-ab-build: BASE=<commit> is needed"; exit 1; }
	@git rev-parse --verify --quiet '$(BASE)^{commit}' >/dev/null || { echo "manycore-ab-build: BASE=$(BASE) names no commit"; exit 1; }
	@mkdir -p $(MANYCORE_AB_DIR)
	@ex="$$(git rev-parse --git-common-dir)/info/exclude"; mkdir -p "$$(dirname "$$ex")"; \
	 grep -qxF '/$(MANYCORE_AB_DIR)/' "$$ex" 2>/dev/null || echo '/$(MANYCORE_AB_DIR)/' >> "$$ex"
	@set -e; wt=$$(mktemp -d); trap 'git worktree remove --force "$$wt" >/dev/null 2>&1 || true; rm -rf "$$wt"' EXIT; \
	 git worktree add --detach --quiet "$$wt" '$(BASE)'; \
	 (cd "$$wt/benchmarks" && CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w' -o "$(CURDIR)/$(MANYCORE_AB_DIR)/base" ./cmd/mwrpcbench); \
	 echo "commit $$(git rev-parse --short=12 '$(BASE)')" > $(MANYCORE_AB_DIR)/BUILD.base
	cd benchmarks && CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w' -o ../$(MANYCORE_AB_DIR)/new ./cmd/mwrpcbench
	cd benchmarks && CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w' -o ../$(MANYCORE_AB_DIR)/mwrpcab ./cmd/mwrpcab
	@echo "commit $$(git rev-parse --short=12 HEAD)$$(git diff --quiet HEAD -- . ':(exclude)benchmarks/results' || echo ' with uncommitted changes')" > $(MANYCORE_AB_DIR)/BUILD.new
	gzip -f $(MANYCORE_AB_DIR)/base $(MANYCORE_AB_DIR)/new $(MANYCORE_AB_DIR)/mwrpcab
	@du -sh $(MANYCORE_AB_DIR) | sed 's/^/manycore-ab-build: /'

# bench-rxe: the side-by-side harness inside the rxe VM (scripts/rxe-vm/bench-rxe.sh and
# guest-bench-rxe.sh): mwrpcbench, built here with -tags ibverbs (cgo, libibverbs), runs in
# two-process mode for mwrpc-ibv (server and client processes on rxe0, connections set up
# over the guest's loopback TCP), mwrpc-tcp and rawtcp (the soft fabric and the floor, in
# the same VM) at 64 B, 4 KiB, 64 KiB and 1 MiB, concurrency 1 and 16, 3 rounds of 1 s;
# then perftest's ib_send_lat (64 B, 4 KiB) and ib_read_lat (64 B, 64 KiB, 1 MiB) on rxe0, 3
# runs each. The files come out of the VM on its console; cmd/rxereport joins them into one
# table with ratios to rawtcp and to the perftest floor. Writes benchmarks/results/rxe/
# (latest.json, latest.md and charts: the harness's; perftest.txt; rxe.md and rxe.json: the
# table), which docs/performance.md shows. About 5 minutes; RXE_VM_TIMEOUT (1500 s) bounds
# the VM, RXE_BENCH_* (guest-bench-rxe.sh) change the matrix. Root and Debian, like
# test-rxe; not part of `make test`.
.PHONY: bench-rxe
BENCH_RXE_BIN := /var/tmp/mwrpcbench-ibv

bench-rxe:
	@$(call header,bench-rxe: benchmarks/cmd/mwrpcbench -tags ibverbs in the rxe VM: mwrpc-ibv / mwrpc-tcp / rawtcp and perftest)
	@$(call rxe-prereqs,bench-rxe); \
	 (cd benchmarks && $(GO) vet -tags ibverbs ./internal/bench/ ./cmd/mwrpcbench/ && \
	   $(GO) build -tags ibverbs -o $(BENCH_RXE_BIN) ./cmd/mwrpcbench); \
	 RXE_VM_TIMEOUT=$${RXE_VM_TIMEOUT:-1500} scripts/rxe-vm/bench-rxe.sh $(BENCH_RXE_BIN) $(CURDIR)/benchmarks/results/rxe; \
	 cd benchmarks && $(GO) run ./cmd/rxereport -dir results/rxe

# timeline: one 64 B and one 64 KiB call at concurrency 1, client and server in two
# processes over the soft TCP fabric, step by step (each socket syscall, hand-off, copy
# and wire trip, joined on CLOCK_MONOTONIC), beside a raw TCP ping-pong and mwrpc-tuned;
# built with the probe (build tag mwrpcprobe, internal/probe). About 20 s; writes
# benchmarks/results/timeline/ (timeline.md, .json, .png), which docs/performance.md shows.
timeline:
	@$(call header,timeline: benchmarks/cmd/mwrpctimeline -tags mwrpcprobe)
	cd benchmarks && $(GO) run -tags mwrpcprobe ./cmd/mwrpctimeline $(TIMELINEFLAGS)
