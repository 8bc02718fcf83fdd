# aenv guest init, stage 2: runs as PID 1 inside the user rootfs, tools at /.aenv.
bb=/.aenv/bin/busybox
image_init="$1"
$bb mkdir -p /dev/pts /dev/shm /sys/fs/cgroup /run
$bb mount -t devpts -o newinstance,ptmxmode=0666,mode=0620,gid=5 devpts /dev/pts
$bb ln -sf pts/ptmx /dev/ptmx
$bb mount -t tmpfs -o mode=1777 shm /dev/shm
$bb mount -t tmpfs -o mode=0755 run /run
# favordynmods: every user command joins the user cgroup, and without it that migration
# waits for an RCU grace period (10-15 ms under TCG, measured).
$bb mount -t cgroup2 -o favordynmods cgroup2 /sys/fs/cgroup 2>/dev/null ||
  $bb mount -t cgroup2 cgroup2 /sys/fs/cgroup
$bb chmod 1777 /tmp
$bb hostname sandbox
echo sandbox > /etc/hostname
printf '127.0.0.1\tlocalhost\n::1\tlocalhost\n127.0.1.1\tsandbox\n' > /etc/hosts
echo 'nameserver 169.254.0.22' > /etc/resolv.conf
$bb ip link set lo up

# The agent runs on the tools drive's own Python, through its own dynamic loader, so it
# works whatever libc (if any) the user image has.
agent() {
  PYTHONHOME=/.aenv/python PYTHONPATH=/.aenv/python/lib/python3.11/site-packages \
  PYTHONDONTWRITEBYTECODE=1 PYTHONNOUSERSITE=1 \
    /.aenv/lib/ld-linux-x86-64.so.2 --library-path /.aenv/lib \
    /.aenv/python/bin/python3 -s -m aenv.guest.agent
}
( while :; do
    agent </dev/null >/dev/console 2>&1
    echo "aenv-init: agent exited ($?), restarting" >/dev/console
    $bb sleep 0.2
  done ) &

if [ -n "$image_init" ] && [ -x "$image_init" ]; then
  exec "$image_init"
fi
# PID 1 must reap orphans: `wait` in ash reaps any child.
while :; do wait; $bb sleep 1; done
