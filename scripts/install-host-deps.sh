#!/usr/bin/env bash
# Installs the Debian packages aenv needs on the host. Never a kernel package: the guest
# kernel is built from linux-source into the data directory. dnsmasq-base, not dnsmasq: the
# binary for the tests' own resolvers, never a service on the host's port 53. nfs-ganesha and
# rpcbind serve volumes from inside slot namespaces only (volumes/server.py), never as the
# host's services. systemd for systemd-analyze, which checks deploy/systemd's units
# (tests/unit/test_deploy.py): already there on a host systemd runs; installing it does not
# make it the init of a host (or container) without it. tcpdump: what crosses a cluster's
# links is captured in tests/integration/cluster/test_links.py. chromium: the web console's
# tests drive it headless with Playwright (tests/support/browser.py).
set -euo pipefail
pkgs=(qemu-system-x86 qemu-utils debootstrap nftables xfsprogs e2fsprogs protobuf-compiler
      busybox-static linux-source-6.12 build-essential flex bison bc libelf-dev libssl-dev
      cpio iproute2 util-linux tmux nodejs wrk stress-ng
      skopeo umoci docker-registry etcd-server haproxy dnsmasq-base dante-server stunnel4
      nfs-ganesha nfs-ganesha-vfs rpcbind systemd tcpdump chromium)
# npm installs the console's libraries (make setup): Debian's nodejs comes without it, a
# nodejs from elsewhere (NodeSource) carries its own.
command -v npm >/dev/null || pkgs+=(npm)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
