#!/bin/bash
# guest-faults.sh MWRPCLOAD: the fault suite's part inside the rxe VM (run-in-vm.sh, qemu
# with -nic none): loads netem and veth, then runs `MWRPCLOAD faults` for the soft TCP
# fabric and for ibv over rxe, each printing its table. Exits non-zero if a row failed.
set -u
bin=$1
modprobe sch_netem && modprobe veth || { echo "guest-faults: the guest kernel has no sch_netem or veth" >&2; exit 90; }
rc=0
"$bin" faults -fabric soft -callers 4 || rc=1
# rxe in the emulated guest is slow: two callers keep the fault-free row free of
# timeouts with the same deadline.
"$bin" faults -fabric ibv -callers 2 || rc=1
exit $rc
