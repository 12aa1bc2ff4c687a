"""Table-driven tests of the repair policy: ladders, budgets, TTL, cooldown, breaker, blast radius, spares,
approvals, ownership and steps in progress. Each row names the rule it checks."""

from __future__ import annotations

import pytest
from repair_builders import HEALTHY, NOW, D, H, fleet, hist, in_service, node, report

from ansible_collections.gpufleet.reliability.plugins.module_utils.repair import (
    BreakerState,
    RepairConfig,
    RepairError,
    loads,
    plan,
    record_ran,
)

BASE = {"blast_radius": {"max_unavailable": 4, "min_healthy": "25%"}}


def cfg(**over):
    c = {k: (dict(v) if isinstance(v, dict) else v) for k, v in BASE.items()}
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(c.get(k), dict):
            c[k].update(v)
        else:
            c[k] = v
    return c


def one(n, config=None, fl=None, **kw):
    p = plan(fl or fleet(), [n], RepairConfig.from_dict(config or cfg()), kw.pop("now", NOW), **kw)
    assert len(p) == 1
    return p[0]


# ---------------------------------------------------------------------------------------------------------------
# Ladders: (report, steps already in the incident, expected action, expected rule)
# ---------------------------------------------------------------------------------------------------------------
F, OK = "failed", "ok"
LADDER_ROWS = [
    # gpu_memory: reset_gpu -> reboot -> replace
    ("mem first", report(code="xid48", action="reset_gpu"), [], "reset_gpu", "ladder"),
    ("mem after reset", report(code="xid48", action="reset_gpu"), [("reset_gpu", NOW - 900, F)], "reboot", "ladder"),
    ("mem after reboot", report(code="xid48"), [("reset_gpu", NOW - 2000, F), ("reboot", NOW - 900, F)], "replace",
     "ladder"),
    ("mem report says reboot", report(code="xid95", action="reboot"), [], "reboot", "ladder"),
    ("mem report says replace", report(code="row_remap_failure", action="replace"), [], "replace", "ladder"),
    ("mem monitor-level action starts at bottom", report(code="xid48", action="monitor"), [], "reset_gpu", "ladder"),
    # gpu_lost: reboot -> replace (one reboot per incident; gpud stops after 2 reboots for a fault)
    ("lost first", report(code="xid79", action="reboot"), [], "reboot", "ladder"),
    ("lost reset asked but not on ladder", report(code="gpu_lost", action="reset_gpu"), [], "reboot", "ladder"),
    ("lost after reboot", report(code="xid79", action="reboot"), [("reboot", NOW - 900, F)], "replace", "ladder"),
    ("lost after reboot timeout", report(code="xid79"), [("reboot", NOW - 4000, "timeout")], "replace", "ladder"),
    # nvlink: reset_gpu -> reboot -> replace
    ("nvlink first", report(code="xid74", action="reset_gpu"), [], "reset_gpu", "ladder"),
    ("nvlink after reset", report(code="nvlink_down", action="reset_gpu"), [("reset_gpu", NOW - 900, F)], "reboot",
     "ladder"),
    # thermal: reboot -> replace
    ("thermal first", report(code="thermal_slowdown", action="reboot"), [], "reboot", "ladder"),
    ("thermal after reboot", report(code="thermal_slowdown", action="reboot"), [("reboot", NOW - 900, F)], "replace",
     "ladder"),
    # software: reboot -> reimage -> escalate
    ("software first", report(code="driver_mismatch", action="reboot"), [], "reboot", "ladder"),
    ("software after reboot", report(code="driver_mismatch", action="reboot"), [("reboot", NOW - 900, F)], "reimage",
     "ladder"),
    ("software exhausted", report(code="driver_mismatch", action="reboot"),
     [("reboot", NOW - 9000, F), ("reimage", NOW - 900, F)], "escalate", "ladder_exhausted"),
    # probe / unknown: reboot -> reimage
    ("probe first", report(verdict="unknown", code="nvml_timeout", action="none"), [], "reboot", "ladder"),
    ("no report at all (drained by us)", None, [], "reboot", "ladder"),
    # generic gpu (other Xids): reset_gpu -> reboot -> replace
    ("gsp xid119", report(code="xid119", action="reset_gpu"), [], "reset_gpu", "ladder"),
    # degraded with a repair action is actionable
    ("degraded reset-when-convenient", report(verdict="degraded", code="row_remap_pending", action="reset_gpu"), [],
     "reset_gpu", "ladder"),
]


@pytest.mark.parametrize("name,rep,steps,action,rule", LADDER_ROWS, ids=[r[0] for r in LADDER_ROWS])
def test_ladder(name, rep, steps, action, rule):
    from ansible_collections.gpufleet.reliability.plugins.module_utils.repair import classify

    cls = classify(rep)
    d = one(node(rep=rep, history=hist(cls=cls, code="x", steps=steps) if steps else None))
    assert (d.action, d.rule) == (action, rule), d.reason
    assert d.failure_class == cls
    if action in ("reset_gpu", "reboot", "reimage", "replace"):
        # a replacement waits for a person by default, in automatic mode too (approval_for: [replace])
        assert d.runnable == (action != "replace") and d.needs_approval == (action == "replace")
        if action == "replace":
            assert d.reason.endswith(f"[waiting for approval node2:replace:{d.incident}]"), d.reason
            d = one(node(rep=rep, history=hist(cls=cls, code="x", steps=steps) if steps else None),
                    approvals=[("node2", "replace", d.incident)])
            assert d.runnable and d.approved
        after = loads(d.history_after)
        assert after.incident.steps[-1].action == action and after.incident.steps[-1].outcome is None
        assert (NOW, action) in after.repairs
        # bookkeeping history does not pretend the step ran
        assert loads(d.history).incident.pending() is None


