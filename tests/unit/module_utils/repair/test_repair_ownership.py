"""The one ownership rule (slurmfacts.py) and one bad node not stopping the others (issue: repair safety).

A node whose current reason is not ours is never drained over, rebooted, reset, replaced or resumed by us, whatever
our history says; our open incident on it is closed with a note. A node whose history or report cannot be used is
held by itself, with a reason naming the problem, and every other node is planned as usual."""

from __future__ import annotations

import json

import pytest
from repair_builders import HEALTHY, NOW, H, fleet, hist, in_service, node, report

from ansible_collections.gpufleet.reliability.plugins.module_utils.repair import RepairConfig, loads, plan
from ansible_collections.gpufleet.reliability.plugins.module_utils.repair.history import HistoryError, loads_ours
from ansible_collections.gpufleet.reliability.plugins.module_utils.slurmfacts import foreign_reason, out_of_service

F = "failed"
CFG = {"blast_radius": {"max_unavailable": 4, "min_healthy": "25%"}, "budget": {"attempts": 9}}


def decide(*nodes, config=None, fl=None, now=NOW, **kw):
    p = plan(fl or fleet(), list(nodes), RepairConfig.from_dict(config or CFG), now, **kw)
    return {d.node: d for d in p}


# ---- the rule itself --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("state,flags,reason,foreign", [
    ("idle", ["DRAIN"], "gpufleet: xid79 gpu3", False),
    ("down", [], "gpufleet: reboot xid79 (incident 1) : reboot issued : reboot complete", False),
    ("idle", ["DRAIN"], "ops: cable", True),
    ("DOWN*", [], "Not responding", True),
    ("idle", ["DRAIN", "REBOOT_ISSUED"], "ops: cable", True),
    ("drained", [], "maintenance", True),
    ("mixed", ["FAIL"], "", True),
    ("idle", [], "ops: cable", False),  # in service: a leftover reason (24.11 keeps it after RESUME) means nothing
    ("allocated", [], "", False),
])
def test_foreign_reason(state, flags, reason, foreign):
    assert (foreign_reason(state, flags, reason, "gpufleet:") is not None) == foreign
    assert out_of_service(state, flags) == (foreign or reason.startswith("gpufleet:"))


@pytest.mark.parametrize("state,flags,reason", [
    ("idle", ["MAINTENANCE"], ""),                        # in service, in the window
    ("IDLE+MAINTENANCE", [], ""),                          # scontrol's spelling of the same
    ("idle", ["DRAIN", "MAINTENANCE"], "gpufleet: xid48 gpu3"),  # drained by us, then the window began
    ("down", ["MAINT"], "gpufleet: reboot xid79 (incident 1) : reboot issued"),
])
def test_a_maintenance_reservation_is_the_operators(state, flags, reason):
    why = foreign_reason(state, flags, reason, "gpufleet:")
    assert why is not None and "maintenance reservation" in why


def test_a_sick_node_in_a_maintenance_window_is_held_and_never_repaired():
    for n in (node(flags=("DRAIN", "MAINTENANCE")), node(state="IDLE+MAINTENANCE", flags=()),
              node(rep=HEALTHY, flags=("DRAIN", "MAINTENANCE"), history=hist())):
        d = decide(n)["node2"]
        assert (d.action, d.rule) == ("hold", "not_ours") and not d.runnable, (d.action, d.rule, d.reason)
        assert d.slurm_reason is None and d.hook is None and d.spare is None


def test_empty_prefix_is_refused():
    with pytest.raises(ValueError, match="reason_prefix"):
        foreign_reason("idle", ["DRAIN"], "x", "")


# ---- issue §1: after a crashed run, an operator's drain wins over our pending reboot --------------------------
PENDING_REBOOT = hist(cls="gpu_lost", code="xid79", steps=[("reboot", NOW - 60, None)])


