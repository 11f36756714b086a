#!/bin/sh
# guest-bench-rxe.sh MWRPCBENCH: the guest half of `make bench-rxe`, run by run-in-vm.sh
# inside the VM (rxe0 is up). It runs the harness MWRPCBENCH (built with -tags ibverbs) in
# two-process mode for mwrpc-ibv (server and client processes on rxe0), mwrpc-tcp and
# rawtcp (both over the guest's loopback), then perftest's latency tools on rxe0 for the
# floor, and writes everything to the console as one gzipped tar in base32 between the
# lines "==> bench-rxe files begin" and "==> bench-rxe files end" (the VM's root file
# system is read-only: nothing else comes out of it); bench-rxe.sh unpacks it.
#
# Environment (bench-rxe.sh passes these in):
#   RXE_BENCH_SYSTEMS      -systems (mwrpc-ibv,mwrpc-tcp,rawtcp)
#   RXE_BENCH_PAYLOADS     -payloads (64,4KiB,64KiB,1MiB)
#   RXE_BENCH_CONCURRENCY  -concurrency (1,16)
#   RXE_BENCH_ROUNDS       -rounds (3)
#   RXE_BENCH_DURATION     -duration (1s)
#   RXE_BENCH_WARMUP       -warmup (200ms)
#   RXE_BENCH_TIMEOUT      seconds before the harness is killed (900)
#   RXE_BENCH_PERFTEST     perftest runs, TOOL:BYTES:ITERATIONS separated by spaces
#                          ("ib_send_lat:64:1000 ib_send_lat:4096:1000 ib_read_lat:64:1000
#                          ib_read_lat:65536:1000 ib_read_lat:1048576:200")
#   RXE_BENCH_PT_ROUNDS    rounds of the perftest runs (3); the report takes medians
# Exits non-zero when the harness or a perftest run failed (the files still come out).
set -u
bin=${1:?usage: guest-bench-rxe.sh MWRPCBENCH}
out=/tmp/bench-rxe
mkdir -p "$out"
# rxe logs refused requests with pr_err; keep the console for the output.
dmesg -n 1 2>/dev/null || true
export MWRPC_IBV_DEVICE=${MWRPC_IBV_DEVICE:-rxe0}

# rxe0's packet counters show that mwrpc-ibv's calls went over the device (mwrpc-tcp and
# rawtcp use loopback TCP; so do mwrpc-ibv's connection setups).
counters=/sys/class/infiniband/rxe0/ports/1/hw_counters
pkts() { echo "$(cat "$counters/sent_pkts" 2>/dev/null || echo '?') $(cat "$counters/rcvd_pkts" 2>/dev/null || echo '?')"; }

echo # the first line can be lost in the console's boot noise
echo "==> bench-rxe: mwrpcbench in two-process mode  [$(date +%T)]"
before=$(pkts)
# Its progress goes through a pipe (the console is a terminal: it would draw a bar); its
# markdown on stdout is in the files.
{
  timeout "${RXE_BENCH_TIMEOUT:-900}" "$bin" -mode two-process -cells echo \
    -systems "${RXE_BENCH_SYSTEMS:-mwrpc-ibv,mwrpc-tcp,rawtcp}" \
    -payloads "${RXE_BENCH_PAYLOADS:-64,4KiB,64KiB,1MiB}" -concurrency "${RXE_BENCH_CONCURRENCY:-1,16}" \
    -rounds "${RXE_BENCH_ROUNDS:-3}" -duration "${RXE_BENCH_DURATION:-1s}" -warmup "${RXE_BENCH_WARMUP:-200ms}" \
    -out "$out" 2>&1 >/dev/null
  echo $? >/tmp/bench-rxe.rc
} | cat
brc=$(cat /tmp/bench-rxe.rc)
after=$(pkts)
echo "rxe0 packets sent, received during the harness: $before before, $after after" | tee "$out/rxe0.txt"
[ "$brc" -eq 0 ] || echo "bench-rxe: mwrpcbench failed (exit $brc)"

# perftest: each TOOL:BYTES:ITERATIONS RXE_BENCH_PT_ROUNDS times, server and client on rxe0
# (GID index 1: RoCE v2 over IPv4, as the provider picks); one line per run in
# perftest.txt: "TOOL #bytes #iterations t_min t_max t_typical t_avg t_stdev 99% 99.9%"
# (microseconds; ib_send_lat's are half a round trip, ib_read_lat's a whole one).
prc=0
: >"$out/perftest.txt"
# The harness's processes have just torn down their QPs and MRs: the kernel's deferred
# cleanup would compete with the first run (one measured at once took 60x as long).
sleep 5
rounds=${RXE_BENCH_PT_ROUNDS:-3}
r=1
while [ "$r" -le "$rounds" ]; do
  for run in ${RXE_BENCH_PERFTEST:-ib_send_lat:64:1000 ib_send_lat:4096:1000 ib_read_lat:64:1000 ib_read_lat:65536:1000 ib_read_lat:1048576:200}; do
    t=${run%%:*}
    rest=${run#*:}
    size=${rest%%:*}
    iters=${rest#*:}
    # Let the guest settle after the processes before (see guest-test-rxe.sh).
    sleep 2
    echo "==> bench-rxe: perftest round $r of $rounds: $t -s $size -n $iters  [$(date +%T)]"
    timeout 120 "$t" -d rxe0 -x 1 -s "$size" -n "$iters" -F >/tmp/pt.server 2>&1 &
    spid=$!
    # The server may take seconds to listen in the emulated guest: a client that could not
    # connect tries again, at most 15 times; any other failure is one.
    try=1
    while :; do
      sleep 1
      if timeout 120 "$t" -d rxe0 -x 1 -s "$size" -n "$iters" -F 10.99.0.1 >/tmp/pt.client 2>&1; then
        break
      fi
      if [ "$try" -ge 15 ] || ! grep -q "Couldn't connect" /tmp/pt.client; then
        prc=1
        echo "$t client failed (try $try):"; cat /tmp/pt.client; echo "$t server:"; cat /tmp/pt.server
        break
      fi
      try=$((try + 1))
    done
    wait "$spid" || true
    line=$(awk '/t_typical/ { getline; print; exit }' /tmp/pt.client)
    if [ -n "$line" ]; then
      echo "$t $line" | tr -s ' \t' ' ' | tee -a "$out/perftest.txt"
    else
      prc=1
      echo "$t -s $size: no result line"
    fi
  done
  r=$((r + 1))
done

echo "==> bench-rxe files begin"
tar -C "$out" -czf - . | base32 -w 76
echo "==> bench-rxe files end"

[ "$brc" -eq 0 ] || exit 4
[ "$prc" -eq 0 ] || exit 5
exit 0
