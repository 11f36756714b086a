#!/usr/bin/env bash
# run-in-vm.sh CMD [ARG...]
#
# Runs CMD as root inside a throw-away qemu VM whose kernel has Soft-RoCE (rdma_rxe) loaded
# and one RDMA device, rxe0, on a dummy netdev d0 (10.99.0.1/24; GID index 1 is RoCE v2 over
# IPv4). The VM's root file system is this machine's /, read-only over 9p, with empty tmpfs
# on /tmp and /run, so a binary built here (cgo against libibverbs included) runs there
# unchanged; its output streams back. Exits with CMD's exit status, 125 when the VM gave no
# result.
#
# Needs root (qemu reads /boot; the guest loads modules) and the Debian packages
# qemu-system-x86 linux-image-amd64 busybox-static rdma-core ibverbs-providers
# ibverbs-utils (libibverbs-dev to build cgo code; perftest for its benchmarks). No KVM is
# needed: qemu emulates (TCG), and boot takes 5-40 s depending on the machine's load.
# Nothing on this machine is changed; the VM's scratch files live under /var/tmp. The VM
# has no network device to the outside (-nic none): its only interfaces are the ones the
# guest creates (d0 for rxe0; the fault suite's veth pair).
#
# Environment:
#   RXE_VM_MEM      guest memory in MiB (2048)
#   RXE_VM_CPUS     guest vCPUs (2)
#   RXE_VM_TIMEOUT  seconds before the VM is killed (900)
#   RXE_VM_KERNEL   kernel image (the newest /boot/vmlinuz-*)
#   RXE_VM_ENV      names of variables of this environment to export into CMD's
#   RXE_VM_LOG      file to copy the raw console log to
#   RXE_VM_DRY_RUN  1: print the command as the guest would run it, and boot nothing (the
#                   work directory, named on stderr, is left for the caller to remove)
#
# The guest mounts empty tmpfs on /tmp and /run: a file the command names there (relative
# to a checkout under /tmp, say) is copied into the VM's work directory first and named by
# that path (stage-args.sh), so every step works from a checkout anywhere.
set -euo pipefail

if [ $# -lt 1 ] || [ "$1" = -h ] || [ "$1" = --help ]; then
  sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0" >&2
  exit 2
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/stage-args.sh"
if [ "${RXE_VM_DRY_RUN:-}" != 1 ]; then
  [ "$(id -u)" -eq 0 ] || { echo "run-in-vm: must run as root (qemu reads /boot, the guest loads modules)" >&2; exit 2; }
  kernel=${RXE_VM_KERNEL:-$(ls -1 /boot/vmlinuz-* 2>/dev/null | sort -V | tail -n1)}
  [ -n "$kernel" ] && [ -r "$kernel" ] || { echo "run-in-vm: no kernel in /boot: apt-get install linux-image-amd64" >&2; exit 2; }
  kver=${kernel#/boot/vmlinuz-}
  command -v qemu-system-x86_64 >/dev/null || { echo "run-in-vm: no qemu: apt-get install qemu-system-x86" >&2; exit 2; }
  [ -x /bin/busybox ] || { echo "run-in-vm: no /bin/busybox: apt-get install busybox-static" >&2; exit 2; }
  modinfo -k "$kver" rdma_rxe >/dev/null 2>&1 || { echo "run-in-vm: kernel $kver has no rdma_rxe module" >&2; exit 2; }
fi

work=$(mktemp -d /var/tmp/rxe-vm.XXXXXX) # not under /tmp: the guest mounts a tmpfs there
trap 'rm -rf "$work"' EXIT
# Files the command names that the guest cannot see (a checkout under /tmp) are copied in.
stage_args "$work/stage" "$@"
set -- "${staged[@]}"

# The command, quoted for sh, with the exported variables, in a file the guest reads.
{
  for v in ${RXE_VM_ENV:-}; do
    if [ -n "${!v+x}" ]; then printf 'export %s=%q\n' "$v" "${!v}"; fi
  done
  printf '%q ' "$@"
  echo
} >"$work/cmd"
if [ "${RXE_VM_DRY_RUN:-}" = 1 ]; then # the command the guest would run, and no VM
  trap - EXIT                            # its staged files stay, for the caller to check
  echo "run-in-vm: dry run: work directory $work" >&2
  cat "$work/cmd"
  exit 0
fi
mkdir -p "$work"/ir/{bin,mods,proc,sys,dev,newroot}
cp /bin/busybox "$work"/ir/bin/

# The initramfs only mounts this machine's / over 9p: it needs virtio and 9p modules (the
# ones the kernel has built in are skipped).
mods="virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci netfs fscache 9pnet 9pnet_virtio 9p"
for m in $mods; do
  f=$(modinfo -k "$kver" -F filename "$m" 2>/dev/null || true)
  case "$f" in
    *.ko) cp "$f" "$work/ir/mods/$m.ko" ;;
    *.ko.xz) xz -dc "$f" >"$work/ir/mods/$m.ko" ;;
    *.ko.zst) zstd -qdc "$f" >"$work/ir/mods/$m.ko" ;;
    *) ;;
  esac