@pytest.mark.parametrize("flags,state", [
    (("DRAIN",), "IDLE"),                       # the run died before Slurm took the reboot
    (("DRAIN", "REBOOT_ISSUED"), "DOWN"),      # Slurm took it; the operator drained while it reboots
    (("DRAIN",), "DOWN"),                       # rebooted, came back DOWN, operator drained
])
@pytest.mark.parametrize("rep", [report(code="xid79", action="reboot"), HEALTHY], ids=["sick", "healthy"])
def test_operator_drain_over_a_pending_reboot_is_never_touched(flags, state, rep):
    n = dict(node(rep=rep, state=state, flags=flags, reason="ops: cable", history=PENDING_REBOOT,
                  report_time=NOW - 10), boot_time=NOW - 5000)
    d = decide(n)["node2"]
    assert (d.action, d.rule) == ("hold", "not_ours"), d.reason
    assert not d.runnable and d.history_after is None and d.hook is None and d.spare is None
    assert d.slurm_reason is None  # the operator's reason stays
    h = loads(d.history)
    assert h.incident is None and "closed" in h.note and "ops: cable" in h.note
    assert h.past and h.past[-1][1] == "gpu_lost"
    # the next run: nothing left to close, nothing written
    again = decide(dict(n, history=d.history))["node2"]
    assert (again.action, again.rule, again.history) == ("hold", "not_ours", None)


def test_operator_drain_during_a_pending_replace_files_no_rma():
    # issue §2: reboot failed, the plan would replace; the operator drained meanwhile -> no hook, no spare
    h = hist(cls="gpu_lost", code="xid79", steps=[("reboot", NOW - 900, F)])
    n = node(rep=report(code="xid79", action="reboot"), reason="ops: cable", history=h, report_time=NOW - 10)
    d = decide(n)["node2"]
    assert (d.action, d.rule, d.hook, d.spare) == ("hold", "not_ours", None, None)
    # the same node still drained by us does get the replacement: the rule is the only difference
    ours = decide(dict(n, reason="gpufleet: xid79 gpu3"))["node2"]
    assert ours.action == "replace" and ours.hook is not None


def test_closed_node_stops_counting_as_under_repair():
    # node2's pending reboot no longer counts against max_unavailable once someone else owns the node
    taken = node("node2", reason="ops: cable", history=PENDING_REBOOT)
    sick = node("node3", rep=report(code="xid48"), reason="gpufleet: xid48 gpu3", history=None,
                reason_time=NOW - 2 * H)
    out = decide(taken, sick, config=dict(CFG, blast_radius={"max_unavailable": 1, "min_healthy": 0}),
                 fl=fleet(total=8, unavailable=2))
    assert out["node3"].action == "reset_gpu", out["node3"].reason


def test_retracted_intent_does_not_block_its_own_node():
    # §7: the run died before Slurm took the reboot; with max_unavailable 1 the retried reboot must not be blocked by
    # the node's own retracted step
    n = dict(node(history=hist(steps=[("reset_gpu", NOW - 900, F), ("reboot", NOW - 60, None)])),
             boot_time=NOW - 5000)
    d = decide(n, config=dict(CFG, blast_radius={"max_unavailable": 1, "min_healthy": 0}))["node2"]
    assert (d.action, d.rule) == ("reboot", "ladder"), d.reason
    assert d.runnable


# ---- issue §5: one bad node does not stop all repairs ------------------------------------------------------------
BAD_HISTORIES = [
    ('{"gf":2}', "version"),
    ('{"gf":1,"r":"b12x"}', "malformed"),
    ('{"gf":1,"i":{"c":"zz","id":1,"t":1}}', "malformed"),
    ('{"gf":1,"i":{"c":"gl","g":3', "truncated"),
    ('{"cd":17962', "truncated"),
    ('{"gf":1,"nt":5}', "note"),
]


@pytest.mark.parametrize("text,word", BAD_HISTORIES)
def test_unreadable_history_holds_that_node_only(text, word):
    bad = node("node1", history=text)
    good = node("node2", reason_time=NOW - H)
    out = decide(bad, good)
    d = out["node1"]
    assert (d.action, d.rule) == ("hold", "history_unreadable"), d.reason
    assert word in d.reason and "history unreadable" in d.reason and "scontrol update NodeName=node1 Extra=" in d.reason
    assert d.history is None and d.history_after is None and not d.runnable
    assert d.slurm_reason.startswith("gpufleet: held") and "Extra=" in d.slurm_reason
    assert out["node2"].action == "reset_gpu" and out["node2"].runnable


def test_truncated_history_of_ours_is_not_called_foreign():
    with pytest.raises(HistoryError, match="truncated"):
        loads_ours('{"gf":1,"i":{"c":"gl","g":3')
    assert loads_ours("rack 12 slot 3") is None
    assert loads_ours('{"owner": "alice"}') is None


def test_unreadable_history_on_a_node_in_service_sets_no_reason():
    d = decide(in_service(history='{"gf":2}', report_time=NOW - 10))["node2"]
    assert (d.action, d.rule, d.slurm_reason) == ("hold", "history_unreadable", None)


