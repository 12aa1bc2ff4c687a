# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The agent's drain rule (repair.drain.drain_decision): a node that cannot run jobs drains at once (and says how
it stands against the limits and the breaker); a warning never drains from the agent: the repair run decides it."""
from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.gpufleet.reliability.plugins.module_utils.health.report import Finding, Report
from ansible_collections.gpufleet.reliability.plugins.module_utils.repair import RepairConfig
from ansible_collections.gpufleet.reliability.plugins.module_utils.repair.drain import cannot_run_jobs, drain_decision
from ansible_collections.gpufleet.reliability.plugins.module_utils.repair.model import RepairError
from ansible_collections.gpufleet.reliability.plugins.module_utils.slurm import Node, SlurmError
from ansible_collections.gpufleet.reliability.plugins.module_utils.slurm.repair_inputs import drain_inputs

NOW = 1_800_000_000.0
WARN = Report([Finding("xid", "critical", "GPU has fallen off the bus", "reboot", "xid79", 3)])
LOST = Report([Finding("gpu_lost", "critical", "GPU is lost", "reboot", "gpu_lost", 3)])
BRAKE = Report([Finding("clocks", "warning", "hot", "monitor", "temp_high", 1),
                Finding("clocks", "warning", "power brake on every GPU", "monitor", "node_power_brake", drain=True)])
HEALTHY = Report([])
LIMITS = {"blast_radius": {"max_unavailable": "20%"}}


def node(name, state="idle", flags=(), reason="", t=None, parts=("gpu",), features=()):
    return {"name": name, "state": state, "flags": list(flags), "reason": reason, "reason_time": t,
            "partitions": list(parts), "features": list(features)}


def decide(report, name, nodes, cfg, now, **kw):
    """As the agent calls the rule: Slurm's nodes (here dicts, as Node records) through the adapter's
    ``drain_inputs``, the config file's mapping through ``RepairConfig.from_dict`` (None: no limits)."""
    recs = []
    for d in nodes:
        base, *more = d["state"].split("+")
        recs.append(Node(d["name"], base.lower(), frozenset(list(d["flags"]) + more), d["reason"],
                         reason_time=d["reason_time"], partitions=list(d["partitions"]),
                         features=list(d["features"])))
    inputs = drain_inputs(recs, name)
    config = None if cfg is None else RepairConfig.from_dict(cfg)
    return drain_decision(report, inputs.me, inputs.fleet, inputs.before, config, now, **kw)


def drained(name, reason="gpufleet: xid79 gpu3", t=NOW - 10, **kw):
    return node(name, flags=("DRAIN",), reason=reason, t=t, **kw)


def fleet(n, drained_names=(), **kw):
    return [drained(f"n{i:02d}", **kw) if f"n{i:02d}" in drained_names else node(f"n{i:02d}") for i in range(1, n + 1)]


def test_healthy_report_drains_nothing():
    assert decide(HEALTHY, "n01", fleet(4), {}, NOW).action == "none"


def test_cannot_run_jobs_is_the_live_probe_only():
    assert cannot_run_jobs(LOST)
    assert not cannot_run_jobs(WARN)  # an Xid 79 line whose GPU still answers the probe
    missing = {"verdict": "unhealthy",
               "findings": [{"check": "gpu_count", "severity": "critical", "code": "gpu_missing"}]}
    assert cannot_run_jobs(missing)
    drift = {"verdict": "degraded",
             "findings": [{"check": "gpu_count", "severity": "warning", "code": "gpu_count_mismatch"}]}
    assert not cannot_run_jobs(drift)


@pytest.mark.parametrize("report", [WARN, LOST], ids=["warning", "cannot run jobs"])
@pytest.mark.parametrize("me", [node("n01", flags=("MAINTENANCE",)), node("n01", state="IDLE+MAINTENANCE"),
                                node("n01", flags=("DRAIN", "MAINT"), reason="gpufleet: xid79 gpu3", t=NOW - 10)])
def test_a_node_in_a_maintenance_window_is_left_alone(report, me):
    nodes = [me] + fleet(16)[1:]
    d = decide(report, "n01", nodes, LIMITS, NOW)
    assert (d.action, d.rule) == ("left_alone", "not_ours") and "maintenance reservation" in d.detail, d


