#!/usr/bin/env bash
# Real-GPU check of the node agent (issue 4): compares what
# `partita agent --once --print` discovers with nvidia-smi and sysfs, and,
# where MPS is installed, starts, checks and stops an MPS control daemon per
# device through the agent (`--once --mode mps`). Then the cap check: for
# each isolation mode the machine has (time-slicing always; mps where
# nvidia-cuda-mps-control is installed; hami-core where a HAMi-core
# libvgpu.so is found), a process set up as the agent sets up a slice of
# CAP_GIB GiB allocates until it fails (e2e/gpu/capcheck, the driver's
# cuMemAlloc through purego, no CUDA toolkit needed) and must get about
# CAP_GIB GiB (within 10 %) and no more, while a second process on the same
# device with no limit, started while the first holds its memory, still
# gets twice the cap. time-slicing has no cap (the watchdog is its
# backstop): its slice asks for 1 GiB more, and what it got is reported. Exits non-zero when discovery or
# a cap is wrong; 2 when the machine has no NVIDIA GPU.
#
# Usage: e2e/gpu/check.sh [PARTITA_BINARY]   (default $PARTITA_BIN, else bin/partita)
# Env: CAP_GIB (default 4), CAP_DEVICE (default 0), LIBVGPU (HAMi-core's
# library; default: the first of /var/lib/partita/interposer/libvgpu.so,
# /usr/local/vgpu/libvgpu.so).
# Needs: nvidia-smi, python3, go (to build capcheck); run as root for MPS.
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
echo "== cap check (e2e/gpu/capcheck)"
cap_gib=${CAP_GIB:-4}
cap_dev=${CAP_DEVICE:-0}
cap_mib=$((cap_gib * 1024))
CGO_ENABLED=0 go build -o "$work/capcheck" ./e2e/gpu/capcheck

# cap MODE [ENV=VALUE...]: runs a process with ENV (the slice) that holds
# what it got while a second one, without it, wants twice the cap; then
# checks both. Both see only device CAP_DEVICE, as their device 0.
# $slice_args are more capcheck flags for the slice.
cap() {
  local mode=$1; shift
  echo "-- $mode: a slice of ${cap_gib} GiB (${*:-no limit}) and a process beside it"
  env CUDA_VISIBLE_DEVICES="$cap_dev" "$@" "$work/capcheck" --device 0 --hold 20s ${slice_args:-} >"$work/$mode-slice.json" 2>"$work/$mode-slice.err" &
  local pid=$!
  for _ in $(seq 1 600); do
    grep -q holding "$work/$mode-slice.err" 2>/dev/null && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  CUDA_VISIBLE_DEVICES="$cap_dev" "$work/capcheck" --device 0 --max $((2 * cap_mib)) >"$work/$mode-other.json"
  wait "$pid" || { cat "$work/$mode-slice.err" >&2; return 1; }
  cat "$work/$mode-slice.json" "$work/$mode-other.json"
  python3 - "$mode" "$cap_mib" "$work/$mode-slice.json" "$work/$mode-other.json" <<'PY'
import json, sys
mode, cap = sys.argv[1], int(sys.argv[2])
s, o = json.load(open(sys.argv[3])), json.load(open(sys.argv[4]))
bad = []
got = s["allocatedMiB"]
if mode == "time-slicing":
    # Asked for 1 GiB over its slice: nothing stops it but the watchdog.
    print(f"  time-slicing: no allocation cap: the slice of {cap} MiB got {got} MiB (stopped by {s['stoppedBy']}); the watchdog is the backstop")
else:
    if not 0.9 * cap <= got <= 1.1 * cap:
        bad.append(f"the slice of {cap} MiB got {got} MiB (stopped by {s['stoppedBy']}), want {cap} MiB within 10 %")
if o["allocatedMiB"] < 2 * cap:
    bad.append(f"the process beside the slice got {o['allocatedMiB']} MiB (stopped by {o['stoppedBy']}), want {2 * cap} MiB: the slice's limit leaked to it")
if bad:
    print(f"  {mode}: CAP IS WRONG:")
    for b in bad:
        print("    " + b)
    sys.exit(1)
print(f"  {mode}: OK: slice {got} MiB, neighbour {o['allocatedMiB']} MiB")
PY
}

failed=0
slice_args="--max $((cap_mib + 1024))" cap time-slicing || failed=1
if command -v nvidia-cuda-mps-control >/dev/null; then
  # One control daemon for the device, as the agent runs it; the slice's
  # limit is the client's pinned-memory env, as the agent's CDI spec and
  # the webhook set it.
  export CUDA_MPS_PIPE_DIRECTORY=$work/mps/pipe CUDA_MPS_LOG_DIRECTORY=$work/mps/log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  CUDA_VISIBLE_DEVICES=$cap_dev nvidia-cuda-mps-control -d
  cap mps "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=${cap_mib}M" || failed=1
  echo quit | nvidia-cuda-mps-control || true
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
else
  echo "-- mps: nvidia-cuda-mps-control not found, skipped"
fi
libvgpu=${LIBVGPU:-}
if [[ -z $libvgpu ]]; then
  for f in /var/lib/partita/interposer/libvgpu.so /usr/local/vgpu/libvgpu.so; do
    [[ -f $f ]] && { libvgpu=$f; break; }
  done
fi
if [[ -n $libvgpu ]]; then
  # The agent preloads it through /etc/ld.so.preload; LD_PRELOAD loads it
  # the same way for one process. HAMi-core keeps its shared accounting
  # in CUDA_DEVICE_MEMORY_SHARED_CACHE.
  cap hami-core "LD_PRELOAD=$libvgpu" "CUDA_DEVICE_MEMORY_LIMIT=${cap_mib}M" \
    "CUDA_DEVICE_MEMORY_SHARED_CACHE=$work/hami-core.cache" || failed=1
else
  echo "-- hami-core: no libvgpu.so (set LIBVGPU), skipped"
fi
(( failed == 0 )) || { echo "check: a cap is wrong" >&2; exit 1; }
echo "check: OK"
