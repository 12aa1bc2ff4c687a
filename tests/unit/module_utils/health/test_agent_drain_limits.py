# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The agent's --slurm with --repair-config: drain, wait until earlier drains are visible, decide again, and take
back only our own warning drain. The Slurm lab test (tests/integration/health/test_storm_lab.py) runs the same on
16 real slurmd; here a small in-memory cluster plays other agents draining in the same second."""
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


class Clock:
    def __init__(self):
        self.t = T - 0.3
        self.slept = []

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.slept.append(s)
        self.t += s


def act(report, name, cluster, limits=None):
    limits = LIMITS if limits is None else limits
    clock = Clock()
    res = agent.slurm_act(report, name, client=cluster, limits=limits, settle=2.0, sleep=clock.sleep, clock=clock)
    return res, clock


def test_warning_within_limits_drains_after_looking_again():
    c = Cluster(16)
    res, clock = act(WARN, "n05", c)
    assert res["action"] == "drained" and res["rule"] == "limits" and not res["forced"]
    assert clock.slept == [T + 3 - (T - 0.3)]  # until the second after our drain (+ settle) has passed
    assert c.calls == ["nodes", ("drain", ["n05"]), "nodes"]


def test_warning_past_the_limit_is_held_without_touching_slurm():
    c = Cluster(16)
    for name in ("n01", "n02", "n03"):
        c.set(name, "gpufleet: xid79 gpu3", T - 60)
    res, _clock = act(WARN, "n05", c)
    assert res["action"] == "held" and "limit 3" in res["detail"], res
    assert c.calls == ["nodes"]


def test_concurrent_drains_in_the_same_second_yield_to_smaller_names():
    def others(cluster):  # three other agents drained in the same second
        for name in ("n01", "n02", "n03"):
            if not cluster.nodes_[name].reason:
                cluster.set(name, "gpufleet: xid79 gpu3", T)

    c = Cluster(16, on_drain=others)
    res, _clock = act(WARN, "n05", c)
    assert res["action"] == "yielded" and "limit 3" in res["detail"], res
    assert ("resume", ["n05"]) in c.calls and c.nodes_["n05"].reason == ""
    # the first of them keeps its drain
    c2 = Cluster(16, on_drain=others)
    res, _clock = act(WARN, "n01", c2)
    assert res["action"] == "drained"


def test_our_drain_replaced_by_an_operator_is_never_taken_back():
    def operator(cluster):
        for name in ("n01", "n02", "n03"):
            cluster.set(name, "gpufleet: xid79 gpu3", T)
        cluster.set("n05", "ops: cable", T)

    c = Cluster(16, on_drain=operator)
    res, _clock = act(WARN, "n05", c)
    assert res["action"] == "left_alone" and c.nodes_["n05"].reason == "ops: cable"
    assert not any(call[0] == "resume" for call in c.calls if isinstance(call, tuple))


def test_node_that_cannot_run_jobs_drains_past_the_limit_and_the_breaker_shouts(capsys):
    c = Cluster(16)
    for i in range(1, 8):
        c.set(f"n{i:02d}", "gpufleet: gpu_lost gpu3", T - 5)
    res, _clock = act(LOST, "n10", c)
    assert res["action"] == "drained" and res["forced"] and "counts against the limits" in res["detail"]
    assert res["breaker"].startswith("circuit breaker tripped: 8 nodes drained by gpufleet within 300s")


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