def test_one_step_of_each_kind_per_incident():
    # report asks for reset_gpu again after reset and reboot were tried: the ladder moves up, never repeats
    steps = [("reset_gpu", NOW - 3000, F), ("reboot", NOW - 900, F)]
    d = one(node(rep=report(code="xid48", action="reset_gpu"), history=hist(steps=steps)))
    assert d.action == "replace"


def test_ladder_exhausted_escalates_when_attempt_cap_allows():
    steps = [("reset_gpu", NOW - 9000, F), ("reboot", NOW - 5000, F), ("replace", NOW - 900, F)]
    d = one(node(history=hist(steps=steps)), cfg(max_attempts_per_incident=5, budget={"attempts": 9}))
    assert (d.action, d.rule) == ("escalate", "ladder_exhausted")
    assert d.runnable
    assert loads(d.history_after).incident.escalated == NOW


def test_custom_ladder_and_class_map():
    c = cfg(ladders={"software": ["reimage"]}, class_map={"xid119": "software"})
    d = one(node(rep=report(code="xid119", action="reset_gpu")), c)
    assert (d.failure_class, d.action) == ("software", "reimage")


# ---------------------------------------------------------------------------------------------------------------
# Budgets, escalation, lemon
# ---------------------------------------------------------------------------------------------------------------
BUDGET_ROWS = [
    # (name, history kwargs, config overrides, expected action, expected rule)
    ("per-incident attempts used up", dict(steps=[("reset_gpu", NOW - 9 * H, F), ("reboot", NOW - 5 * H, F),
                                                  ("reset_gpu", NOW - 2 * H, F)]),
     {"ladders": {"gpu_memory": ["reset_gpu", "reboot", "reimage", "replace"]}}, "escalate", "incident_attempts"),
    ("rolling budget 3 in 24h", dict(steps=[("reset_gpu", NOW - 2 * H, F)],
                                     repairs=[(NOW - 20 * H, "reboot"), (NOW - 10 * H, "reboot"),
                                              (NOW - 2 * H, "reset_gpu")]), {}, "wait", "budget"),
    ("rolling budget frees after 24h", dict(steps=[("reset_gpu", NOW - 2 * H, F)],
                                            repairs=[(NOW - 25 * H, "reboot"), (NOW - 10 * H, "reboot"),
                                                     (NOW - 2 * H, "reset_gpu")]), {}, "reboot", "ladder"),
    ("5 repairs in 7 days escalate", dict(repairs=[(NOW - k * D, "reboot") for k in (1, 2, 3, 4, 5)]),
     {"budget": {"attempts": 9}}, "escalate", "escalate_repairs"),
    ("4 repairs in 7 days do not", dict(repairs=[(NOW - k * D, "reboot") for k in (2, 3, 4, 5)]),
     {"budget": {"attempts": 9}}, "reset_gpu", "ladder"),
    ("repairs older than 7 days forgotten", dict(repairs=[(NOW - k * D, "reboot") for k in (8, 9, 10, 11, 12)]),
     {}, "reset_gpu", "ladder"),
    ("lemon: 4th incident in 30 days -> replace", dict(past=[(NOW - k * D, "gpu_memory") for k in (3, 10, 20)]),
     {}, "replace", "lemon"),
    ("3 incidents in 30 days are not a lemon", dict(past=[(NOW - k * D, "gpu_memory") for k in (10, 20)]),
     {}, "reset_gpu", "ladder"),
    ("old incidents are not counted", dict(past=[(NOW - k * D, "gpu_memory") for k in (31, 40, 50)]),
     {}, "reset_gpu", "ladder"),
    ("lemon whose replace failed escalates", dict(past=[(NOW - k * D, "gpu_lost") for k in (3, 10, 20)],
                                                  steps=[("replace", NOW - 2 * H, F)]), {}, "escalate", "lemon"),
    ("lemon action escalate", dict(past=[(NOW - k * D, "gpu_lost") for k in (3, 10, 20)]),
     {"lemon": {"action": "escalate"}}, "escalate", "lemon"),
]


@pytest.mark.parametrize("name,hkw,over,action,rule", BUDGET_ROWS, ids=[r[0] for r in BUDGET_ROWS])
def test_budgets(name, hkw, over, action, rule):
    d = one(node(history=hist(**hkw)), cfg(**over))
    assert (d.action, d.rule) == (action, rule), d.reason


def test_budget_wait_says_when_a_slot_frees():
    repairs = [(NOW - 20 * H, "reboot"), (NOW - 10 * H, "reboot"), (NOW - 2 * H, "reset_gpu")]
    d = one(node(history=hist(steps=[("reset_gpu", NOW - 2 * H, F)], repairs=repairs)))
    assert d.earliest == NOW - 20 * H + 24 * H
    assert not d.runnable


def test_escalated_incident_holds_until_a_person_takes_the_node_back():
    h = hist(steps=[("reset_gpu", NOW - 5 * H, F)], escalated=NOW - H)
    d = one(node(history=h))
    assert (d.action, d.rule) == ("hold", "escalated")
    # a person resumed it (node in service) while it is still sick: a new incident starts (TTL first)
    d = one(in_service(history=h))
    assert (d.action, d.rule) == ("wait", "ttl")
    assert loads(d.history).incident.id == 2


