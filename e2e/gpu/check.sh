#!/usr/bin/env bash
# Real-GPU check of the node agent (issue 4): compares what
# `partita agent --once --print` discovers with nvidia-smi and sysfs, and,
# where MPS is installed, starts, checks and stops an MPS control daemon per
# device through the agent (`--once --mode mps`). Exits non-zero when
# discovery is wrong; 2 when the machine has no NVIDIA GPU.
#
# Usage: e2e/gpu/check.sh [PARTITA_BINARY]   (default $PARTITA_BIN, else bin/partita)
# Needs: nvidia-smi, python3; run as root for MPS.
set -euo pipefail
cd "$(dirname "$0")/../.."

partita=${1:-${PARTITA_BIN:-bin/partita}}
[[ -x $partita ]] || { echo "check: $partita not found: run 'make build' or pass the binary" >&2; exit 1; }
command -v nvidia-smi >/dev/null || { echo "check: nvidia-smi not found: this check needs a machine with an NVIDIA GPU" >&2; exit 2; }
command -v python3 >/dev/null || { echo "check: python3 is needed to compare the outputs" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "== partita agent --once --print"
"$partita" agent --once --print --node-name "$(hostname)" --v 1 >"$work/inventory.json"
cat "$work/inventory.json"

echo "== nvidia-smi"
nvidia-smi --query-gpu=index,uuid,name,memory.total,pci.bus_id,mig.mode.current,compute_cap \
  --format=csv,noheader,nounits | tee "$work/smi.csv"

echo "== compare"
python3 - "$work/inventory.json" "$work/smi.csv" <<'PY'
import csv, json, os, sys

inv = json.load(open(sys.argv[1]))
smi = [[c.strip() for c in row] for row in csv.reader(open(sys.argv[2])) if row]
bad = []

def check(what, got, want):
    if got != want:
        bad.append(f"{what}: agent says {got!r}, nvidia-smi/sysfs say {want!r}")

devices = {d["index"]: d for d in inv["devices"]}
check("device count", len(devices), len(smi))
schedulable = 0
for index, uuid, name, mem, bus, mig, cc in smi:
    d = devices.get(int(index))
    if d is None:
        bad.append(f"device {index} ({uuid}) is missing")
        continue
    check(f"device {index} UUID", d["uuid"], uuid)
    check(f"device {index} product", d.get("product"), name)
    check(f"device {index} memoryMiB", d["memoryMiB"], int(mem))
    want_mig = {"Enabled": "Enabled", "Disabled": "Disabled"}.get(mig, "Unsupported")
    check(f"device {index} migMode", d.get("migMode"), want_mig)
    if cc and cc != "[N/A]":
        check(f"device {index} computeCapability", d.get("computeCapability"), cc)
    check(f"device {index} health", d["health"], "Healthy")
    addr = bus.lower()
    dom, rest = addr.split(":", 1)
    path = f"/sys/bus/pci/devices/{dom[-4:]}:{rest}/numa_node"
    if os.path.exists(path):
        numa = int(open(path).read().strip())
        check(f"device {index} numaNode", d.get("numaNode"), numa if numa >= 0 else None)
    if want_mig != "Enabled":
        schedulable += 1
check("capacityMilli", inv["capacityMilli"], 1000 * schedulable)
if bad:
    print("DISCOVERY IS WRONG:")
    for b in bad:
        print("  " + b)
    sys.exit(1)
print(f"discovery OK: {len(devices)} devices, capacity {inv['capacityMilli']} milli-GPUs")
PY

if command -v nvidia-cuda-mps-control >/dev/null; then
  echo "== MPS start/stop through the agent"
  "$partita" agent --once --mode mps --mps-dir "$work/mps" --node-name "$(hostname)"
else
  echo "== MPS: nvidia-cuda-mps-control not found, skipped"
fi
echo "check: OK"
