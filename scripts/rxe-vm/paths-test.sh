#!/usr/bin/env bash
# paths-test.sh: checks that the VM steps work from a checkout anywhere, /tmp included. The
# guest mounts an empty tmpfs on /tmp, so a file a step names inside a checkout there
# (test-faults: scripts/faults/guest-faults.sh) must reach the guest through a path it
# sees. Copies scripts/ into a fresh directory under /tmp, runs run-in-vm.sh from there in
# dry-run mode (no VM: it needs neither root nor qemu) the way `make test-faults` does, and
# checks the command the guest would run: every file it names is outside /tmp and /run, and
# holds what the checkout's file holds; a file outside /tmp is named by its absolute path,
# not copied; other arguments pass unchanged. Run by `make test-scripts`.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
checkout=$(mktemp -d /tmp/mwrpc-paths.XXXXXX)
works=()
cleanup() { rm -rf "$checkout" "${works[@]}"; }
trap cleanup EXIT
cp -r "$repo/scripts" "$checkout/"
fail=0
check() { # check NAME GOT WANT
  if [ "$2" != "$3" ]; then echo "FAIL: $1: got '$2', want '$3'"; fail=1; else echo "ok: $1"; fi
}

# dry DIR ARG...: runs run-in-vm.sh from DIR in dry-run mode; sets words to the guest's
# command line (its last line of output), split as sh would, and records the work directory.
dry() {
  local dir=$1 out err
  shift
  err=$(mktemp)
  out=$(cd "$dir" && RXE_VM_DRY_RUN=1 scripts/rxe-vm/run-in-vm.sh "$@" 2>"$err")
  works+=("$(sed -n 's/^run-in-vm: dry run: work directory //p' "$err")")
  rm -f "$err"
  eval "words=($(tail -n1 <<<"$out"))"
}

# From a checkout under /tmp, as `make test-faults` calls it.
dry "$checkout" scripts/faults/guest-faults.sh /var/tmp/mwrpcload-ibv -flag
g=${words[0]}
case "$g" in /tmp/* | /run/* | [!/]*) check "guest script from a /tmp checkout is outside /tmp" "$g" "a path outside /tmp" ;;
*) check "guest script from a /tmp checkout is outside /tmp" ok ok ;; esac
if cmp -s "$g" "$checkout/scripts/faults/guest-faults.sh"; then check "staged guest script holds the checkout's" ok ok
else check "staged guest script holds the checkout's" "$(head -c 80 "$g" 2>&1)" "the checkout's file"; fi
check "a binary under /var/tmp passes unchanged" "${words[1]}" /var/tmp/mwrpcload-ibv
check "a flag passes unchanged" "${words[2]}" -flag

# From this checkout (wherever it is): a file outside /tmp is named absolutely, not copied.
dry "$repo" scripts/faults/guest-faults.sh
case "$repo" in
/tmp/* | /run/*) check "this checkout is under /tmp: its file is staged" "${words[0]#"$repo"}" "${words[0]}" ;;
*) check "a file outside /tmp is named by its absolute path" "${words[0]}" "$repo/scripts/faults/guest-faults.sh" ;;
esac
exit $fail
