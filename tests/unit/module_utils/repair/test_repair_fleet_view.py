"""repair.fleet_view: what a one-node plan() reads of the fleet counts (the simulator keys its plan cache on it).

The table checks each part of the view against the rule it stands for; the sweep checks the claim itself: every
two fleets with the same view give the same one-node plan, over a grid of counts and a set of nodes that reach the
drain, repair, spare and breaker checks, and fleets with different views do not all plan alike.
"""

from __future__ import annotations

import itertools

import pytest
from repair_builders import HEALTHY, NOW, H, hist, in_service, node

from ansible_collections.gpufleet.reliability.plugins.module_utils.repair import (
    RepairConfig,
    breaker_threshold,
    fleet_view,
    plan,
)


def counts(total=8, unavailable=1, spares=0, rack=None, fleet_total=None):
    """A fleet as the simulator hands it over: one partition, the node's rack only, spares as a count or names."""
    f = {"total": total if fleet_total is None else fleet_total,
         "partitions": {"gpu": {"total": total, "available": total - unavailable, "unavailable": unavailable,
                                "spares_idle": spares}}}
    if rack is not None:
        rt, ru = rack
        f["domains"] = {"rack": {"r1": {"total": rt, "available": rt - ru, "unavailable": ru}}}
    return f


def config(**blast):
    br = {"max_unavailable": 2, "min_healthy": "50%"}
    br.update(blast)
    return RepairConfig.from_dict({"blast_radius": br, "breaker": {"min_nodes": 1, "fraction": "20%"}})


READY = node("n1", rack="r1", reason_time=NOW - H)  # drained by us: next is a repair step
FRESH = in_service("n1", history=hist(t0=NOW - H))  # in service with a finding: next is a drain

VIEW_ROWS = [
    # (name, fleet, node, config, expected view: breaker threshold, drain ok, repair ok, repair ok own step
    #  counted, spare)
    ("room everywhere", counts(unavailable=0), FRESH, config(), (2, True, True, True, None)),
    ("drain would pass max_unavailable", counts(unavailable=2), FRESH, config(), (2, False, True, True, None)),
    ("below min_healthy: nothing starts", counts(unavailable=5), READY, config(max_unavailable=8),
     (2, False, False, False, None)),
    ("own step counted against a limit of one", counts(unavailable=1), READY, config(max_unavailable=1),
     (2, False, True, False, None)),
    ("a limit of none blocks every repair", counts(unavailable=0), READY, config(max_unavailable=0),
     (2, False, False, False, None)),
    ("a share never rounds below one", counts(total=3, unavailable=0), READY,
     config(max_unavailable="10%", min_healthy=0), (1, True, True, False, None)),
    ("the last available node is never drained", counts(total=2, unavailable=1), FRESH,
     config(max_unavailable=2, min_healthy=0), (1, False, True, True, None)),
    ("rack limit blocks the drain", counts(unavailable=0, rack=(4, 1)), FRESH, config(domains={"rack": 1}),
     (2, False, True, False, None)),
    ("a rack without a limit is not read", counts(unavailable=0, rack=(4, 4)), FRESH, config(),
     (2, True, True, True, None)),
    ("a spare counted", counts(spares=2), READY, config(), (2, True, True, True, (None, "gpu"))),
    ("the first spare by name", counts(spares=["s9", "s2"]), READY, config(), (2, True, True, True, ("s2", "gpu"))),
    ("breaker threshold from the fleet total", counts(fleet_total=40), READY, config(),
     (8, True, True, True, None)),
]


@pytest.mark.parametrize("name,fl,n,cfg,expect", VIEW_ROWS, ids=[r[0] for r in VIEW_ROWS])
def test_fleet_view(name, fl, n, cfg, expect):
    assert fleet_view(fl, n, cfg) == expect


@pytest.mark.parametrize("total,min_nodes,fraction,expect", [
    (10, 3, 0.5, 5), (4, 3, 0.5, 3), (1, 1, 0.5, 1), (100, 1, 0.2, 20), (0, 2, 0.5, 2), (7, 1, 0.5, 4),
])
def test_breaker_threshold(total, min_nodes, fraction, expect):
    cfg = RepairConfig.from_dict({"breaker": {"min_nodes": min_nodes, "fraction": fraction}})
    assert breaker_threshold(cfg, total) == expect


def _decision(fl, n, cfg):
    d = plan(fl, [n], cfg, NOW)[0]
    spare = d.spare.spare if d.spare is not None else "-"
    return d.action, d.rule, d.earliest, d.history, d.history_after, d.runnable, spare


SWEEP_NODES = [
    READY,
    FRESH,
    node("n1", rack="r1", reason_time=NOW - H,
         history=hist(steps=[("reset_gpu", NOW - 2 * H, "failed"), ("reboot", NOW - H, "failed")])),  # -> replace
    node("n1", rack="r1", reason_time=NOW - H, rep=HEALTHY, history=hist(steps=[("reboot", NOW - H, None)])),
    node("n1", rack="r1", reason_time=NOW - 60, history=None),  # new incident: the breaker counts it
    # a reboot whose intent was written but that never ran (no flag, booted before it): retracted, yet counted
    dict(node("n1", rack="r1", reason_time=NOW - H, history=hist(steps=[("reboot", NOW - H, None)])),
         boot_time=NOW - 2 * H),
]


@pytest.mark.parametrize("blast", [{}, {"max_unavailable": 1}, {"max_unavailable": "25%", "min_healthy": 0},
                                   {"domains": {"rack": 1}}, {"max_unavailable": 0}])
def test_same_view_same_plan(blast):
    cfg = config(**blast)
    views = {}
    for total, unavailable, spares, rack_u, fleet_total in itertools.product(
        (2, 8), range(0, 5), (0, 1, ["s1"]), (None, 0, 1, 2), (4, 8, 40)
    ):
        if unavailable > total:
            continue
        fl = counts(total, unavailable, spares, None if rack_u is None else (4, rack_u), fleet_total)
        for i, n in enumerate(SWEEP_NODES):
            got = _decision(fl, n, cfg)
            key = (i, fleet_view(fl, n, cfg))
            assert views.setdefault(key, got) == got, (blast, fl, i)
    # and the sweep is not vacuous: some node plans differently under different views, the breaker among them
    by_node = {}
    for (i, _view), got in views.items():
        by_node.setdefault(i, set()).add(got)
    assert any(len(s) > 1 for s in by_node.values())
    assert "breaker" in {got[1] for got in views.values()}
