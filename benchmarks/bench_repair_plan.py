"""Figures for the repair policy: time per plan against fleet size and against the number of sick nodes.

The fleet comes in as counts, so the time should follow the sick nodes, not the fleet. Prints a table; asserts
nothing.  .venv/bin/python benchmarks/bench_repair_plan.py
"""

from __future__ import annotations

import time

from ansible_collections.gpufleet.reliability.plugins.module_utils.repair import RepairConfig, plan

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
                  "state": "IDLE", "flags": ["DRAIN"], "reason": "gpufleet: xid48 gpu3", "reason_time": NOW - 3600}
                 for i in range(sick)]
    return fleet, attention


def timed(fleet_nodes, sick, config, reps=20):
    fleet, attention = inputs(fleet_nodes, sick)
    t0 = time.perf_counter()
    for _unused in range(reps):
        plan(fleet, attention, config, NOW)
    return (time.perf_counter() - t0) / reps


def main():
    config = RepairConfig.from_dict({"blast_radius": {"max_unavailable": "50%", "min_healthy": 0,
                                                      "domains": {"rack": 4}},
                                     "breaker": {"enabled": False}})
    print(f"{'fleet nodes':>12} {'sick':>6} {'ms/plan':>10} {'us/sick node':>13}")
    for fleet_nodes in (64, 1_000, 12_500, 100_000):
        for sick in (1, 10, 50):
            t = timed(fleet_nodes, sick, config)
            print(f"{fleet_nodes:>12} {sick:>6} {t * 1e3:>10.3f} {t * 1e6 / sick:>13.1f}")


if __name__ == "__main__":
    main()