def test_unreadable_history_on_someone_elses_node_is_still_theirs():
    d = decide(node(history='{"gf":2}', reason="ops: cable"))["node2"]
    assert (d.action, d.rule, d.slurm_reason, d.history) == ("hold", "not_ours", None, None)


@pytest.mark.parametrize("bad,field", [
    ({"report": {"verdict": "exploded"}}, "attention[node1].report.verdict"),
    ({"report": {"verdict": "unhealthy", "action": "explode"}}, "report.action"),
    # unhashable values from a hostile report: a clear error, never a TypeError
    ({"report": {"verdict": ["unhealthy"]}}, "report.verdict"),
    ({"report": {"verdict": "unhealthy", "action": ["reboot"]}}, "report.action"),
    ({"report": None, "report_error": "node1.json: Expecting ',' delimiter: line 1 column 40"}, "node1.json"),
])
def test_unusable_report_holds_that_node_only(bad, field):
    out = decide(dict(node("node1"), **bad), node("node2", reason_time=NOW - H))
    d = out["node1"]
    assert (d.action, d.rule) == ("hold", "bad_report"), d.reason
    assert field in d.reason and not d.runnable and d.slurm_reason.startswith("gpufleet: held")
    assert out["node2"].action == "reset_gpu"


def test_bad_nodes_do_not_trip_the_breaker():
    bads = [node(f"node{i}", history='{"gf":2}') for i in range(1, 5)]
    p = plan(fleet(total=8, unavailable=4), bads, RepairConfig.from_dict(dict(CFG, breaker={"min_nodes": 2})), NOW)
    assert not p.breaker.tripped


def test_breaker_hold_names_itself_in_slurm():
    p = plan(fleet(), [node()], RepairConfig.from_dict(CFG), NOW, breaker={"tripped": True, "reason": "4 nodes"})
    assert p[0].rule == "breaker" and p[0].slurm_reason == (
        "gpufleet: held (xid48): circuit breaker tripped, a person checks the fleet and resets it")


def test_note_round_trips_and_is_escaped():
    n = node(reason='ops: "cable" \\ ' + "x" * 300, history=PENDING_REBOOT)
    d = decide(n)["node2"]
    assert json.loads(d.history)["nt"] == loads(d.history).note
    assert len(loads(d.history).note) <= 120
    # a new incident drops the note
    fresh = decide(node(history=d.history, reason="gpufleet: xid48 gpu3"))["node2"]
    assert loads(fresh.history).note is None and loads(fresh.history).incident is not None


# ---- hostile history text (fuzz findings): always HistoryError, never another exception -------------------------
@pytest.mark.parametrize("text", [
    '{"gf":1,"n":Infinity}', '{"gf":1,"cd":1e999}', '{"gf":1,"i":{"c":"gm","id":Infinity,"t":0}}',
    '{"gf":1,"i":{"c":"gm","id":1,"t":NaN}}', '{"gf":1,"i":{"c":"nl","id":2,"s":[],"sp":{},"t":0}}',
    '{"gf":1,"i":{"c":"nl","id":2,"s":[],"k":["x"],"t":0}}', '{"gf":1,"i":{"c":"nl","id":2,"hk":5,"t":0}}',
    '{"gf":' + "[" * 5000 + "]" * 5000 + "}",
])
def test_hostile_history_is_a_history_error(text):
    with pytest.raises(HistoryError):
        loads(text)
    d = decide(node(history=text))["node2"]
    assert d.rule == "history_unreadable" and d.history is None


def test_hook_key_differs_when_a_lost_history_restarts_incident_numbers():
    # slurmctld clean start (or a cleared Extra): the next incident is number 1 again; its replacement must not
    # reuse the key of the old incident 1 (node_replace would answer "already requested" and file nothing)
    cfg = dict(CFG, ladders={"gpu_lost": ["replace"]})
    rep = report(code="xid79", action="reboot")
    first = decide(node(rep=rep, history=hist(cls="gpu_lost", code="xid79", t0=NOW - 3 * H)), config=cfg)["node2"]
    again = decide(node(rep=rep, history=hist(cls="gpu_lost", code="xid79", t0=NOW - 3 * H)), config=cfg)["node2"]
    later = decide(node(rep=rep, history=hist(cls="gpu_lost", code="xid79", t0=NOW - H)), config=cfg)["node2"]
    assert first.action == later.action == "replace" and first.incident == later.incident == "1"
    assert first.hook.idempotency_key == again.hook.idempotency_key
    assert first.hook.idempotency_key != later.hook.idempotency_key