@pytest.mark.parametrize("nodes", [
    fleet(16),  # within the limits
    fleet(16, ("n01", "n02", "n03")),  # past max_unavailable
    fleet(16, ("n01", "n02", "n03"), reason="ops: cable"),  # someone else's drains
    fleet(16, [f"n{i:02d}" for i in range(1, 8)]),  # the breaker would trip
    fleet(4, ("n01", "n02", "n03"), t=NOW - 3600),  # the last available node
], ids=["within", "past_max_unavailable", "theirs", "breaker", "last_node"])
@pytest.mark.parametrize("report", [WARN, BRAKE], ids=["unhealthy", "drain_request"])
def test_a_warning_is_the_repair_runs_to_drain(nodes, report):
    me = next(n["name"] for n in reversed(nodes) if not n["flags"])
    d = decide(report, me, nodes, {"blast_radius": {"max_unavailable": "100%", "min_healthy": 0}}, NOW)
    assert (d.action, d.forced, d.rule, d.breaker) == ("defer", False, "one_writer", None), d
    assert d.reason == report.drain_reason()[:200] and "repair run" in d.detail
    # the agent needs only its own node to decide a warning
    assert decide(report, me, [x for x in nodes if x["name"] == me], LIMITS, NOW) == \
        decide(report, me, nodes, LIMITS, NOW)


def test_node_that_cannot_run_jobs_drains_past_the_limits_and_says_so():
    d = decide(LOST, "n05", fleet(16, ("n01", "n02", "n03")), LIMITS, NOW)
    assert (d.action, d.forced, d.reason, d.rule) == ("drain", True, "gpufleet: gpu_lost gpu3", "cannot_run_jobs")
    assert "counts against the limits" in d.detail and "limit 3" in d.detail, d.detail
    within = decide(LOST, "n05", fleet(16), LIMITS, NOW)
    assert within.action == "drain" and "counts against" not in within.detail, within


def test_the_last_available_node_of_a_partition_drains_when_it_cannot_run_jobs():
    cfg = {"blast_radius": {"max_unavailable": "100%", "min_healthy": 0}}
    nodes = [drained("a1", parts=("small",), t=NOW - 3600), node("a2", parts=("small", "big"))] + [
        node(f"b{i}", parts=("big",)) for i in range(8)]
    d = decide(LOST, "a2", nodes, cfg, NOW)
    assert d.action == "drain" and "no available node left" in d.detail, d.detail


def test_a_drain_that_trips_the_breaker_says_so():
    cfg = {"blast_radius": {"max_unavailable": "100%", "min_healthy": 0}}
    nodes = fleet(16, [f"n{i:02d}" for i in range(1, 8)])  # 7 of ours in the last 10 s; threshold 8 of 16
    d = decide(LOST, "n10", nodes, cfg, NOW)
    assert d.action == "drain" and d.forced
    assert d.breaker.startswith("circuit breaker tripped: 8 nodes drained by gpufleet within 300s (threshold 8 of 16)")
    assert decide(LOST, "n10", fleet(16, [f"n{i:02d}" for i in range(1, 7)]), cfg, NOW).breaker is None
    # drains older than the window, someone else's and hot spares do not count
    for others in (dict(t=NOW - 301), dict(reason="ops: rack move"), dict(reason="gpufleet: spare")):
        nodes = fleet(16, [f"n{i:02d}" for i in range(1, 8)], **others)
        assert decide(LOST, "n10", nodes, cfg, NOW).breaker is None, others
    off = dict(cfg, breaker={"enabled": False})
    assert decide(LOST, "n10", fleet(16, [f"n{i:02d}" for i in range(1, 8)]), off, NOW).breaker is None


def test_ownership():
    nodes = fleet(4, ("n01",))
    assert decide(WARN, "n01", nodes, {}, NOW).action == "already_drained"
    assert decide(LOST, "n01", nodes, {}, NOW).action == "already_drained"
    nodes = fleet(4, ("n01",), reason="ops: cable")
    assert decide(LOST, "n01", nodes, {}, NOW).action == "left_alone"
    assert decide(WARN, "n01", nodes, {}, NOW).action == "left_alone"
    down = [node("n01", state="down", reason="Not responding")] + fleet(4)[1:]
    assert decide(LOST, "n01", down, {}, NOW).action == "left_alone"


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=2, max_value=24), st.integers(min_value=0, max_value=2**32 - 1),
       st.sampled_from(["20%", 1, 3, "100%"]))
