# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""repair.drain.drain_decision on a fleet kept as counts (the simulator: a FleetSummary built from counts, the
nodes out of service as NodeState) gives the answer of the same fleet read node by node through the Slurm
adapter (slurm.repair_inputs.drain_inputs), as the agent reads it."""
from __future__ import annotations

import pytest

from ansible_collections.gpufleet.reliability.plugins.module_utils.health.report import Finding, Report
from ansible_collections.gpufleet.reliability.plugins.module_utils.repair import RepairConfig
from ansible_collections.gpufleet.reliability.plugins.module_utils.repair.drain import drain_decision
from ansible_collections.gpufleet.reliability.plugins.module_utils.repair.state import Counts, FleetSummary, NodeState
from ansible_collections.gpufleet.reliability.plugins.module_utils.slurm import Node
from ansible_collections.gpufleet.reliability.plugins.module_utils.slurm.repair_inputs import drain_inputs

NOW = 1_800_000_000.0
WARN = Report([Finding("xid", "critical", "GPU has fallen off the bus", "reboot", "xid79", 3)])
LOST = Report([Finding("gpu_lost", "critical", "GPU is lost", "reboot", "gpu_lost", 3)])


def _node(name, out=False, reason="gpufleet: xid79 gpu3", t=NOW - 10, rack="r1"):
    return Node(name, "idle", frozenset({"DRAIN"}) if out else frozenset(), reason if out else "",
                reason_time=t if out else None, partitions=["gpu"], features=[f"rack_{rack}"])


@pytest.mark.parametrize("report", [WARN, LOST])
@pytest.mark.parametrize("n_out,cfg", [
    (0, {}),
    (3, {"blast_radius": {"max_unavailable": 3}, "breaker": {"enabled": False}}),  # blast radius holds a warning
    (2, {"breaker": {"fraction": "10%", "min_nodes": 3, "window": "5m"}}),  # the third drain trips the breaker
    (2, {"breaker": {"fraction": "10%", "min_nodes": 3, "window": "5s"}}),  # older than the window: no trip
])
def test_counts_give_the_node_by_node_answer(report, n_out, cfg):
    nodes = [_node(f"n{i:02d}", out=i <= n_out) for i in range(1, 21)]
    me = "n20"
    config = RepairConfig.from_dict(cfg)
    read = drain_inputs(nodes, me)
    full = drain_decision(report, read.me, read.fleet, read.before, config, NOW)
    fleet = FleetSummary(20, {"gpu": Counts(20, 20 - n_out, n_out)}, {"rack": {"r1": Counts(20, 20 - n_out, n_out)}})
    before = [NodeState(n.name, ("gpu",), {"rack": "r1"}, state="idle", flags=frozenset({"DRAIN"}), reason=n.reason,
                        reason_time=float(n.reason_time)) for n in nodes if n.flags]
    got = drain_decision(report, NodeState(me, ("gpu",), {"rack": "r1"}, state="allocated"), fleet, before, config,
                         NOW, reason=report.drain_reason()[:200])
    assert got == full
    if report is WARN:
        assert (got.action, got.rule, got.breaker) == ("defer", "one_writer", None)
    else:
        assert got.action == "drain" and ("limit 3" in got.detail) == (n_out == 3)
        assert (got.breaker is not None) == (cfg.get("breaker", {}).get("window") == "5m")
