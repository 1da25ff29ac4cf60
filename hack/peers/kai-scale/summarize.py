#!/usr/bin/env python3
"""Prints a Markdown table of the scenarios in the result.json files given as arguments."""
import json, sys

print("| run | scenario | bound / pods | wall s | pods/s | p50 / p99 s (create) | p50 / p99 s (pod seen) | GPUs held | evicted | pending | CPU s (scheduler, binder, podgrouper, kube-apiserver) | API req/pod |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for path in sys.argv[1:]:
    r = json.load(open(path))
    for s in r["scenarios"]:
        cpu = s.get("cpuSeconds") or {}
        cpus = ", ".join(f"{cpu.get(k, '-')}" for k in ("scheduler", "binder", "podgrouper", "kube-apiserver"))
        done = "" if s.get("completed") else (" (timed out)" if s.get("timedOut") else " (" + s.get("error", "incomplete") + ")")
        print(f"| {r['nodes']}×{r['gpusPerNode']} | {s['name']} | {s['podsBound']} / {s['pods']}{done} | "
              f"{s['wallSeconds']} | {s['podsPerSecond']} | {s['p50Seconds']} / {s['p99Seconds']} | "
              f"{s['p50FromPodSeenSeconds']} / {s['p99FromPodSeenSeconds']} | {s.get('gpusHeldByQueue', '-')} | "
              f"{s.get('podsEvictedByQueue', '-')} | {s.get('podsPendingByQueue', '-')} | {cpus} | {s['apiRequestsPerPod']} |")