# ---------------------------------------------------------------------------------------------------------------
# TTL (flap suppression) and cooldown
# ---------------------------------------------------------------------------------------------------------------
TTL_ROWS = [
    # (name, attention node, config, action, rule, earliest)
    ("new finding on drained node waits ttl", node(reason_time=NOW - 100), {}, "wait", "ttl", NOW - 100 + 300),
    ("finding persisted past ttl acts", node(reason_time=NOW - 301), {}, "reset_gpu", "ladder", NOW),
    ("first seen from history", node(reason_time=NOW - 10, history=hist(t0=NOW - 200)), {"ttl": "5m"}, "wait", "ttl",
     NOW + 100),
    ("ttl from config", node(reason_time=NOW - 100), {"ttl": 60}, "reset_gpu", "ladder", NOW),
    ("in-service node not drained before ttl", in_service(), {}, "wait", "ttl", NOW + 300),
    ("in-service node drained after ttl", in_service(history=hist(t0=NOW - 400, steps=())), {}, "drain", "drain", NOW),
    ("transient: healthy within ttl resumes", node(rep=HEALTHY, reason_time=NOW - 100), {}, "resume", "healthy_resume",
     NOW),
    ("a relapse inside the cooldown goes to a person", node(history=hist(t0=NOW - H, cooldown=NOW + 600)), {},
     "escalate", "relapse", NOW),
    ("cooldown after a repair, relapse off", node(history=hist(t0=NOW - H, cooldown=NOW + 600)),
     {"escalate": {"relapse": False}}, "wait", "cooldown", NOW + 600),
    ("cooldown over", node(history=hist(t0=NOW - H, cooldown=NOW - 1)), {}, "reset_gpu", "ladder", NOW),
]


@pytest.mark.parametrize("name,n,over,action,rule,earliest", TTL_ROWS, ids=[r[0] for r in TTL_ROWS])
def test_ttl_and_cooldown(name, n, over, action, rule, earliest):
    d = one(n, cfg(**over))
    assert (d.action, d.rule, d.earliest) == (action, rule, earliest), d.reason
    assert d.runnable == (action not in ("wait", "hold"))


def test_resume_closes_incident_and_starts_cooldown():
    h = hist(t0=NOW - H, steps=[("reset_gpu", NOW - 1000, OK)])
    d = one(node(rep=HEALTHY, history=h))
    assert d.action == "resume"
    after = loads(d.history_after)
    assert after.incident is None and after.cooldown_until == NOW + 1800 and after.past[-1][1] == "gpu_memory"


def test_a_node_that_fails_again_inside_the_cooldown_goes_to_a_person():
    """Issue 27 case 3: a node verified healthy, resumed, and drained again seconds later flapped through the same
    reset for hours and fed the lemon rule. Now the relapse escalates at once, saying how soon it came back."""
    h = hist(t0=NOW - H, steps=[("reset_gpu", NOW - 1000, OK)])
    after = one(node(rep=HEALTHY, history=h)).history_after
    d = one(node(reason_time=NOW + 400, history=after), now=NOW + 800)  # new fault 400 s after resume, TTL passed
    assert (d.action, d.rule, d.incident) == ("escalate", "relapse", "2") and d.runnable, d
    assert "xid48 400s after the last verified repair" in d.reason and "did not hold" in d.reason
    assert loads(d.history_after).incident.escalated == NOW + 800
    # the same fault after the cooldown is a new incident like any other: its ladder from the start
    d = one(node(reason_time=NOW + 1900, history=after), now=NOW + 2300)
    assert (d.action, d.rule, d.incident) == ("reset_gpu", "ladder", "2")


def test_with_relapse_off_the_cooldown_waits_and_the_ladder_starts_again():
    h = hist(t0=NOW - H, steps=[("reset_gpu", NOW - 1000, OK)])
    after = one(node(rep=HEALTHY, history=h)).history_after
    off = cfg(escalate={"relapse": False})
    d = one(node(reason_time=NOW + 400, history=after), off, now=NOW + 800)
    assert (d.action, d.rule, d.earliest) == ("wait", "cooldown", NOW + 1800)
    d = one(node(reason_time=NOW + 400, history=after), off, now=NOW + 1801)
    assert d.action == "reset_gpu" and d.incident == "2"


# ---------------------------------------------------------------------------------------------------------------
# Circuit breaker
# ---------------------------------------------------------------------------------------------------------------
def storm(k, age=60, total=8):
    return [node(name=f"node{i}", reason_time=NOW - age, reason=f"gpufleet: xid79 gpu{i}",
                 rep=report(code="xid79", action="reboot")) for i in range(1, k + 1)]


BREAKER_ROWS = [
    # (name, nodes, fleet total, breaker state in, config, tripped after)
    ("half the fleet within 5 min trips", storm(4), 8, None, {}, True),
    ("below half does not", storm(3), 8, None, {}, False),
    ("failures older than the window do not count", storm(4, age=400), 8, None, {}, False),
    ("min_nodes floor", storm(2), 2, None, {}, False),
    ("min_nodes reachable", storm(3), 4, None, {}, True),
    ("stays tripped", storm(1), 8, {"tripped": True, "since": NOW - D, "reason": "x"}, {}, True),
    ("reset: earlier failures no longer count", storm(4, age=60), 8, {"tripped": False, "reset_at": NOW - 30}, {},
     False),
    ("disabled", storm(8), 8, None, {"breaker": {"enabled": False}}, False),
    ("fraction from config", storm(2), 8, None, {"breaker": {"fraction": "25%", "min_nodes": 1}}, True),
    ("long-standing foreign drains are not new failures",
     [node(name=f"n{i}", reason="admin", reason_time=NOW - 3 * D) for i in range(5)], 8, None, {}, False),
]


@pytest.mark.parametrize("name,nodes,total,state,over,tripped", BREAKER_ROWS, ids=[r[0] for r in BREAKER_ROWS])
def test_breaker(name, nodes, total, state, over, tripped):
    p = plan(fleet(total=total, unavailable=len(nodes)), nodes, cfg(blast_radius={"max_unavailable": 8,
                                                                                  "min_healthy": 0}, **over),
             NOW, breaker=state)
    assert p.breaker.tripped is tripped
    if tripped:
        assert all(d.action == "hold" and not d.runnable for d in p), [(d.node, d.action) for d in p]
        assert p.notes and "circuit breaker" in p.notes[0]
    else:
        assert not p.notes


