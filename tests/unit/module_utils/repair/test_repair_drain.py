# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The agent's drain rule (repair.drain.drain_decision): drains for nodes that cannot run jobs go at once,
warnings go through the repair policy's limits and breaker, and concurrent agents end where one-at-a-time would."""
from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.gpufleet.reliability.plugins.module_utils.health.report import Finding, Report
from ansible_collections.gpufleet.reliability.plugins.module_utils.repair.drain import cannot_run_jobs, drain_decision
from ansible_collections.gpufleet.reliability.plugins.module_utils.repair.model import RepairError

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


def drained(name, reason="gpufleet: xid79 gpu3", t=NOW - 10, **kw):
    return node(name, flags=("DRAIN",), reason=reason, t=t, **kw)


def fleet(n, drained_names=(), **kw):
    return [drained(f"n{i:02d}", **kw) if f"n{i:02d}" in drained_names else node(f"n{i:02d}") for i in range(1, n + 1)]


def test_healthy_report_drains_nothing():
    assert drain_decision(HEALTHY, "n01", fleet(4), {}, NOW).action == "none"


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
    d = drain_decision(report, "n01", nodes, LIMITS, NOW)
    assert (d.action, d.rule) == ("left_alone", "not_ours") and "maintenance reservation" in d.detail, d


def test_warning_within_limits_drains():
    d = drain_decision(WARN, "n01", fleet(16), LIMITS, NOW)
    assert (d.action, d.forced, d.reason, d.rule) == ("drain", False, "gpufleet: xid79 gpu3", "limits")


def test_warning_past_max_unavailable_holds():
    d = drain_decision(WARN, "n05", fleet(16, ("n01", "n02", "n03")), LIMITS, NOW)
    assert d.action == "hold" and d.rule == "blast_radius"
    assert "4 nodes unavailable in partition gpu (limit 3)" in d.detail, d.detail


def test_nodes_drained_by_someone_else_count_too():
    nodes = fleet(16, ("n01", "n02", "n03"), reason="ops: cable")
    assert drain_decision(WARN, "n05", nodes, LIMITS, NOW).action == "hold"


def test_node_that_cannot_run_jobs_drains_past_the_limits_and_says_so():
    d = drain_decision(LOST, "n05", fleet(16, ("n01", "n02", "n03")), LIMITS, NOW)
    assert (d.action, d.forced, d.reason, d.rule) == ("drain", True, "gpufleet: gpu_lost gpu3", "cannot_run_jobs")
    assert "counts against the limits" in d.detail and "limit 3" in d.detail, d.detail


def test_last_available_node_of_a_partition_is_never_drained_for_a_warning():
    cfg = {"blast_radius": {"max_unavailable": "100%", "min_healthy": 0}}
    nodes = fleet(4, ("n01", "n02", "n03"), t=NOW - 3600)  # older than the breaker's window
    d = drain_decision(WARN, "n04", nodes, cfg, NOW)
    assert d.action == "hold" and "no available node left" in d.detail, d.detail
    # the same node in a second partition with room elsewhere: still held by the partition it would empty
    nodes = [drained("a1", parts=("small",), t=NOW - 3600), node("a2", parts=("small", "big"))] + [
        node(f"b{i}", parts=("big",)) for i in range(8)]
    assert drain_decision(WARN, "a2", nodes, cfg, NOW).action == "hold"
    # a node that cannot run jobs is drained even then
    assert drain_decision(LOST, "a2", nodes, cfg, NOW).action == "drain"


def test_breaker_stops_warnings_and_says_so():
    cfg = {"blast_radius": {"max_unavailable": "100%", "min_healthy": 0}}
    nodes = fleet(16, [f"n{i:02d}" for i in range(1, 8)])  # 7 of ours in the last 10 s; threshold 8 of 16
    d = drain_decision(WARN, "n10", nodes, cfg, NOW)
    assert d.action == "hold" and d.rule == "breaker"
    assert d.breaker.startswith("circuit breaker tripped: 8 nodes drained by gpufleet within 300s (threshold 8 of 16)")
    # a node that cannot run jobs is still drained, and carries the message
    lost = drain_decision(LOST, "n10", nodes, cfg, NOW)
    assert lost.action == "drain" and lost.breaker == d.breaker
    # drains older than the window, someone else's and hot spares do not trip it
    old = fleet(16, [f"n{i:02d}" for i in range(1, 8)], t=NOW - 301)
    assert drain_decision(WARN, "n10", old, cfg, NOW).action == "drain"
    theirs = fleet(16, [f"n{i:02d}" for i in range(1, 8)], reason="ops: rack move")
    assert drain_decision(WARN, "n10", theirs, cfg, NOW).action == "drain"
    spares = fleet(16, [f"n{i:02d}" for i in range(1, 8)], reason="gpufleet: spare")
    assert drain_decision(WARN, "n10", spares, cfg, NOW).action == "drain"
    off = dict(cfg, breaker={"enabled": False})
    assert drain_decision(WARN, "n10", nodes, off, NOW).action == "drain"


def test_drain_request_without_unhealthy_verdict_is_a_warning():
    d = drain_decision(BRAKE, "n01", fleet(16), LIMITS, NOW)
    assert d.action == "drain" and not d.forced and d.reason == "gpufleet: node_power_brake"
    assert drain_decision(BRAKE, "n05", fleet(16, ("n01", "n02", "n03")), LIMITS, NOW).action == "hold"


