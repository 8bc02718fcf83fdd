#!/usr/bin/env bash
# Fails if anything aenv creates is still around after the suite: VMM processes, slot
# namespaces, host veths, jail cgroups.
set -u
bad=0
# Zombies are not leaks: a reclaimed orphan's VMM waits for the host's init to reap it.
q=$(ps -eo pid=,stat=,args= | awk '$2 !~ /^Z/ && $3 ~ /qemu-system/' || true)
[ -n "$q" ] && { echo "leak: QEMU processes:"; echo "$q"; bad=1; }
ns=$(ip netns list 2>/dev/null | grep -E '^aenv' || true)
[ -n "$ns" ] && { echo "leak: network namespaces:"; echo "$ns"; bad=1; }
links=$(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | grep -E '^aenv' || true)
[ -n "$links" ] && { echo "leak: host links:"; echo "$links"; bad=1; }
for d in /sys/fs/cgroup/aenv /sys/fs/cgroup/memory/aenv; do
  if [ -d "$d" ]; then
    g=$(find "$d" -mindepth 1 -maxdepth 1 -type d)
    [ -n "$g" ] && { echo "leak: cgroups:"; echo "$g"; bad=1; }
  fi
done
((bad == 0)) && echo "leak check: clean"
exit $bad