def test_breaker_state_round_trips_and_blocks_resume():
    p = plan(fleet(unavailable=4), storm(4), cfg(blast_radius={"max_unavailable": 8, "min_healthy": 0}), NOW)
    saved = p.breaker.to_dict()
    assert saved["tripped"] and saved["nodes"] == ["node1", "node2", "node3", "node4"]
    later = plan(fleet(unavailable=1), [node(rep=HEALTHY)], cfg(), NOW + D, breaker=saved)
    assert later[0].action == "hold" and later[0].rule == "breaker"
    reset = BreakerState.from_dict(saved).reset(NOW + D)
    again = plan(fleet(unavailable=1), [node(rep=HEALTHY)], cfg(), NOW + D + 1, breaker=reset.to_dict())
    assert again[0].action == "resume" and not again.breaker.tripped


HELD = "gpufleet: held (xid79): circuit breaker tripped, a person checks the fleet and resets it"


def held_by_breaker(k, t=NOW - H):
    return [node(name=f"node{i}", reason=HELD, reason_time=t, rep=report(code="xid79", action="reboot"))
            for i in range(1, k + 1)]


BREAKER_SLURM_ROWS = [
    # (name, nodes, stored state, tripped after): Slurm keeps the breaker's hold when its state file did not
    ("a trip whose state was never saved", held_by_breaker(2), None, True),
    ("a stale state file, from before the trip", held_by_breaker(2), {"tripped": False, "reset_at": NOW - D}, True),
    ("a person's reset after the notes ends it", held_by_breaker(2), {"tripped": False, "reset_at": NOW - 60}, False),
    ("a note set by someone else is not ours", [node(reason="maint: " + HELD, reason_time=NOW - H)], None, False),
    ("a hold for another reason", [node(reason="gpufleet: held (xid79): blast radius", reason_time=NOW - H)], None,
     False),
    ("a note without a time proves nothing", held_by_breaker(1, t=None), None, False),
    ("a node back in service", [in_service(reason_time=NOW - H)], None, False),
]


@pytest.mark.parametrize("name,nodes,state,tripped", BREAKER_SLURM_ROWS, ids=[r[0] for r in BREAKER_SLURM_ROWS])
def test_breaker_kept_in_slurm(name, nodes, state, tripped):
    p = plan(fleet(unavailable=len(nodes)), nodes, cfg(), NOW, breaker=state)
    assert p.breaker.tripped is tripped
    if tripped:
        assert all(d.action == "hold" and d.rule == "breaker" for d in p), [(d.node, d.action, d.rule) for d in p]
        assert "still show the breaker's hold in Slurm" in p.breaker.reason
        assert p.breaker.nodes == sorted(n["name"] for n in nodes)
        assert p.breaker.reset_at == (state or {}).get("reset_at")


def test_breaker_kept_in_slurm_is_off_when_the_breaker_is():
    p = plan(fleet(unavailable=2), held_by_breaker(2), cfg(breaker={"enabled": False}), NOW)
    assert not p.breaker.tripped


def test_breaker_state_validation():
    with pytest.raises(RepairError, match="breaker.tripped"):
        plan(fleet(), [], cfg(), NOW, breaker={"tripped": "yes"})
    with pytest.raises(RepairError, match="unknown key"):
        plan(fleet(), [], cfg(), NOW, breaker={"trip": True})


# ---------------------------------------------------------------------------------------------------------------
# Blast radius
# ---------------------------------------------------------------------------------------------------------------
def ready(name, rack="r1", **kw):
    return node(name=name, rack=rack, reason_time=NOW - H, **kw)


BLAST_ROWS = [
    # (name, fleet, nodes, blast config, expected actions by node)
    ("concurrency limit: one of two drained nodes is repaired", fleet(unavailable=2), [ready("n1"), ready("n2")],
     {"max_unavailable": 1}, {"n1": "reset_gpu", "n2": "hold"}),
    ("share limit of 8 nodes at 25% is 2", fleet(unavailable=3), [ready("n1"), ready("n2"), ready("n3")],
     {"max_unavailable": "25%"}, {"n1": "reset_gpu", "n2": "reset_gpu", "n3": "hold"}),
    ("share limit never rounds below one", fleet(total=3, unavailable=1), [ready("n1")],
     {"max_unavailable": "20%", "min_healthy": 0}, {"n1": "reset_gpu"}),
    ("a step in progress uses a slot", fleet(unavailable=2),
     [ready("n1", history=hist(steps=[("reboot", NOW - 60, None)]), flags=("DRAIN", "REBOOT_ISSUED")), ready("n2")],
     {"max_unavailable": 1}, {"n1": "wait", "n2": "hold"}),
    ("drain blocked when it would exceed max_unavailable", fleet(unavailable=2),
     [in_service("n1", history=hist(t0=NOW - H))], {"max_unavailable": 2}, {"n1": "hold"}),
    ("drain allowed under the limit", fleet(unavailable=1),
     [in_service("n1", history=hist(t0=NOW - H))], {"max_unavailable": 2}, {"n1": "drain"}),
    ("two drains, room for one", fleet(unavailable=1),
     [in_service("n1", history=hist(t0=NOW - 2 * H)), in_service("n2", history=hist(t0=NOW - H))],
     {"max_unavailable": 2}, {"n1": "drain", "n2": "hold"}),
    ("min_healthy blocks everything below the floor", fleet(unavailable=4), [ready("n1")],
     {"max_unavailable": 8, "min_healthy": "51%"}, {"n1": "hold"}),
    ("rack limit", fleet(unavailable=2, racks={"r1": (4, 2), "r2": (4, 0)}), [ready("n1"), ready("n2"),
                                                                              ready("n3", rack="r2")],
     {"max_unavailable": 8, "domains": {"rack": 1}}, {"n1": "reset_gpu", "n2": "hold", "n3": "reset_gpu"}),
    ("rack drain limit", fleet(unavailable=1, racks={"r1": (4, 1)}), [in_service("n1", history=hist(t0=NOW - H))],
     {"max_unavailable": 8, "domains": {"rack": 1}}, {"n1": "hold"}),
    ("max_parallel per run", fleet(unavailable=2), [ready("n1"), ready("n2")],
     {"max_unavailable": 8, "max_parallel": 1}, {"n1": "reset_gpu", "n2": "hold"}),
    ("the last available node is never drained", fleet(total=2, unavailable=1),
     [in_service("n1", history=hist(t0=NOW - H))], {"max_unavailable": 2, "min_healthy": 0}, {"n1": "hold"}),
    ("resume is not limited", fleet(unavailable=5), [ready("n1", rep=HEALTHY)], {"max_unavailable": 1},
     {"n1": "resume"}),
]