def test_ownership():
    nodes = fleet(4, ("n01",))
    assert drain_decision(WARN, "n01", nodes, {}, NOW).action == "already_drained"
    nodes = fleet(4, ("n01",), reason="ops: cable")
    assert drain_decision(LOST, "n01", nodes, {}, NOW).action == "left_alone"
    # after our drain, an operator re-drained with their reason: ours is not ours any more
    nodes = fleet(4, ("n01",), reason="ops: cable", t=NOW)
    assert drain_decision(WARN, "n01", nodes, {}, NOW, drained_at=NOW).action == "left_alone"


def test_recheck_counts_only_the_nodes_before_ours():
    # all 16 drained in the same second: the first three by name keep their drain, the others give it back
    nodes = fleet(16, [f"n{i:02d}" for i in range(1, 17)], t=NOW)
    kept = [n["name"] for n in nodes
            if drain_decision(WARN, n["name"], nodes, LIMITS, NOW + 2, drained_at=NOW).action == "drain"]
    assert kept == ["n01", "n02", "n03"]
    # an earlier second wins over a smaller name
    nodes[15]["reason_time"] = NOW - 1
    kept = [n["name"] for n in nodes
            if drain_decision(WARN, n["name"], nodes, LIMITS, NOW + 2, drained_at=n["reason_time"]).action == "drain"]
    assert kept == ["n01", "n02", "n16"]


def _sequential(order, sick, nodes0, cfg):
    """Agents one at a time, in (time, name) order, each seeing the drains kept before it."""
    state = {n["name"]: dict(n) for n in nodes0}
    for t, name in order:
        rep = sick[name]
        d = drain_decision(rep, name, list(state.values()), cfg, t)
        if d.action == "drain":
            state[name].update(flags=["DRAIN"], reason=d.reason, reason_time=t)
    return {n for n, s in state.items() if s["reason"].startswith("gpufleet:") and "DRAIN" in s["flags"]}


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=2, max_value=24), st.integers(min_value=0, max_value=2**32 - 1),
       st.sampled_from(["20%", 1, 3, "100%"]), st.booleans())
def test_concurrent_agents_never_drain_more_than_one_at_a_time(n, seed, max_unavailable, two_parts):
    """Every sick node drains at once (times in a few seconds), then decides again with drained_at: the drains
    kept are a subset of those of the agents acting one at a time in (reason_time, name) order (a warning that
    yields to one that itself yields tries again at its next check), every node that cannot run jobs keeps its
    drain, and the first warning in that order decides exactly as it would alone (progress)."""
    rnd = random.Random(seed)
    cfg = {"blast_radius": {"max_unavailable": max_unavailable, "min_healthy": rnd.choice([0, 0.51])}}
    nodes0 = []
    for i in range(n):
        parts = ("gpu", "small") if two_parts and i < 3 else ("gpu",)
        nodes0.append(node(f"n{i:02d}", parts=parts))
    for x in rnd.sample(nodes0, rnd.randint(0, n // 4)):
        x.update(flags=["DRAIN"], reason=rnd.choice(["ops: cable", "gpufleet: ecc_dbe gpu1"]),
                 reason_time=NOW - rnd.choice([30, 3000]))
    sick = {x["name"]: rnd.choice([WARN, WARN, LOST]) for x in nodes0 if not x["flags"] and rnd.random() < 0.7}
    times = {name: NOW + rnd.randint(0, 2) for name in sick}
    # everybody drains (the burst), then each decides again seeing all of it
    burst = [dict(x) for x in nodes0]
    for x in burst:
        if x["name"] in sick:
            x.update(flags=["DRAIN"], reason=sick[x["name"]].drain_reason(), reason_time=times[x["name"]])
    kept = {name for name in sick
            if drain_decision(sick[name], name, burst, cfg, times[name] + 2, drained_at=times[name]).action == "drain"}
    kept |= {x["name"] for x in nodes0 if x["reason"].startswith("gpufleet:")}
    order = sorted((t, name) for name, t in times.items())
    alone = _sequential(order, sick, nodes0, cfg)
    assert kept <= alone
    assert {name for name, rep in sick.items() if rep is LOST} <= kept
    warnings = [name for _t, name in order if sick[name] is WARN]
    if warnings:
        assert (warnings[0] in kept) == (warnings[0] in alone)


def test_bad_input_names_the_field():
    with pytest.raises(RepairError, match="not among the Slurm nodes"):
        drain_decision(WARN, "nx", fleet(2), {}, NOW)
    with pytest.raises(RepairError, match="report.findings"):
        drain_decision({"verdict": "unhealthy", "findings": "x"}, "n01", fleet(2), {}, NOW, reason="gpufleet: x")
    with pytest.raises(RepairError, match="reason"):
        drain_decision(WARN.to_dict(), "n01", fleet(2), {}, NOW)
    d = drain_decision(WARN.to_dict(), "n01", fleet(8), {}, NOW, reason="gpufleet: xid79 gpu3")
    assert d == drain_decision(WARN, "n01", fleet(8), {}, NOW)
    with pytest.raises(RepairError, match="blast_radius.max_unavailable"):
        drain_decision(WARN, "n01", fleet(2), {"blast_radius": {"max_unavailable": "lots"}}, NOW)
    with pytest.raises(RepairError, match="now"):
        drain_decision(WARN, "n01", fleet(2), {}, "soon")
    with pytest.raises(RepairError, match="report"):
        drain_decision(None, "n01", fleet(2), {}, NOW)