def test_a_storm_of_concurrent_agents_takes_out_only_nodes_that_cannot_run_jobs(n, seed, max_unavailable):
    """Every sick node's agent decides from the same reading of Slurm, at once (the storm of case 9): the nodes
    drained are exactly those that cannot run jobs; no node that still runs jobs leaves service, even for a
    moment, whatever the limits say."""
    rnd = random.Random(seed)
    cfg = {"blast_radius": {"max_unavailable": max_unavailable, "min_healthy": rnd.choice([0, 0.51])}}
    nodes0 = [node(f"n{i:02d}") for i in range(n)]
    for x in rnd.sample(nodes0, rnd.randint(0, n // 4)):
        x.update(flags=["DRAIN"], reason=rnd.choice(["ops: cable", "gpufleet: ecc_dbe gpu1"]),
                 reason_time=NOW - rnd.choice([30, 3000]))
    sick = {x["name"]: rnd.choice([WARN, BRAKE, LOST]) for x in nodes0 if not x["flags"] and rnd.random() < 0.7}
    acts = {name: decide(rep, name, nodes0, cfg, NOW + rnd.randint(0, 2)).action for name, rep in sick.items()}
    assert {name for name, a in acts.items() if a == "drain"} == {name for name, r in sick.items() if r is LOST}
    assert {a for name, a in acts.items() if sick[name] is not LOST} <= {"defer"}


def test_bad_input_names_the_field():
    with pytest.raises(SlurmError, match="not among the Slurm nodes"):
        decide(WARN, "nx", fleet(2), {}, NOW)
    with pytest.raises(RepairError, match="report.findings"):
        decide({"verdict": "unhealthy", "findings": "x"}, "n01", fleet(2), {}, NOW, reason="gpufleet: x")
    with pytest.raises(RepairError, match="reason"):
        decide(WARN.to_dict(), "n01", fleet(2), {}, NOW)
    d = decide(WARN.to_dict(), "n01", fleet(8), {}, NOW, reason="gpufleet: xid79 gpu3")
    assert d == decide(WARN, "n01", fleet(8), {}, NOW)
    with pytest.raises(RepairError, match="blast_radius.max_unavailable"):
        decide(WARN, "n01", fleet(2), {"blast_radius": {"max_unavailable": "lots"}}, NOW)
    with pytest.raises(RepairError, match="now"):
        decide(WARN, "n01", fleet(2), {}, "soon")
    with pytest.raises(RepairError, match="report"):
        decide(None, "n01", fleet(2), {}, NOW)


def test_without_limits_every_drain_request_drains_under_the_ownership_rule():
    for report in (WARN, BRAKE, LOST):
        d = decide(report, "n04", fleet(4, ("n01", "n02", "n03")), None, NOW)
        assert (d.action, d.rule, d.reason) == ("drain", "no_limits", report.drain_reason()[:200]), d
    assert decide(HEALTHY, "n04", fleet(4), None, NOW).action == "none"
    assert decide(WARN, "n01", fleet(4, ("n01",)), None, NOW).action == "already_drained"
    assert decide(WARN, "n01", fleet(4, ("n01",), reason="ops: cable"), None, NOW).action == "left_alone"


def test_a_tripped_breaker_says_when_to_check_again():
    cfg = {"blast_radius": {"max_unavailable": "100%", "min_healthy": 0}}  # breaker: 8 of 16 within 300 s
    nodes = fleet(16, [f"n{i:02d}" for i in range(1, 8)])
    for i, x in enumerate(nodes[:7]):
        x["reason_time"] = NOW - 200 + 10 * i  # the oldest counted drain at NOW - 200
    d = decide(LOST, "n10", nodes, cfg, NOW)
    assert d.breaker and d.check_at == NOW - 200 + 300  # the oldest leaves the window: 7 < 8, clear
    assert decide(LOST, "n10", fleet(16, [f"n{i:02d}" for i in range(1, 7)]), cfg, NOW).check_at is None
    nodes = fleet(16, [f"n{i:02d}" for i in range(1, 10)])  # 9 + ours = 10: three must leave for 7 < 8
    for i, x in enumerate(nodes[:9]):
        x["reason_time"] = NOW - 250 + 10 * i
    assert decide(LOST, "n12", nodes, cfg, NOW).check_at == NOW - 230 + 300
    assert decide(WARN, "n12", nodes, cfg, NOW).check_at is None  # deferred: the repair run decides


def test_the_rule_takes_typed_inputs_only():
    inputs = drain_inputs([Node("n01", "idle", partitions=["gpu"])], "n01")
    with pytest.raises(RepairError, match="config: expected a RepairConfig or None"):
        drain_decision(WARN, inputs.me, inputs.fleet, inputs.before, {"breaker": {}}, NOW)
    with pytest.raises(RepairError, match="expected a NodeState and a FleetSummary"):
        drain_decision(WARN, {"name": "n01"}, inputs.fleet, inputs.before, None, NOW)