@pytest.mark.parametrize("name,fl,nodes,blast,expect", BLAST_ROWS, ids=[r[0] for r in BLAST_ROWS])
def test_blast_radius(name, fl, nodes, blast, expect):
    br = {"min_healthy": "25%"}
    br.update(blast)
    p = plan(fl, nodes, cfg(blast_radius=br), NOW)
    got = {d.node: d.action for d in p}
    assert got == expect, [(d.node, d.action, d.reason) for d in p]
    for d in p:
        if d.action == "hold":
            # below min_healthy has its own rule (a run reports it as a problem); the other limits are blast_radius
            rule = "min_healthy" if "below min_healthy" in d.reason else "blast_radius"
            assert d.rule.startswith(rule) and not d.runnable


def test_blast_radius_order_is_oldest_incident_first():
    nodes = [ready("n1", history=hist(t0=NOW - H)), ready("n2", history=hist(t0=NOW - 2 * H))]
    p = plan(fleet(unavailable=2), nodes, cfg(blast_radius={"max_unavailable": 1}), NOW)
    assert [(d.node, d.action) for d in p] == [("n2", "reset_gpu"), ("n1", "hold")]


# ---------------------------------------------------------------------------------------------------------------
# Hot spares and the replacement hook
# ---------------------------------------------------------------------------------------------------------------
LOST_AFTER_REBOOT = dict(cls="gpu_lost", code="xid79", steps=[("reboot", NOW - 900, F)])
LOST = report(code="xid79", action="reboot")


def test_replace_brings_an_idle_spare_and_calls_the_hook():
    d = one(node(rep=LOST, history=hist(**LOST_AFTER_REBOOT)), fl=fleet(spares=("spare2", "spare1")))
    assert d.action == "replace"
    assert d.spare.to_dict() == {"spare": "spare1", "partition": "gpu", "for_node": "node2"}
    assert d.hook.action == "replace" and d.hook.node == "node2" and d.hook.incident == "1"
    assert d.hook.idempotency_key.startswith("gpufleet-")
    after = loads(d.history_after).incident
    assert after.spare == "spare1" and after.hooks == ("replace",)
    # the same incident planned again gives the same idempotency key
    d2 = one(node(rep=LOST, history=hist(**LOST_AFTER_REBOOT)), fl=fleet(spares=("spare2", "spare1")))
    assert d2.hook.idempotency_key == d.hook.idempotency_key


SPARE_ROWS = [
    # (name, fleet spares, nodes, config, expected spare per node)
    ("two replaces, one spare", ("spare1",),
     [node("a", rep=LOST, history=hist(**LOST_AFTER_REBOOT)), node("b", rep=LOST, history=hist(**LOST_AFTER_REBOOT))],
     {}, {"a": "spare1", "b": None}),
    ("spare already brought for this incident", ("spare1",),
     [node("a", rep=LOST, history=hist(spare="spare9", **LOST_AFTER_REBOOT))], {}, {"a": None}),
    ("escalation brings a spare", ("spare1",),
     [node("a", history=hist(repairs=[(NOW - k * D, "reboot") for k in range(1, 6)]))], {"budget": {"attempts": 9}},
     {"a": "spare1"}),
    ("reset does not", ("spare1",), [node("a")], {}, {"a": None}),
    ("spares disabled", ("spare1",), [node("a", rep=LOST, history=hist(**LOST_AFTER_REBOOT))],
     {"spares": {"enabled": False}}, {"a": None}),
    ("count only: body picks the spare", 1, [node("a", rep=LOST, history=hist(**LOST_AFTER_REBOOT))], {},
     {"a": "?"}),
    ("no spare idle", (), [node("a", rep=LOST, history=hist(**LOST_AFTER_REBOOT))], {}, {"a": None}),
]


@pytest.mark.parametrize("name,spares,nodes,over,expect", SPARE_ROWS, ids=[r[0] for r in SPARE_ROWS])
def test_spares(name, spares, nodes, over, expect):
    fl = fleet(unavailable=len(nodes), spares=())
    fl["partitions"]["gpu"]["spares_idle"] = spares if isinstance(spares, int) else list(spares)
    p = plan(fl, nodes, cfg(**over), NOW)
    got = {}
    for d in p:
        got[d.node] = None if d.spare is None else (d.spare.spare or "?")
    assert got == expect
    assert len(p.spare_moves) == sum(1 for v in expect.values() if v)


