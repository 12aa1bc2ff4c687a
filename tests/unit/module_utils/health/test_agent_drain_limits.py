# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The agent's --slurm with --repair-config: a node that cannot run jobs drains at once (one fleet read, one
drain); a warning is left to the repair run with one read of its own node and no write. The Slurm lab test
(tests/integration/health/test_storm_lab.py) runs the same on 16 real slurmd; here a small in-memory cluster."""
from __future__ import annotations

import json

from ansible_collections.gpufleet.reliability.plugins.module_utils.cli import health_agent as agent
from ansible_collections.gpufleet.reliability.plugins.module_utils.health.report import Finding, Report
from ansible_collections.gpufleet.reliability.plugins.module_utils.slurm import Node

T = 1_900_000_000
WARN = Report([Finding("xid", "critical", "GPU has fallen off the bus", "reboot", "xid79", 3)])
LOST = Report([Finding("gpu_lost", "critical", "GPU is lost", "reboot", "gpu_lost", 3)])
LIMITS = {"blast_radius": {"max_unavailable": "20%"}}


class Cluster:
    """Slurm as the agent sees it: nodes(), node(), drain(), resume(). ``on_drain`` lets other agents act."""

    def __init__(self, n, on_drain=None):
        self.nodes_ = {f"n{i:02d}": Node(f"n{i:02d}", partitions=["gpu"]) for i in range(1, n + 1)}
        self.calls = []
        self.on_drain = on_drain

    def set(self, name, reason, t):
        old = self.nodes_[name]
        self.nodes_[name] = Node(name, state=old.state, flags=frozenset({"DRAIN"}), reason=reason, reason_time=t,
                                 partitions=old.partitions)

    def nodes(self, names=None):
        self.calls.append("nodes")
        return dict(self.nodes_)

    def node(self, name):
        self.calls.append(("node", name))
        return self.nodes_[name]

    def drain(self, names, reason):
        self.calls.append(("drain", list(names)))
        for name in names:
            self.set(name, reason, T)
        if self.on_drain:
            self.on_drain(self)

    def resume(self, names):
        self.calls.append(("resume", list(names)))
        for name in names:
            old = self.nodes_[name]
            self.nodes_[name] = Node(name, partitions=old.partitions)


def act(report, name, cluster, limits=None):
    return agent.slurm_act(report, name, client=cluster, limits=LIMITS if limits is None else limits,
                           clock=lambda: T)


def test_a_warning_is_left_to_the_repair_run_with_one_read_and_no_write():
    for drained in ((), ("n01", "n02", "n03")):  # within the limits, and past them: the same answer
        c = Cluster(16)
        for name in drained:
            c.set(name, "gpufleet: xid79 gpu3", T - 60)
        res = act(WARN, "n05", c)
        assert (res["action"], res["rule"], res["forced"]) == ("defer", "one_writer", False), res
        assert res["reason"] == "gpufleet: xid79 gpu3" and "repair run" in res["detail"]
        assert c.calls == [("node", "n05")]


def test_a_warning_on_a_node_drained_by_us_or_by_someone_else_is_left_as_it_is():
    c = Cluster(4)
    c.set("n01", "gpufleet: xid79 gpu3", T - 60)
    c.set("n02", "ops: cable", T - 60)
    assert act(WARN, "n01", c)["action"] == "already_drained"
    assert act(WARN, "n02", c)["action"] == "left_alone"
    assert not [call for call in c.calls if call[0] in ("drain", "resume")]


def test_node_that_cannot_run_jobs_drains_past_the_limit_and_the_breaker_shouts(capsys):
    c = Cluster(16)
    for i in range(1, 8):
        c.set(f"n{i:02d}", "gpufleet: gpu_lost gpu3", T - 5)
    res = act(LOST, "n10", c)
    assert res["action"] == "drained" and res["forced"] and "counts against the limits" in res["detail"]
    assert res["breaker"].startswith("circuit breaker tripped: 8 nodes drained by gpufleet within 300s")
    assert c.calls == ["nodes", ("drain", ["n10"])]


def test_without_repair_config_the_old_rule_holds():
    c = Cluster(16)
    for name in ("n01", "n02", "n03"):
        c.set(name, "gpufleet: xid79 gpu3", T - 60)
    res = agent.slurm_act(WARN, "n05", client=c)
    assert res["action"] == "drained"


def test_bad_repair_config_exits_64_naming_the_field(capsys, tmp_path):
    cfg = tmp_path / "repair.json"
    cfg.write_text(json.dumps({"blast_radius": {"max_unavailable": "lots"}}))
    rc = agent.main(["check", "--fake-nvml", str(tmp_path / "none.json"), "--kmsg", "-", "--slurm",
                     "--repair-config", str(cfg)])
    err = capsys.readouterr().err
    assert rc == 64 and "--repair-config" in err and "blast_radius.max_unavailable" in err, err
