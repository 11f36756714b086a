#!/bin/bash
# guest-faults.sh MWRPCLOAD: the fault suite's part inside the rxe VM (run-in-vm.sh, qemu
# with -nic none): loads netem and veth, then runs `MWRPCLOAD faults` for the soft TCP
# fabric (with the caller's adaptive lanes, then three pinned and lent memory) and for ibv
# over rxe, each printing its table. Exits non-zero if a row failed.
set -u
bin=$1
modprobe sch_netem && modprobe veth || { echo "guest-faults: the guest kernel has no sch_netem or veth" >&2; exit 90; }
rc=0
"$bin" faults -fabric soft -callers 4 || rc=1
# The same rows with the caller's Client on three lanes (three connections to the server,
# each of them a connection to every limit, counter and check of the server's), building
# its requests in registered memory and taking its responses lent: every Buffer a failed
# call took, and every loan, must be back in the Client's pool when it closes.
"$bin" faults -fabric soft -callers 4 -lanes 3 -lent || rc=1
# rxe in the emulated guest is slow: two callers keep the fault-free row nearly free of
# timeouts with the same deadline, and recovery gets a looser bound (it took up to 3.6 s
# after reordering, where the soft fabric takes at most 1.1 s).
"$bin" faults -fabric ibv -callers 2 -recover-bound 8s || rc=1
exit $rc
