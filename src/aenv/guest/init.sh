#!/bin/busybox sh
# aenv guest init (PID 1). The kernel boots from the read-only tools drive (vda); this
# mounts the user rootfs (vdb), pivots into it with the tools drive at /.aenv, and runs
# the agent under a supervisor. Only busybox from the tools drive is used: the user
# rootfs may have no shell at all.
bb=/bin/busybox
export PATH=/bin
$bb mount -t proc proc /proc
$bb mount -t sysfs sys /sys
$bb mount -t devtmpfs dev /dev
cmdline=$($bb cat /proc/cmdline)
arg() { for w in $cmdline; do case "$w" in "$1="*) echo "${w#*=}";; esac; done; }

if ! $bb mount -t ext4 -o rw,noatime /dev/vdb /rootfs; then
  echo "aenv-init: cannot mount the rootfs (/dev/vdb)" >/dev/console
  $bb poweroff -f
fi
for d in .aenv proc sys dev tmp run etc; do $bb mkdir -p /rootfs/$d; done
$bb mount --move /proc /rootfs/proc
$bb mount --move /sys /rootfs/sys
$bb mount --move /dev /rootfs/dev
cd /rootfs
$bb pivot_root . .aenv
exec /.aenv/bin/busybox chroot . /.aenv/bin/busybox sh /.aenv/init-stage2 "$(arg aenv.init)"