# ---------------------------------------------------------------------------------------------------------------
# Modes and approvals
# ---------------------------------------------------------------------------------------------------------------
APPROVAL = cfg(modes={"default": "automatic", "gpu_memory": "approval"})
APPROVAL_ROWS = [
    # (name, node, approvals, action, needs_approval, runnable)
    ("approval mode waits", node(), [], "reset_gpu", True, False),
    ("approved tuple runs", node(), [("node2", "reset_gpu", "1")], "reset_gpu", False, True),
    ("approved string form runs", node(), ["node2:reset_gpu:1"], "reset_gpu", False, True),
    ("approval for another step does not apply", node(), [("node2", "reboot", "1")], "reset_gpu", True, False),
    ("approval for another incident does not apply", node(), [("node2", "reset_gpu", "7")], "reset_gpu", True, False),
    ("approval for another node does not apply", node(), [("node3", "reset_gpu", "1")], "reset_gpu", True, False),
    ("other classes stay automatic", node(rep=LOST), [], "reboot", False, True),
    ("resume needs approval too", node(rep=HEALTHY, history=hist()), [], "resume", True, False),
    ("approved resume", node(rep=HEALTHY, history=hist()), [("node2", "resume", "1")], "resume", False, True),
    ("drain needs approval", in_service(history=hist(t0=NOW - H)), [], "drain", True, False),
    ("escalation without a spare is not gated",
     node(history=hist(repairs=[(NOW - k * D, "reboot") for k in range(1, 6)])), [], "escalate", False, True),
    # bringing a hot spare into the partition is a change: it waits like any other
    ("escalation bringing a spare waits", node(history=hist(repairs=[(NOW - k * D, "reboot") for k in range(1, 6)])),
     [], "escalate", True, False),
    ("approved escalation brings the spare", node(history=hist(repairs=[(NOW - k * D, "reboot") for k in range(1, 6)])),
     [("node2", "escalate", "1")], "escalate", False, True),
]
APPROVAL_SPARES = {"escalation bringing a spare waits": ("spare1",),
                   "approved escalation brings the spare": ("spare1",)}


@pytest.mark.parametrize("name,n,approvals,action,needs,runnable", APPROVAL_ROWS, ids=[r[0] for r in APPROVAL_ROWS])
def test_approvals(name, n, approvals, action, needs, runnable):
    c = cfg(modes={"default": "automatic", "gpu_memory": "approval"}, budget={"attempts": 9})
    p = plan(fleet(spares=APPROVAL_SPARES.get(name, ())), [n], c, NOW, approvals=approvals)
    d = p[0]
    assert (d.action, d.needs_approval, d.runnable) == (action, needs, runnable), d.reason
    assert d.approved == (bool(approvals) and not needs)
    assert (d.spare is not None) == (name in APPROVAL_SPARES)
    if needs:
        assert "waiting for approval" in d.reason
    assert bool(p.unused_approvals) == (bool(approvals) and needs)


def test_approval_applies_exactly_the_approved_steps():
    nodes = [node("a", reason_time=NOW - H), node("b", reason_time=NOW - H), node("c", reason_time=NOW - H)]
    c = cfg(modes={"default": "approval"})
    p = plan(fleet(unavailable=3), nodes, c, NOW)
    assert not p.runnable() and all(d.needs_approval for d in p)
    keys = {d.node: d.approval_key for d in p}
    p2 = plan(fleet(unavailable=3), nodes, c, NOW + 60, approvals=[keys["b"]])
    assert [d.node for d in p2.runnable()] == ["b"]
    assert p2.unused_approvals == []


def test_approvals_validation():
    with pytest.raises(RepairError, match=r"approvals\[0\]"):
        plan(fleet(), [node()], cfg(), NOW, approvals=["node2:explode:1"])


