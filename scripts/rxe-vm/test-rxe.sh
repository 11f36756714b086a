#!/usr/bin/env bash
# test-rxe.sh TESTBIN [SUITE=BIN...]: the host half of `make test-rxe`. Boots the Soft-RoCE
# VM (run-in-vm.sh), runs guest-test-rxe.sh there with TESTBIN (the ibv provider's test
# binary) and the further suites' test binaries (transport=..., rpc=..., kv=..., grpc=...:
# built with -tags ibverbs, their tests run over rxe0), streams the output, then prints a
# summary:
#
#   conformance(rxe): N passed, M failed (...)   one line per conformance fixture
#   ibv(tests): N passed, M failed               the package's other tests
#   <suite>: N passed, M failed, K skipped       each further suite (test and subtest
#                                                results), with the reasons for skips
#   latency(rxe, 64 B): ...                      this provider against perftest, as ratios
#   kernel: ...                                  warnings the kernel logged, if any
#
# Exits non-zero when the VM, a test or a measurement failed. The whole output is kept in
# RXE_TEST_LOG (/var/tmp/mwrpc-test-rxe.log). RXE_VM_* variables are passed to
# run-in-vm.sh; RXE_LAT_ITERS (1000) and RXE_LAT_ROUNDS (5) set the latency iterations and
# rounds.
set -euo pipefail
bin=${1:?usage: test-rxe.sh TESTBIN [SUITE=BIN...]}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
log=${RXE_TEST_LOG:-/var/tmp/mwrpc-test-rxe.log}
: >"$log"

# The guest sees this machine's / read-only, but with an empty tmpfs on /tmp: a checkout
# under /tmp is invisible there, so the guest script goes to /var/tmp (as the test binaries
# do).
stage=$(mktemp -d /var/tmp/mwrpc-rxe-guest.XXXXXX)
trap 'rm -rf "$stage"' EXIT
cp "$here/guest-test-rxe.sh" "$stage/"

set +e
suites=()
for a in "${@:2}"; do suites+=("${a%%=*}"); done
runvars=$(compgen -v SUITE_RUN_ || true)
RXE_VM_ENV="${RXE_VM_ENV:-} RXE_LAT_ITERS RXE_LAT_ROUNDS MWRPC_IBV_GID_INDEX MWRPC_IBV_KNOWN $runvars" \
  "$here/run-in-vm.sh" sh "$stage/guest-test-rxe.sh" "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e

echo
echo "==> test-rxe summary"
# Conformance: one line per fixture (TestConformance/<fixture>/<case>).
fixtures=$(sed -n 's/^ *--- [A-Z]*: TestConformance\/\([^/ ]*\)\/.*/\1/p' "$log" | sort -u)
[ -n "$fixtures" ] || echo "conformance: no results (see the output above)"
for f in $fixtures; do
  pass=$(grep -c "^ *--- PASS: TestConformance/$f/" "$log" || true)
  fail=$(grep -c "^ *--- FAIL: TestConformance/$f/" "$log" || true)
  skip=$(grep -c "^ *--- SKIP: TestConformance/$f/" "$log" || true)
  div=$(sed -n "s/.*DIVERGENT \([A-Z][0-9a-z]*\) .*/\1/p" "$log" | sort -u | tr '\n' ' ' | sed 's/ $//')
  line="conformance($f): $pass passed, $fail failed"
  [ "$skip" -eq 0 ] || line="$line, $skip skipped"
  [ -z "$div" ] || line="$line; divergent (passed, rxe's behaviour checked instead): $div"
  echo "$line"
  sed -n "s/.*: \([A-Z][0-9a-z]*\) is marked divergent for $f: \(.*\)\. The IBTA expectations below.*/  \1: \2/p" "$log" | sort -u
  grep "^ *--- FAIL: TestConformance/$f/" "$log" | sed 's/^ */  failed: /;s/ (.*//' || true