done

# Runs in the guest, chrooted into this machine's /: rxe0 on a dummy netdev, then CMD.
cat >"$work/guest.sh" <<GUEST
#!/bin/sh
export PATH=/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/tmp
cd "$PWD" 2>/dev/null || cd /
modprobe rdma_rxe && modprobe dummy || { echo "RXE_VM_RC=97"; exit; }
ip link set lo up
ip link add d0 type dummy && ip addr add 10.99.0.1/24 dev d0 && ip link set d0 up
i=0
until rdma link add rxe0 type rxe netdev d0 2>/dev/null; do
  i=\$((i+1))
  [ \$i -lt 50 ] || { rdma link add rxe0 type rxe netdev d0; echo "RXE_VM_RC=98"; exit; }
  sleep 0.1
done
ulimit -l unlimited
sh "$work/cmd"; echo "RXE_VM_RC=\$?"
GUEST

cat >"$work/ir/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
for m in virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci netfs fscache 9pnet 9pnet_virtio 9p; do
  [ -f /mods/$m.ko ] && insmod /mods/$m.ko
done
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000 hostroot /newroot || { echo "RXE_VM_RC=99"; poweroff -f; }
mount -t proc proc /newroot/proc; mount -t sysfs sys /newroot/sys; mount -t devtmpfs dev /newroot/dev
mount -t tmpfs tmp /newroot/tmp; mount -t tmpfs run /newroot/run
G=$(sed -n 's/.*rxevm=\([^ ]*\).*/\1/p' /proc/cmdline)
exec chroot /newroot /bin/sh -c "/bin/sh $G; echo o >/proc/sysrq-trigger"
INIT
chmod +x "$work/ir/init" "$work/guest.sh"
(cd "$work/ir" && find . | cpio -o -H newc 2>/dev/null | gzip -1 >"$work/initramfs.gz")

log="$work/console.log"
set +e
timeout "${RXE_VM_TIMEOUT:-900}" qemu-system-x86_64 -accel tcg -cpu max -m "${RXE_VM_MEM:-2048}" -smp "${RXE_VM_CPUS:-2}" \
  -nic none -nographic -no-reboot -kernel "$kernel" -initrd "$work/initramfs.gz" \
  -append "console=ttyS0 quiet panic=-1 rxevm=$work/guest.sh" \
  -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap </dev/null \
  | tee "$log" | tr -d '\r' | sed -u -e 's/\x1b\[[0-9;?]*[a-zA-Z]//g' -e 's/\x1bc//g' \
  | grep --line-buffered -v -e '^RXE_VM_RC=' -e '^\[ *[0-9.]*\]' -e SeaBIOS -e iPXE -e 'Booting from ROM' -e '^\s*$'
qrc=${PIPESTATUS[0]}
set -e
[ -z "${RXE_VM_LOG:-}" ] || cp "$log" "$RXE_VM_LOG"
rc=$(tr -d '\r' <"$log" | sed -n 's/^RXE_VM_RC=\([0-9]*\).*/\1/p' | tail -n1)
if [ -z "$rc" ]; then
  echo "run-in-vm: the VM ended without a result (qemu exit $qrc); the end of its console log:" >&2
  tail -n 40 "$log" >&2
  exit 125
fi
case "$rc" in
  97) echo "run-in-vm: the guest could not load rdma_rxe or dummy" >&2 ;;
  98) echo "run-in-vm: the guest could not add rxe0" >&2 ;;
  99) echo "run-in-vm: the guest could not mount this machine's / over 9p" >&2 ;;
esac
exit "$rc"