# ---------------------------------------------------------------------------------------------------------------
# Ownership, steps in progress, verification
# ---------------------------------------------------------------------------------------------------------------
OWN_ROWS = [
    # (name, node, action, rule)
    ("drained by someone else is never touched", node(reason="maintenance: dimm swap", user="alice"), "hold",
     "not_ours"),
    ("down by slurm (not responding) is not ours", node(state="DOWN", flags=(), reason="Not responding", user="slurm"),
     "hold", "not_ours"),
    ("healthy and drained by someone else stays drained", node(rep=HEALTHY, reason="admin hold"), "hold", "not_ours"),
    ("history field holds foreign text", node(history="rack 12 slot 3"), "hold", "foreign_history"),
    ("healthy in service", in_service(rep=HEALTHY), "hold", "healthy_in_service"),
    ("degraded monitor-only drained by us resumes", node(rep=report(verdict="degraded", action="monitor")), "resume",
     "healthy_resume"),
    ("no report and in service: nothing to act on", in_service(rep=None), "hold", "no_report"),
    ("draining with jobs waits", node(state="MIXED", reason_time=NOW - H), "wait", "draining"),
    ("our reboot in progress", node(flags=("DRAIN", "REBOOT_ISSUED"), history=hist(steps=[("reboot", NOW - 60, None)])),
     "wait", "in_progress"),
    # Slurm keeps our reason through its reboot and appends to it (seen in the lab, 22.05 and 24.11)
    ("our reboot in progress, slurm appended to the reason", node(
        state="DOWN", flags=("DRAIN", "REBOOT_ISSUED"), reason="gpufleet: reboot xid48 (incident 1) : reboot issued",
        history=hist(steps=[("reboot", NOW - 60, None)])),
     "wait", "in_progress"),
    ("step pending, no fresh report yet", node(report_time=NOW - 120, history=hist(steps=[("reset_gpu", NOW - 60,
                                                                                           None)])),
     "wait", "in_progress"),
    ("step ran, no fresh report yet", node(report_time=NOW - 120, history=hist(steps=[("reset_gpu", NOW - 60,
                                                                                       None, NOW - 55)])),
     "wait", "in_progress"),
    ("step pending, fresh healthy report verifies it", node(rep=HEALTHY, report_time=NOW - 10, history=hist(
        steps=[("reset_gpu", NOW - 60, None, NOW - 55)])),
     "resume", "healthy_resume"),
    ("step pending, fresh unhealthy report fails it", node(report_time=NOW - 10, history=hist(
        steps=[("reset_gpu", NOW - 60, None, NOW - 55)])),
     "reboot", "ladder"),
    # issue 27 case 4: the run died after writing the reset's intent; the agent's reports go on
    ("reset with no record that it ran: a sick report does not fail it", node(report_time=NOW - 10, history=hist(
        steps=[("reset_gpu", NOW - 60, None)])),
     "wait", "in_progress"),
    ("a sick report taken between the intent and the reset does not fail it", node(report_time=NOW - 50, history=hist(
        steps=[("reset_gpu", NOW - 60, None, NOW - 40)])),
     "wait", "in_progress"),
    ("reset with no record that it ran, healthy anyway: resumed, not credited", node(
        rep=HEALTHY, report_time=NOW - 10, history=hist(steps=[("reset_gpu", NOW - 60, None)])),
     "resume", "healthy_resume"),
    ("replacement pending: a sick report does not fail it", node(report_time=NOW - 10, history=hist(
        steps=[("reset_gpu", NOW - 9000, F), ("reboot", NOW - 8000, F), ("replace", NOW - 600, None)])),
     "wait", "in_progress"),
    ("replacement done: the new node reports healthy", node(rep=HEALTHY, report_time=NOW - 10, history=hist(
        steps=[("reboot", NOW - 8000, F), ("replace", NOW - 600, None)])), "resume", "healthy_resume"),
    ("reboot intent written but never taken by Slurm: retried", dict(node(
        history=hist(steps=[("reset_gpu", NOW - 900, F), ("reboot", NOW - 60, None)])), boot_time=NOW - 5000),
     "reboot", "ladder"),
    ("reboot issued (reason says so), no boot since: waits, not retried, never replaced", dict(node(
        reason="gpufleet: reboot xid48 (incident 1) : reboot issued", report_time=NOW - 10,
        history=hist(steps=[("reset_gpu", NOW - 900, F), ("reboot", NOW - 60, None)])), boot_time=NOW - 5000),
     "wait", "in_progress"),
    ("reboot done (booted since), fresh sick report: the next rung", dict(node(
        reason="gpufleet: reboot xid48 (incident 1) : reboot complete", report_time=NOW - 10,
        history=hist(steps=[("reset_gpu", NOW - 900, F), ("reboot", NOW - 60, None)])), boot_time=NOW - 30),
     "replace", "ladder"),
    # issue 27 case 2: Slurm gave up on a late reboot ("reboot timed out"); no boot since the intent
    ("reboot timed out in Slurm, no boot since: waits, never replaced", dict(node(
        state="DOWN", flags=(), reason="gpufleet: reboot xid48 (incident 1) : reboot timed out", report_time=NOW - 10,
        history=hist(steps=[("reset_gpu", NOW - 900, F), ("reboot", NOW - 600, None)])), boot_time=NOW - 5000),
     "wait", "in_progress"),
    ("reboot never proven by its timeout: offered again, not replaced", dict(node(
        state="DOWN", flags=(), reason="gpufleet: reboot xid48 (incident 1) : reboot timed out", report_time=NOW - 10,
        history=hist(steps=[("reset_gpu", NOW - 9000, F), ("reboot", NOW - 4000, None)])), boot_time=NOW - 9999),
     "reboot", "ladder"),
    # issue 27 case 1: slurmctld restarted, the node's slurmd not registered yet: boot time 0 (unknown)
    ("boot time unknown: waits, never judged", dict(node(
        state="DOWN", flags=("NOT_RESPONDING",), report_time=NOW - 10,
        history=hist(steps=[("reboot", NOW - 60, None)])), boot_time=None),
     "wait", "in_progress"),
    ("step past its timeout, never proven: offered again", node(
        report_time=NOW - 4000, history=hist(steps=[("reset_gpu", NOW - 4000, None)])),
     "reset_gpu", "ladder"),
    ("step past its timeout, proven: the next rung", node(report_time=NOW - 4000, history=hist(
        steps=[("reset_gpu", NOW - 4000, None, NOW - 3990)])),
     "reboot", "ladder"),
]


@pytest.mark.parametrize("name,n,action,rule", OWN_ROWS, ids=[r[0] for r in OWN_ROWS])
def test_ownership_and_progress(name, n, action, rule):
    d = one(n, cfg(budget={"attempts": 9}))
    assert (d.action, d.rule) == (action, rule), d.reason
    if rule == "not_ours":
        assert d.history == n["history"] or (d.history and loads(d.history).incident is None)
        assert not d.runnable
    if rule == "foreign_history":
        assert d.history is None and d.history_after is None
    if rule == "in_progress":
        assert not d.runnable and d.earliest > NOW
        # the playbook verifies a waiting reset/reboot; a pending reimage/replace is never checked (and failed)
        # while the broken node waits for its replacement
        # (and only on proof that the step ran: a check of a node whose reset or reboot never ran would fail it)
        step = loads(n["history"]).incident.steps[-1]
        proven = step.ran is not None or "REBOOT_ISSUED" in n.get("flags", ()) or (
            step.action == "reboot" and (n.get("boot_time") or 0) >= step.started)
        assert d.verify == (step.action not in ("reimage", "replace") and proven), (step, d.verify)


def test_verified_step_is_recorded_in_history():
    d = one(node(rep=HEALTHY, report_time=NOW - 10, history=hist(steps=[("reset_gpu", NOW - 60, None, NOW - 58)])))
    h = loads(d.history)
    assert h.incident.steps[-1].outcome == "ok"
    assert loads(d.history_after).incident is None


def test_retracted_reboot_is_not_counted():
    n = dict(node(history=hist(steps=[("reset_gpu", NOW - 900, F), ("reboot", NOW - 60, None)])), boot_time=NOW - 5000)
    d = one(n)
    after = loads(d.history_after)
    assert [(s.action, s.outcome) for s in after.incident.steps] == [("reset_gpu", "failed"), ("reboot", None)]
    assert [a for _t, a in after.repairs] == ["reset_gpu", "reboot"]


def test_failed_step_is_recorded_in_history():
    d = one(node(report_time=NOW - 10, history=hist(steps=[("reset_gpu", NOW - 60, None, NOW - 58)])))
    assert loads(d.history).incident.steps[-1].outcome == "failed"
    assert [s.action for s in loads(d.history_after).incident.steps] == ["reset_gpu", "reboot"]


