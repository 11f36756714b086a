#!/usr/bin/env bash
# manycore-lease.sh: all that one lease of a many-core machine is asked for, in one call
# of under ten minutes: a device machine of this project is lent for 15 minutes, starts
# included, and runs a command for at most 10.
#
# Run from the repository root after `make manycore-ab-build BASE=<commit>` (manycore-ab/:
# the harness at BASE and at this tree, gzipped, and mwrpcab); needs nothing else: no Go,
# no network. Server processes on SERVER_CPUS (0-7), the clients on CLIENT_CPUS (8-15), as
# scripts/manycore.sh and scripts/manycore-ab.sh run them. Five parts, each stopped at its
# share of LIMIT (default 540 s):
#
#   ab/       this tree against BASE, alternating (scripts/manycore-ab.sh): AB_PAIRS (2)
#             pairs of AB_SYSTEMS at 64 B and 4 KiB and 16 and 64 callers, shmipc-go the
#             control (mwrpcab -control); ab.md
#   main/     this tree's two-process matrix, every system (scripts/manycore.sh), one round
#   lanes/    one adaptive Client over shm against lanes pinned to 2, 4 and 8, and shmipc-go,
#             at 64 B and 4 KiB and 16 and 64 callers
#   stream/   the streaming cell: mwrpc over soft TCP and shm, default and lent, shmipc-go and
#             a raw TCP copy, one round
#   profiles/ CPU, mutex and block profiles of both processes, one system a run: soft TCP
#             and shm at 64 B and 64 callers, soft TCP at 4 KiB c64 and 64 KiB c16
#             (mwrpcbench -contention); `go tool pprof` reads them here
#
# Everything ends in one file, $OUT/lease.tgz (OUT: the device tool's folder of files to
# bring back, where it sets one; else manycore-lease/), for a tool that brings back a few
# files per call. Environment: OUT, LIMIT, SERVER_CPUS,
# CLIENT_CPUS, AB_PAIRS, AB_SYSTEMS, DURATION (1s a run of a cell; shorter for a dry run
# on a small machine).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/pinned.sh"

DIR=manycore-ab
OUT=${OUT:-manycore-lease}
LIMIT=${LIMIT:-540}
SERVER_CPUS=${SERVER_CPUS:-0-7}
CLIENT_CPUS=${CLIENT_CPUS:-8-15}
AB_PAIRS=${AB_PAIRS:-2}
AB_SYSTEMS=${AB_SYSTEMS:-mwrpc-tcp,mwrpc-shm,shmipc,drpc}
DURATION=${DURATION:-1s}
export SERVER_CPUS CLIENT_CPUS DURATION

die() { echo "manycore-lease: $*" >&2; exit 1; }

[ -e "$DIR/new.gz" ] && [ -e "$DIR/BUILD.new" ] ||
	die "$DIR/ is missing: run 'make manycore-ab-build BASE=<commit>' first (from the repository root)"
[ "$LIMIT" -ge 100 ] || die "LIMIT=$LIMIT: want at least 100 seconds"

# The parts write into $W, which ends packed as $OUT/lease.tgz: $OUT may be a device tool's
# folder of files to bring back, so only what this script made there is removed.
W=$OUT/lease
rm -rf "$W" "$OUT/lease.tgz"
mkdir -p "$W"
started=$SECONDS
# share PERCENT: that part of LIMIT, in seconds
share() { echo $((LIMIT * $1 / 100)); }

# The new build, where scripts/manycore.sh looks for a harness and its BUILD line.
new=$(mktemp -d)
trap 'rm -rf "$new"' EXIT
gunzip -c "$DIR/new.gz" >"$new/mwrpcbench"
chmod +x "$new/mwrpcbench"
cp "$DIR/BUILD.new" "$new/BUILD"
source_line=$(head -n 1 "$DIR/BUILD.new")

# part NAME COMMAND...: runs one part, noting its exit and time; a part that fails or
# runs out of time leaves what it wrote, and the next part runs.
part() {
	local name=$1 t0=$SECONDS rc=0
	shift
	echo "manycore-lease: $name: starting at ${t0}s"
	"$@" >"$W/$name.log" 2>&1 || rc=$?
	echo "$name: exit $rc after $((SECONDS - t0))s" | tee -a "$W/parts.txt"
}

part ab env OUT="$W/ab" PAIRS="$AB_PAIRS" SYSTEMS="$AB_SYSTEMS" CONTROL=shmipc \
	PAYLOADS=64,4KiB CONCURRENCY=16,64 LIMIT="$(share 25)" scripts/manycore-ab.sh
part main env BIN="$new/mwrpcbench" OUT="$W/main" ROUNDS=1 LIMIT="$(share 45)" scripts/manycore.sh
part lanes env BIN="$new/mwrpcbench" OUT="$W/lanes" ROUNDS=1 LIMIT="$(share 8)" \
	SYSTEMS=mwrpc-shm,mwrpc-shm-lanes2,mwrpc-shm-lanes4,mwrpc-shm-lanes8,shmipc \
	PAYLOADS=64,4KiB CONCURRENCY=16,64 scripts/manycore.sh

# run DIR SECONDS FLAGS...: the new harness, pinned as the scripts run it, into $W/DIR.
run() {
	local dir=$1 secs=$2
	shift 2
	mkdir -p "$W/$dir"
	MWRPCBENCH_SOURCE="$source_line" run_pinned "$secs" "$new/mwrpcbench" -out "$W/$dir" "$@" >"$W/$dir/stdout.md"
}
part stream run stream "$(share 8)" -cells stream -rounds 1 \
	-systems mwrpc-tcp,mwrpc-lent,mwrpc-shm,mwrpc-shm-lent,shmipc,rawtcp
# profile NAME SYSTEM PAYLOAD CALLERS: CPU, mutex and block profiles of both processes in
# one cell, one system a run so that the client's profile is that system's alone.
profile() {
	run "profiles/$1" "$(share 3)" -cells echo -systems "$2" -payloads "$3" -concurrency "$4" \
		-rounds 1 -duration "$DURATION" -contention \
		-cpuprofile "$W/profiles/$1/client.pprof" -server-cpuprofile "$W/profiles/$1/srv"
}
profiles() {
	profile tcp-64B-c64 mwrpc-tcp 64 64
	profile shm-64B-c64 mwrpc-shm 64 64
	profile tcp-4KiB-c64 mwrpc-tcp 4KiB 64
	profile tcp-64KiB-c16 mwrpc-tcp 64KiB 16
}
part profiles profiles

echo "all: $((SECONDS - started))s; $source_line" | tee -a "$W/parts.txt"
tar czf "$OUT/lease.tgz" -C "$W" . && rm -rf "$W"
echo "manycore-lease: done: $OUT/lease.tgz"
