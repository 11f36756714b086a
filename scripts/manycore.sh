#!/usr/bin/env bash
# manycore.sh: the two-process matrix on a many-core machine, as two hosts would see it.
#
# Run from the repository root after `make manycore-build` (which leaves manycore/ with a
# static mwrpcbench and BUILD, the commit it was built from); needs nothing else: no Go,
# no network. Server processes run on SERVER_CPUS (default 0-7), the harness and its
# clients on CLIENT_CPUS (default 8-15), GOMAXPROCS the count of each (mwrpcbench -cpus,
# inside taskset). Every system of the echo matrix runs in the same run (what
# `mwrpcbench -list-systems` prints, less the mwrpc-tcp variants that only tune it
# (mwrpc-pollers, -pool, -inline, -tuned, -tls: mwrpc-tcp runs with today's defaults) and
# gRPC-Go over mwnet, which a run of its own compares: SYSTEMS=grpc,grpc-mwnet,grpc-mwnet-shm), mwrpc
# as the README writes it: one rpc.Client shared by all callers, lanes adaptive.
#
# Cells: 64 B and 4 KiB at 1, 16 and 64 callers; 64 KiB at 1, 16 (and 64); 1 MiB at 1
# and 16; 16 MiB at 1 (-max-inflight 16MiB). ROUNDS rounds of DURATION each (default 2 of
# 1s), medians reported. About 5 minutes with 9 systems; the script says its estimate
# first and stops the harness at LIMIT seconds (default 400), keeping the progress log.
#
# A system that fails in a cell leaves that cell (-keep-going; latest.md's notes say why),
# so one broken peer does not cost the run.
#
# Writes to $OUT (default manycore/results): latest.json, latest.md (the table), charts,
# run.log (the progress lines: every round's p50 and ops/s), machine.txt, BUILD.
#
# Environment: OUT, SERVER_CPUS, CLIENT_CPUS, DURATION, WARMUP, ROUNDS, LIMIT, SYSTEMS
# (comma-separated, replaces the list), BIN (default manycore/mwrpcbench), PACK (1: leave
# one file, $OUT/results.tgz, in place of the files: a machine reached through a tool that
# brings back a few files per call, as the device machines of this project are, returns
# the whole run).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/pinned.sh"

BIN=${BIN:-manycore/mwrpcbench}
OUT=${OUT:-manycore/results}
SERVER_CPUS=${SERVER_CPUS:-0-7}
CLIENT_CPUS=${CLIENT_CPUS:-8-15}
DURATION=${DURATION:-1s}
WARMUP=${WARMUP:-200ms}
ROUNDS=${ROUNDS:-2}
LIMIT=${LIMIT:-400}
PAYLOADS=${PAYLOADS:-64,4KiB,64KiB,1MiB,16MiB}
CONCURRENCY=${CONCURRENCY:-1,16,64}
MAX_INFLIGHT=${MAX_INFLIGHT:-16MiB}

die() { echo "manycore: $*" >&2; exit 1; }

# pack DIR: DIR's files into DIR/results.tgz, and only that left in DIR.
pack() {
	local tmp
	tmp=$(mktemp)
	tar czf "$tmp" -C "$1" . && find "$1" -mindepth 1 -delete && mv "$tmp" "$1/results.tgz"
	echo "manycore: packed into $1/results.tgz"
}

[ -x "$BIN" ] || die "$BIN is missing: run 'make manycore-build' first (from the repository root)"
command -v taskset >/dev/null || die "taskset (util-linux) is missing"

# highest CPU a list names, for a check against the machine
maxcpu() { tr ',' '\n' <<<"$1" | sed 's/.*-//' | sort -n | tail -1; }
ncpu=$(nproc --all)
for list in "$SERVER_CPUS" "$CLIENT_CPUS"; do
	[ "$(maxcpu "$list")" -lt "$ncpu" ] || die "CPU list $list needs more than the $ncpu CPUs here (set SERVER_CPUS and CLIENT_CPUS)"
done

if [ -z "${SYSTEMS:-}" ]; then
	SYSTEMS=$("$BIN" -list-systems | grep -vxE 'mwrpc-(pollers|pool|inline|tuned|tls)|grpc-mwnet(-shm)?' | paste -sd, -)
fi
[ -n "$SYSTEMS" ] || die "no system to run"

mkdir -p "$OUT"
{
	echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
	echo "host: $(uname -srm)"
	echo "cpus: $ncpu; server $SERVER_CPUS, client $CLIENT_CPUS"
	command -v lscpu >/dev/null && lscpu | grep -E '^(Model name|Socket|Core|Thread|NUMA node)' || true
	echo "systems: $SYSTEMS"
} >"$OUT/machine.txt"
if [ -f "$(dirname "$BIN")/BUILD" ]; then
	cp "$(dirname "$BIN")/BUILD" "$OUT/BUILD"
	# the report's source: the commit the harness was built from, not this directory's git
	export MWRPCBENCH_SOURCE="$(head -n 1 "$(dirname "$BIN")/BUILD")"
fi

# Estimate: cells x systems x (setup and warmup + rounds x duration). Setup is about 0.1 s
# a cell and system on the 16-core machine (2026-11-28: 11 systems, 12 cells, one round of
# 1 s and a warmup of 200 ms took 170 s, 1.29 s each); 0.15 s keeps a margin.
secs() { awk -v d="$1" 'BEGIN { if (d ~ /ms$/) { sub(/ms$/, "", d); print d / 1000 } else { sub(/s$/, "", d); print d } }'; }
cells=$("$BIN" -list-cells -payloads "$PAYLOADS" -concurrency "$CONCURRENCY" -max-inflight "$MAX_INFLIGHT")
nsys=$(tr ',' '\n' <<<"$SYSTEMS" | wc -l)
estimate() {
	awk -v c="$cells" -v s="$nsys" -v r="$ROUNDS" -v d="$(secs "$DURATION")" -v w="$(secs "$WARMUP")" \
		'BEGIN { printf "%d", c * s * (0.15 + w + r * d) }'
}
est=$(estimate)
if [ "$est" -ge "$LIMIT" ] && [ "$ROUNDS" -gt 1 ]; then
	echo "manycore: about ${est}s with $ROUNDS rounds is over ${LIMIT}s: one round" | tee -a "$OUT/machine.txt"
	ROUNDS=1
	est=$(estimate)
fi
echo "manycore: $cells cells x $nsys systems x $ROUNDS rounds of $DURATION: about ${est}s (stopped at ${LIMIT}s)" | tee -a "$OUT/machine.txt"
[ "$est" -lt "$LIMIT" ] || die "the estimate is over LIMIT: lower DURATION, or name fewer SYSTEMS"

set +e
run_pinned "$LIMIT" "$BIN" -systems "$SYSTEMS" \
	-payloads "$PAYLOADS" -concurrency "$CONCURRENCY" -max-inflight "$MAX_INFLIGHT" \
	-duration "$DURATION" -warmup "$WARMUP" -rounds "$ROUNDS" -cells echo -out "$OUT" \
	>"$OUT/stdout.md" 2>"$OUT/run.log"
rc=$?
set -e
tail -n 5 "$OUT/run.log"
in=$OUT # where the files are
if [ "${PACK:-}" = 1 ]; then
	pack "$OUT"
	in="$OUT/results.tgz"
fi
if [ $rc -ne 0 ]; then
	echo "manycore: mwrpcbench exited $rc (124: over ${LIMIT}s); run.log in $in has every round it finished" >&2
	exit $rc
fi
echo "manycore: done: latest.md in $in"