def test_a_step_never_proven_is_recorded_so_and_offered_again_within_the_limits():
    """Never replaced for a step that did not happen: the same step again, each counted against the incident's
    attempts and the budget, then a person (escalate), never the next rung."""
    n = node(report_time=NOW - 10, history=hist(steps=[("reset_gpu", NOW - 4000, None)]))
    d = one(n, cfg(budget={"attempts": 9}))
    assert loads(d.history).incident.steps[-1].outcome == "unproven"
    after = loads(d.history_after).incident
    assert [(s.action, s.outcome) for s in after.steps] == [("reset_gpu", "unproven"), ("reset_gpu", None)]
    assert "after reset_gpu unproven" in d.reason
    steps = [("reset_gpu", NOW - 9000, "unproven"), ("reset_gpu", NOW - 8000, "unproven"),
             ("reset_gpu", NOW - 7000, "unproven")]
    d = one(node(report_time=NOW - 10, history=hist(steps=steps)), cfg(budget={"attempts": 9}))
    assert (d.action, d.rule) == ("escalate", "incident_attempts"), d.reason


# ---------------------------------------------------------------------------------------------------------------
# Whole-incident walk: history written by each decision feeds the next plan
# ---------------------------------------------------------------------------------------------------------------
def test_incident_walk_is_reproducible_from_history():
    """Fault -> TTL -> reset fails -> reboot fails -> replace with spare; replanning any step gives the same answer."""
    t = NOW
    history = None
    seen = []
    rep = report(code="xid48", action="reset_gpu")
    boot = NOW - D
    for _unused in range(8):
        n = dict(node(rep=rep, reason_time=NOW, history=history, report_time=t), boot_time=boot)
        p = plan(fleet(unavailable=1), [n], cfg(), t)
        d = p[0]
        again = plan(fleet(unavailable=1), [n], cfg(), t)[0]
        assert again.to_dict() == d.to_dict()  # same inputs, same decision
        seen.append(d.action)
        history = d.history_after if d.runnable else d.history
        if d.action in ("replace", "escalate"):
            break
        if d.action == "reset_gpu":  # the reset ran: the body records it right after
            history = record_ran(history, t + 5)
        if d.action == "reboot":  # the reboot ran: Slurm shows the new boot time
            boot = t + 60
        if d.action in ("reset_gpu", "reboot"):
            t += 120  # the next report is newer than the step and still unhealthy
        else:
            t = max(t + 1, d.earliest)
    assert seen == ["wait", "reset_gpu", "reboot", "replace"]
    assert d.spare is not None and d.hook is not None


def test_cost_does_not_depend_on_fleet_size():
    small = plan(fleet(total=8), [node()], cfg(), NOW)
    big = plan(fleet(total=100_000, unavailable=1), [node()], cfg(), NOW)
    assert small[0].action == big[0].action == "reset_gpu"


# ---------------------------------------------------------------------------------------------------------------
# Input validation names the field
# ---------------------------------------------------------------------------------------------------------------
BAD_INPUT = [
    ({"partitions": {"gpu": {"total": "8", "available": 7}}}, [node()], r"fleet\.partitions\.gpu\.total"),
    ({"partitions": {"gpu": {"total": 8, "available": 7, "spares_idle": "x"}}}, [node()], "spares_idle"),
    (fleet(), [{"partition": "gpu"}], r"attention\[0\]\.name"),
    (fleet(), [node(), node()], "appears twice"),
    (fleet(), [dict(node(), reason_time="yesterday")], r"reason_time"),
]


@pytest.mark.parametrize("fl,nodes,match", BAD_INPUT)
def test_bad_input_names_the_field(fl, nodes, match):
    with pytest.raises(RepairError, match=match):
        plan(fl, nodes, cfg(), NOW)


# ---------------------------------------------------------------------------------------------------------------
# Slurm 24.11 keeps a node's last reason after RESUME (22.05 clears it): on a node in service it means nothing
# ---------------------------------------------------------------------------------------------------------------
LEFTOVERS = ("gpufleet: xid48 gpu3", "gpufleet: reboot xid48 gpu3 (incident 1) : reboot issued", "gpufleet: spare",
             "maintenance: dimm swap")


def leftover(n, reason):
    """The same node as 24.11 shows it: idle, not drained, with an old reason still set."""
    assert not n["flags"] and n["state"] == "IDLE"
    return dict(n, reason=reason, reason_time=NOW - D)


@pytest.mark.parametrize("reason", LEFTOVERS)
@pytest.mark.parametrize(
    "n",
    [
        in_service(rep=HEALTHY),
        in_service(rep=HEALTHY, history=hist(steps=[("reset_gpu", NOW - 600, None)])),
        in_service(report_time=NOW - 10),
        in_service(report_time=NOW - 10, history=hist(steps=[("reset_gpu", NOW - 900, F), ("reboot", NOW - 60, None)])),
        in_service(rep=HEALTHY, history=hist(escalated=NOW - H)),
    ],
    ids=["healthy", "healthy_after_step", "sick", "sick_reboot_intent", "escalated_taken_back"],
)
def test_leftover_reason_on_a_node_in_service_changes_nothing(n, reason):
    n = dict(n, boot_time=NOW - 5000)
    want = one(n).to_dict()
    got = one(leftover(n, reason)).to_dict()
    assert got == want
    assert got["rule"] not in ("not_ours", "healthy_resume")


def test_leftover_reboot_reason_does_not_keep_a_reboot_that_never_happened():
    # the run died after writing the reboot intent and before Slurm took it; a person resumed the node since. On
    # 24.11 the node still shows the reason of an earlier reboot: the intent must still be retracted
    n = dict(in_service(report_time=NOW - 10,
                        history=hist(steps=[("reset_gpu", NOW - 900, F), ("reboot", NOW - 60, None)])),
             boot_time=NOW - 5000)
    d = one(leftover(n, "gpufleet: reboot xid48 gpu3 (incident 1) : reboot issued"))
    assert (d.action, d.rule) == ("drain", "drain"), d.reason
    assert [(s.action, s.outcome) for s in loads(d.history).incident.steps] == [("reset_gpu", "failed")]
