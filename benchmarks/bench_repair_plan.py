"""Figures for the repair policy: time per plan against fleet size and against the number of sick nodes.

The fleet comes in as counts, so the time should follow the sick nodes, not the fleet. Two inputs: the dict
records with the history as its stored text (what the repair_plan module hands over today, validated and parsed
on every call) and the typed inputs (FleetSummary, NodeState with a History object: what the Slurm adapter and
the simulator build once). Every sick node has a history with an open incident (a reset that failed). Goal:
typed plan() <= 15 us per sick node. Prints a table; asserts nothing.
.venv/bin/python benchmarks/bench_repair_plan.py
"""

from __future__ import annotations

import time

from ansible_collections.gpufleet.reliability.plugins.module_utils.repair import RepairConfig, plan

try:  # the typed inputs (absent in releases before them: the dict column alone is printed)
    from ansible_collections.gpufleet.reliability.plugins.module_utils.repair import FleetSummary, NodeState
except ImportError:  # pragma: no cover - measuring an older tree side by side
    FleetSummary = NodeState = None

NOW = 1_800_000_000
REPORT = {"verdict": "unhealthy", "action": "reset_gpu", "code": "xid48", "gpu": 3,
          "findings": [{"check": "xid", "severity": "critical", "code": "xid48", "action": "reset_gpu", "gpu": 3}]}


def inputs(fleet_nodes, sick):
    racks = max(1, fleet_nodes // 32)
    fleet = {"total": fleet_nodes,
             "partitions": {"gpu": {"total": fleet_nodes, "available": fleet_nodes - sick, "unavailable": sick,
                                    "spares_idle": [f"spare{i}" for i in range(8)]}},
             "domains": {"rack": {f"r{i}": {"total": 32, "available": 32, "unavailable": 0} for i in range(racks)}}}
    # the summary is built once per run by repair/fleet.py (one pass over Slurm's node list); not timed here
    attention = [{"name": f"gpu{i:06d}", "partition": "gpu", "domains": {"rack": f"r{i % racks}"}, "report": REPORT,
                  "state": "IDLE", "flags": ["DRAIN"], "reason": "gpufleet: xid48 gpu3", "reason_time": NOW - 3600,
                  "report_time": NOW - 600, "history": HISTORY}
                 for i in range(sick)]
    return fleet, attention


# an open gpu_memory incident: a GPU reset that failed an hour ago, one earlier repair in the week
HISTORY = (f'{{"gf":1,"i":{{"c":"gm","g":3,"id":2,"k":"xid48","s":[["g",{NOW - 3600},"f"]],"t":{NOW - 4000}}},'
           f'"n":2,"p":"gl{NOW - 5 * 86400}","r":"b{NOW - 5 * 86400},g{NOW - 3600}"}}')


def timed(fleet_nodes, sick, config, typed=False, reps=20):
    fleet, attention = inputs(fleet_nodes, sick)
    if typed:
        fleet = FleetSummary.from_dict(fleet)
        attention = [NodeState.from_dict(a, i) for i, a in enumerate(attention)]
    best = None
    for _unused in range(3):
        t0 = time.perf_counter()
        for _unused2 in range(reps):
            plan(fleet, attention, config, NOW)
        t = (time.perf_counter() - t0) / reps
        best = t if best is None else min(best, t)
    return best


def main():
    config = RepairConfig.from_dict({"blast_radius": {"max_unavailable": "50%", "min_healthy": 0,
                                                      "domains": {"rack": 4}},
                                     "breaker": {"enabled": False}})
    print("least of 3 timings of 20 plans each; us per sick node = time per plan / sick nodes")
    print(f"{'fleet nodes':>12} {'sick':>6} {'dict: ms/plan':>14} {'us/sick node':>13} {'typed: ms/plan':>15} "
          f"{'us/sick node':>13}")
    for fleet_nodes in (64, 1_000, 12_500, 100_000):
        for sick in (1, 10, 50):
            t = timed(fleet_nodes, sick, config)
            row = f"{fleet_nodes:>12} {sick:>6} {t * 1e3:>14.3f} {t * 1e6 / sick:>13.1f}"
            if NodeState is not None:
                tt = timed(fleet_nodes, sick, config, typed=True)
                row += f" {tt * 1e3:>15.3f} {tt * 1e6 / sick:>13.1f}"
            print(row)


if __name__ == "__main__":
    main()
