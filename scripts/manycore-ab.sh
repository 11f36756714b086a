#!/usr/bin/env bash
# manycore-ab.sh: two harness builds measured in alternating runs (A/B) on a many-core
# machine, as two hosts would see it, and their comparison (cmd/mwrpcab).
#
# Run from the repository root after `make manycore-ab-build BASE=<commit>`, which leaves
# in manycore-ab/ the base build's and this tree's static mwrpcbench, their BUILD lines and
# a static mwrpcab (the binaries gzipped, so that all travel in a device call's 64 MiB);
# needs nothing else: no Go, no network. Server processes run on SERVER_CPUS (default 0-7), the harness
# and its clients on CLIENT_CPUS (default 8-15), GOMAXPROCS the count of each.
#
# PAIRS pairs of echo runs (default 4), the order alternating (base, new; new, base; ...)
# so that drift over the call falls on both builds; one round of DURATION each. Then,
# when STREAM_SYSTEMS names any, the streaming cell once per build (new first). Then
# mwrpcab's tables: $OUT/ab.md (echo) and $OUT/ab-stream.md.
#
# Environment: DIR (manycore-ab), OUT ($DIR/results), PAIRS, SYSTEMS, PAYLOADS,
# CONCURRENCY, MAX_INFLIGHT, DURATION, WARMUP, STREAM_SYSTEMS, STREAM_SIZE (1GiB, each
# way), SERVER_CPUS, CLIENT_CPUS, LIMIT (seconds for the whole script, default 480: each
# run is stopped at its share), CONTROL (a system of SYSTEMS that is the same code in both
# builds, such as shmipc: ab.md then also compares the pairs in which it moved by at most
# 10%, mwrpcab -control), PACK (1: leave one file, $OUT/results.tgz, in place of the
# files, for a tool that brings back a few files per call).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/pinned.sh"

DIR=${DIR:-manycore-ab}
OUT=${OUT:-$DIR/results}
PAIRS=${PAIRS:-4}
SYSTEMS=${SYSTEMS:-mwrpc-tcp,mwrpc-lent,mwrpc-shm,mwrpc-shm-lent,rawtcp}
PAYLOADS=${PAYLOADS:-1MiB,16MiB}
CONCURRENCY=${CONCURRENCY:-1,16}
MAX_INFLIGHT=${MAX_INFLIGHT:-16MiB}
DURATION=${DURATION:-1s}
WARMUP=${WARMUP:-200ms}
STREAM_SYSTEMS=${STREAM_SYSTEMS:-}
STREAM_SIZE=${STREAM_SIZE:-1GiB}
SERVER_CPUS=${SERVER_CPUS:-0-7}
CLIENT_CPUS=${CLIENT_CPUS:-8-15}
LIMIT=${LIMIT:-480}

die() { echo "manycore-ab: $*" >&2; exit 1; }

for f in base.gz new.gz mwrpcab.gz BUILD.base BUILD.new; do
	[ -e "$DIR/$f" ] || die "$DIR/$f is missing: run 'make manycore-ab-build BASE=<commit>' first (from the repository root)"
done
command -v taskset >/dev/null || die "taskset (util-linux) is missing"
[[ "$PAIRS" =~ ^[1-9][0-9]*$ ]] || die "PAIRS=$PAIRS: want a count of pairs"

bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
for b in base new mwrpcab; do
	gunzip -c "$DIR/$b.gz" >"$bin/$b"
	chmod +x "$bin/$b"
done
mkdir -p "$OUT"
cp "$DIR/BUILD.base" "$DIR/BUILD.new" "$OUT/"

runs=$((2 * PAIRS))
[ -n "$STREAM_SYSTEMS" ] && runs=$((runs + 2))
share=$((LIMIT / runs))
[ "$share" -ge 10 ] || die "LIMIT=$LIMIT leaves ${share}s a run: too little"
echo "manycore-ab: $PAIRS pairs of echo runs${STREAM_SYSTEMS:+ and a streaming run a build}, each stopped at ${share}s"

# one BUILD CELLS NAME [FLAGS...]: one run of a build into $OUT/NAME.
one() {
	local b=$1 cells=$2 name=$3
	shift 3
	local rc=0
	MWRPCBENCH_SOURCE="$(head -n 1 "$DIR/BUILD.$b")" run_pinned "$share" "$bin/$b" \
		-cells "$cells" -out "$OUT/$name" "$@" >"$OUT/$name.log" 2>&1 || rc=$?
	echo "manycore-ab: $name: exit $rc"
}

echo_flags=(-systems "$SYSTEMS" -payloads "$PAYLOADS" -concurrency "$CONCURRENCY"
	-max-inflight "$MAX_INFLIGHT" -rounds 1 -duration "$DURATION" -warmup "$WARMUP")
for i in $(seq 1 "$PAIRS"); do
	if [ $((i % 2)) = 1 ]; then order="base new"; else order="new base"; fi
	for b in $order; do
		one "$b" echo "$b-$i" "${echo_flags[@]}"
	done
done
if [ -n "$STREAM_SYSTEMS" ]; then
	for b in new base; do
		one "$b" stream "stream-$b-1" -systems "$STREAM_SYSTEMS" -stream-size "$STREAM_SIZE" -rounds 2
	done
fi

"$bin/mwrpcab" -base "$OUT/base-*/latest.json" -new "$OUT/new-*/latest.json" ${CONTROL:+-control "$CONTROL"} >"$OUT/ab.md"
if [ -n "$STREAM_SYSTEMS" ]; then
	"$bin/mwrpcab" -base "$OUT/stream-base-*/latest.json" -new "$OUT/stream-new-*/latest.json" >"$OUT/ab-stream.md"
fi
echo "manycore-ab: done: $OUT/ab.md"
if [ "${PACK:-}" = 1 ]; then
	tmp=$(mktemp)
	tar czf "$tmp" -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv "$tmp" "$OUT/results.tgz"
	echo "manycore-ab: packed into $OUT/results.tgz"
fi
