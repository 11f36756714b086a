#!/usr/bin/env bash
# bench-rxe.sh MWRPCBENCH OUTDIR: the host half of `make bench-rxe`. Boots the Soft-RoCE VM
# (run-in-vm.sh), runs guest-bench-rxe.sh there with MWRPCBENCH (benchmarks/cmd/mwrpcbench
# built with -tags ibverbs), streams the output, and unpacks the files the guest printed
# (the harness's latest.json, latest.md and charts; perftest.txt; rxe0.txt: rxe0's packet
# counters) and host.txt (this machine's load around the VM) into OUTDIR, replacing
# what was there, once all of them arrived intact. The whole output is kept in
# RXE_BENCH_LOG (/var/tmp/mwrpc-bench-rxe.log). RXE_VM_* variables go to run-in-vm.sh,
# RXE_BENCH_* and MWRPC_IBV_DEVICE to the guest (see guest-bench-rxe.sh). Exits non-zero
# when the VM, the harness or perftest failed, or the files did not come out.
set -euo pipefail
bin=${1:?usage: bench-rxe.sh MWRPCBENCH OUTDIR}
outdir=${2:?usage: bench-rxe.sh MWRPCBENCH OUTDIR}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
log=${RXE_BENCH_LOG:-/var/tmp/mwrpc-bench-rxe.log}
: >"$log"

# The guest sees this machine's / read-only with an empty tmpfs on /tmp: the guest script
# goes to /var/tmp, as the binary does.
stage=$(mktemp -d /var/tmp/mwrpc-rxe-bench.XXXXXX)
trap 'rm -rf "$stage"' EXIT
cp "$here/guest-bench-rxe.sh" "$stage/"

load_start=$(cut -d' ' -f1 /proc/loadavg)
set +e
benchvars=$(compgen -v RXE_BENCH_ || true)
RXE_VM_ENV="${RXE_VM_ENV:-} MWRPC_IBV_DEVICE MWRPC_IBV_GID_INDEX $benchvars" \
  "$here/run-in-vm.sh" sh "$stage/guest-bench-rxe.sh" "$bin" 2>&1 \
  | tee "$log" | sed -u '/^==> bench-rxe files begin$/,/^==> bench-rxe files end$/d'
rc=${PIPESTATUS[0]}
set -e

# The files: base32 of a gzipped tar between the markers (lines of other output the console
# may have mixed in are not base32 and fail the decoding, as does a cut-off transfer).
mkdir -p "$stage/files"
if sed -n '/^==> bench-rxe files begin$/,/^==> bench-rxe files end$/{/^==> /d;p}' "$log" \
  | base32 -d | tar -xzf - -C "$stage/files"; then
  # The machine may be shared: how busy it was besides the VM goes with the results.
  echo "The machine running the VM: 1-minute load average $load_start before the VM, $(cut -d' ' -f1 /proc/loadavg) after (the emulated VM alone keeps it near 1.5)." >"$stage/files/host.txt"
  if [ -s "$stage/files/latest.json" ] && [ -s "$stage/files/perftest.txt" ]; then
    mkdir -p "$outdir"
    rm -f "$outdir"/latest.json "$outdir"/latest.md "$outdir"/*.png "$outdir"/perftest.txt "$outdir"/rxe0.txt "$outdir"/host.txt
    cp "$stage/files"/* "$outdir"/
    echo "bench-rxe: wrote $(cd "$stage/files" && ls | tr '\n' ' ')into $outdir"
  else
    echo "bench-rxe: the guest's files are incomplete (no latest.json or perftest.txt): $outdir left as it was" >&2
    [ "$rc" -ne 0 ] || rc=6
  fi
else
  echo "bench-rxe: the guest's files did not come out intact: $outdir left as it was (output in $log)" >&2
  [ "$rc" -ne 0 ] || rc=6
fi
exit "$rc"
