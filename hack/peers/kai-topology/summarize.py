#!/usr/bin/env python3
"""Prints a Markdown table of the result.json files given as arguments."""
import json, sys

print("| run | prio | seed | gangs in one rack / placed / total | racks per placed gang | free GPUs | stranded (waiting gang) | stranded (8-GPU gang) | oracle best-fit | evicted fillers / gang pods | fill | gangs settle |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for path in sys.argv[1:]:
    r = json.load(open(path))
    racks = [len(g.get("racks") or []) for g in r["gangs"] if g["placed"]]
    print(f"| {path.split('/')[-2]} | {r.get('priorityClass','train')} | {r['seed']} | "
          f"{r['gangsPlacedInsideOneRack']} / {r['gangsPlaced']} / {r['gangsTotal']} | "
          f"{','.join(map(str, racks)) or '-'} | {r['freeGPUsAfter']} | {r['strandedGPUs']} | "
          f"{r['strandedForSmallestGang']} | {r['oracleGreedyRackFitGangs']} | "
          f"{r['fillersEvictedByScheduler']} / {r.get('gangPodsEvictedByScheduler', '-')} | {r['fillWall']} | {r['gangWall']} |")