done
# section NAME: the output of one suite (between "==> suite NAME" and its exit line).
# The VM's first line of output can be lost in the console's boot noise: what comes before
# the first marker belongs to the first suite, ibv.
section() { awk -v s="$1" 'BEGIN { on = (s == "ibv") } $1 == "==>" && $2 == "suite" { on = ($3 == s && NF == 3); next } on' "$log"; }
# The package's other tests (top level, not the conformance suite).
pass=$(section ibv | grep -E -c '^--- PASS: Test' | tr -d ' ' || true)
fail=$(section ibv | grep -E -c '^--- FAIL: Test' | tr -d ' ' || true)
cpass=$(grep -c '^--- PASS: TestConformance ' "$log" || true)
cfail=$(grep -c '^--- FAIL: TestConformance ' "$log" || true)
echo "ibv(tests): $((pass - cpass)) passed, $((fail - cfail)) failed (besides the conformance suite)"
# The further suites: every test and subtest result, with the reasons for skips.
for s in "${suites[@]}"; do
  pass=$(section "$s" | grep -E -c '^ *--- PASS: ' || true)
  fail=$(section "$s" | grep -E -c '^ *--- FAIL: ' || true)
  skip=$(section "$s" | grep -E -c '^ *--- SKIP: ' || true)
  src=$(sed -n "s/^==> suite $s exit \([0-9]*\)$/\1/p" "$log" | tail -n1)
  line="$s(rxe): $pass passed, $fail failed, $skip skipped"
  case "$src" in
    0) ;;
    "") line="$line; no exit status (the VM stopped?)"; [ "$rc" -ne 0 ] || rc=6 ;;
    *) line="$line; exit $src"; [ "$fail" -gt 0 ] || line="$line (a panic or timeout: see the output above)" ;;
  esac
  echo "$line"
  section "$s" | grep -E '^ *--- FAIL: ' | sed 's/^ *--- FAIL: /  failed: /;s/ (.*//' || true
  section "$s" | grep -E -o 'SKIPPED.*' | sed 's/^SKIPPED:* */  skipped: /' | sort -u || true
done
# What the KV example saw on rxe: its calls, READs and window revocations.
section kv | grep -E '^ *(client: [0-9]+ calls;|server: [0-9]+ requests served;)' | sed 's/^ */  kv: /' || true

# Latency: for each measure, the median over the rounds of this provider's figure and of
# perftest's (t_typical: the median operation; t_min: the fastest), and their ratio.
median() { sort -n | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] }'; }
ours() { sed -n "s/^BenchmarkLatency\/$1[^ ]* .* \([0-9.]*\) $2.*/\1/p" "$log"; }
theirs() { awk -v t="$1" -v c="$2" '$1 == "perftest" && $2 == t":" && $3 == "64" { print $c }' "$log"; }
rd=$(ours read64 typ-us | median); sd=$(ours send64 typ-us | median)
rdm=$(ours read64 min-us | median); sdm=$(ours send64 min-us | median)
prd=$(theirs ib_read_lat 7 | median); psd=$(theirs ib_send_lat 7 | median)
prdm=$(theirs ib_read_lat 5 | median); psdm=$(theirs ib_send_lat 5 | median)
if [ -n "$rd" ] && [ -n "$sd" ] && [ -n "$prd" ] && [ -n "$psd" ]; then
  awk -v rd="$rd" -v sd="$sd" -v prd="$prd" -v psd="$psd" -v rdm="$rdm" -v sdm="$sdm" -v prdm="$prdm" -v psdm="$psdm" 'BEGIN {
    printf "latency(rxe, 64 B, median us): RDMA READ ibv %.2f / ib_read_lat %.2f = %.2f; SEND ibv %.2f (half a round trip) / ib_send_lat %.2f = %.2f\n",
      rd, prd, rd / prd, sd / 2, psd, (sd / 2) / psd
    printf "latency(rxe, 64 B, fastest us): RDMA READ ibv %.2f / ib_read_lat %.2f = %.2f; SEND ibv %.2f / ib_send_lat %.2f = %.2f\n",
      rdm, prdm, rdm / prdm, sdm / 2, psdm, (sdm / 2) / psdm }'
  echo "  per round, median us: ibv READ $(ours read64 typ-us | tr '\n' ' ')| ib_read_lat $(theirs ib_read_lat 7 | tr '\n' ' ')| ibv SEND round trip $(ours send64 typ-us | tr '\n' ' ')| ib_send_lat $(theirs ib_send_lat 7 | tr '\n' ' ')"
else
  echo "latency(rxe, 64 B): incomplete (ibv READ '${rd}', SEND '${sd}'; perftest READ '${prd}', SEND '${psd}')"
  [ "$rc" -ne 0 ] || rc=5
fi
grep -E '^kernel( problem)?:' "$log" | sort -u | head -n 5 || true
if [ "$rc" -eq 0 ]; then echo "test-rxe: ok (output in $log)"; else echo "test-rxe: FAILED (exit $rc; output in $log)"; fi
exit "$rc"
