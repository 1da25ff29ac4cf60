#!/usr/bin/env bash
# Installs the Debian packages that the dev cluster's real node needs beside
# the cluster binaries (`partita dev up --real-node`, docs/real-node.md):
#   runc                         the OCI runtime containerd starts containers with
#   containernetworking-plugins  the CNI plugins (bridge, host-local, loopback, portmap)
#   iptables                     kube-proxy's Service rules, the CNI masquerade
#   conntrack                    kube-proxy clears stale UDP entries with it
#   iproute2                     `dev down` removes the node's bridge with it
#
# Idempotent: does nothing (and needs no network) when every package is
# installed. Needs root and apt-get; otherwise it prints the command to run.
#
#   --check    only report what is missing (exit 1 if anything is)
#   --if-root  as root install; otherwise only report and succeed, so that
#              `make test` runs for a non-root user (the real-node tests
#              then skip, saying they need root)
set -euo pipefail

packages=(runc containernetworking-plugins iptables conntrack iproute2)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
cmd="apt-get update && apt-get install -y --no-install-recommends ${missing[*]}"
if [ "${1:-}" = "--check" ]; then
  echo "real-node-deps: missing Debian packages: ${missing[*]}; install them with: $cmd" >&2
  exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "real-node-deps: missing ${missing[*]} and this host has no apt-get; install the equivalent packages of your distribution" >&2
  exit 1
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "real-node-deps: missing ${missing[*]}; as root run: $cmd" >&2
  if [ "${1:-}" = "--if-root" ]; then
    exit 0
  fi
  exit 1
fi
echo "real-node-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
