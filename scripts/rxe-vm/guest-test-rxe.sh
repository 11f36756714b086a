#!/bin/sh
# guest-test-rxe.sh TESTBIN [SUITE=BIN...]: the guest half of `make test-rxe`, run by
# run-in-vm.sh inside the VM (rxe0 is up). It runs the ibv provider's tests and latency
# benchmark from TESTBIN (go test -c -tags ibverbs ./transport/verbs/ibv/), then each
# further suite's test binary (built with -tags ibverbs: transport, rpc, examples/kv,
# examples/grpc; its tests run over rxe0 too), then perftest's ib_read_lat and ib_send_lat
# on rxe0 for comparison, and reports kernel warnings. Each suite's output starts with
# "==> suite NAME" and ends with "==> suite NAME exit N"; test-rxe.sh parses the output.
# SUITE_RUN_<NAME> (a -test.run pattern) selects a suite's tests. Exits non-zero when a test
# fails or a measurement could not be taken.
set -u
bin=${1:?usage: guest-test-rxe.sh TESTBIN [SUITE=BIN...]}
shift
iters=${RXE_LAT_ITERS:-1000}
# rxe logs refused requests with pr_err; keep the console for the test output.
dmesg -n 1 2>/dev/null || true
export MWRPC_IBV_REQUIRE=1

echo # the first line can be lost in the console's boot noise
echo "==> suite ibv"
"$bin" -test.v -test.run '^Test' -test.timeout 10m
trc=$?
echo "==> suite ibv exit $trc"

# The other suites: the transport's end-to-end tests, rpc's, the KV example's and gRPC-Go's
# interop cases over mwnet, over rxe0.
# Each runs in its package's directory (the source tree is this machine's, read-only).
for arg in "$@"; do
  name=${arg%%=*}
  sbin=${arg#*=}
  eval "run=\${SUITE_RUN_$name:-.}"
  echo "==> suite $name"
  "$sbin" -test.v -test.run "$run" -test.timeout 5m
  rc=$?
  echo "==> suite $name exit $rc"
  [ "$rc" -eq 0 ] || trc=$rc
done

# Latency: this provider and perftest take turns, RXE_LAT_ROUNDS times, so that both see
# the same load (the VM is emulated and shares the machine); test-rxe.sh compares medians.
brc=0
prc=0
rounds=${RXE_LAT_ROUNDS:-5} # medians of 5: in the emulated guest single rounds swing by tens of percent
r=1
while [ "$r" -le "$rounds" ]; do
  # Let the guest settle first, as perftest's client does (it starts a second or more after
  # its server): right after processes tear down QPs and MRs, the kernel's deferred cleanup
  # competes with the measurement (a READ round trip measured at once took 60 us, the same
  # seconds later 36 us).
  sleep 3
  echo "==> latency round $r of $rounds: ibv ($iters iterations)"
  "$bin" -test.run '^$' -test.bench '^BenchmarkLatency$' -test.benchtime "${iters}x" -test.benchmem -test.timeout 5m || brc=1
  for t in ib_read_lat ib_send_lat; do
    echo "==> latency round $r of $rounds: perftest $t -s 64 -n $iters"
    timeout 120 "$t" -d rxe0 -x 1 -s 64 -n "$iters" -F >/tmp/"$t".server 2>&1 &
    spid=$!
    # The server may take seconds to listen in the emulated guest: a client that could not
    # connect tries again (the server still waits for its one connection); any other
    # failure is one.
    try=1
    while :; do
      sleep 1
      if timeout 120 "$t" -d rxe0 -x 1 -s 64 -n "$iters" -F 10.99.0.1 >/tmp/"$t".client 2>&1; then
        break
      fi
      if [ "$try" -ge 15 ] || ! grep -q "Couldn't connect" /tmp/"$t".client; then
        prc=1
        echo "$t client failed (try $try):"; cat /tmp/"$t".client; echo "$t server:"; cat /tmp/"$t".server
        break
      fi
      try=$((try + 1))
    done
    wait "$spid" || true
    sed -n '/t_typical/,/^-\{10,\}/{s/^/perftest: /;p}' /tmp/"$t".client | sed "s/^perftest: /perftest $t: /"
  done
  r=$((r + 1))
done

echo "==> kernel log"
problems=$(dmesg | grep -E 'WARNING:|BUG:|Oops|general protection|Timed out waiting' || true)
if [ -n "$problems" ]; then
  echo "$problems" | head -n 20 | sed 's/^/kernel problem: /'
  krc=1
else
  echo "kernel: no WARNING, BUG or Oops in dmesg"
  krc=0
fi

[ "$trc" -eq 0 ] || exit "$trc"
[ "$brc" -eq 0 ] || exit 4
[ "$prc" -eq 0 ] || exit 5
exit "$krc"
