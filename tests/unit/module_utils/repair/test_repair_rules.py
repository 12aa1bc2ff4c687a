"""Each named repair rule (repair/rules.py) and limit (repair/limits.py) on its own: a case it decides and a control
it leaves to the next rule. The rule's name is the ``rule`` field of the decision it makes."""

from __future__ import annotations

import json

import pytest
from repair_builders import HEALTHY, NOW, D, H, fleet, hist, in_service, node, report

from ansible_collections.gpufleet.reliability.plugins.module_utils.repair import (
    BreakerState,
    FleetSummary,
    NodeState,
    RepairConfig,
    RepairError,
    loads,
    plan,
)
from ansible_collections.gpufleet.reliability.plugins.module_utils.repair import rules as R
from ansible_collections.gpufleet.reliability.plugins.module_utils.repair.limits import (
    Limits,
    breaker_threshold,
    budget_free_at,
    limit_of,
)
from ansible_collections.gpufleet.reliability.plugins.module_utils.repair.state import Counts

CONFIG = RepairConfig.from_dict({"blast_radius": {"max_unavailable": 4, "min_healthy": "25%"}})
TRIPPED = BreakerState(tripped=True, since=NOW - 60, reason="5 nodes failed")


def case(rec=None, config=CONFIG, fl=None, brk=None, approved=frozenset(), booked=False, t0=None):
    """A Case for one node record (repair_builders' dict), its history parsed as plan() reads it."""
    n = NodeState.from_dict(rec if rec is not None else node())
    verdict, action, code, gpu = _report_fields(n.report)
    h = None if n.history_foreign else (n.history.copy() if n.history is not None else loads(""))
    c = R.Case(n, h, verdict, action, code, gpu, NOW - H if t0 is None else t0, config,
               Limits(FleetSummary.from_dict(fl or fleet()), config), brk or BreakerState(), set(approved), NOW,
               n.foreign(config.reason_prefix))
    if booked:
        R.book(c)
    return c


def _report_fields(rep):
    from ansible_collections.gpufleet.reliability.plugins.module_utils.repair.classify import check_report

    return check_report(rep, "report")


# --- 1. whose node ---------------------------------------------------------------------------------------------
def test_foreign_history_holds_a_field_that_is_not_ours():
    d = R.foreign_history(case(node(history="maintenance window, ask bob")))
    assert (d.action, d.rule, d.history) == ("hold", "foreign_history", None)
    assert R.foreign_history(case(node(history=hist()))) is None


def test_not_ours_holds_and_closes_our_incident_with_a_note():
    c = case(node(reason="bios update", user="alice", history=hist(steps=[("reboot", NOW - 600, None)])))
    d = R.not_ours(c)
    assert (d.action, d.rule) == ("hold", "not_ours") and "reboot pending" in d.reason
    closed = loads(d.history)
    assert closed.incident is None and "incident 1 closed" in closed.note
    assert R.not_ours(case(node(history=hist()))) is None  # our reason: the next rules decide


def test_no_report_holds_a_node_in_service_without_a_report():
    assert R.no_report(case(in_service(rep=None))).rule == "no_report"
    assert R.no_report(case(node(rep=None))) is None  # out of service: the probe class handles it


# --- 2. a step in progress -------------------------------------------------------------------------------------
def test_in_progress_waits_for_a_newer_report_then_lets_the_next_rules_decide():
    rec = node(history=hist(steps=[("reset_gpu", NOW - 60, None, NOW - 58)]), report_time=NOW - 120)
    d = R.in_progress(case(rec))
    assert (d.action, d.rule, d.verify, d.earliest) == ("wait", "in_progress", True, NOW - 60 + 600)
    rec = node(history=hist(steps=[("reset_gpu", NOW - 60, None)]), report_time=NOW - 120)
    d = R.in_progress(case(rec))  # no record that the reset ran: nothing to verify yet
    assert (d.action, d.rule, d.verify, d.earliest) == ("wait", "in_progress", False, NOW - 60 + 600)
    rec = node(history=hist(steps=[("reset_gpu", NOW - 60, None, NOW - 58)]), report_time=NOW - 10)
    c = case(rec)
    assert R.in_progress(c) is None and c.hist.incident.steps[-1].outcome == "failed"  # a fresh sick report
    assert c.before().incident.pending() is not None  # the history as it came in, kept for the rules after
    assert c.hist.incident.pending() is None
    assert R.in_progress(case(node(history=hist()))) is None  # nothing pending


def test_in_progress_times_out_and_forgets_a_reboot_that_never_happened():
    c = case(node(history=hist(steps=[("reset_gpu", NOW - 700, None, NOW - 690)])))
    assert R.in_progress(c) is None and c.hist.incident.steps[-1].outcome == "timeout"
    c = case(node(history=hist(steps=[("reset_gpu", NOW - 700, None)])))
    assert R.in_progress(c) is None and c.hist.incident.steps[-1].outcome == "unproven"  # never shown to have run
    rec = node(history=hist(steps=[("reboot", NOW - 60, None)]))
    rec["boot_time"] = NOW - 3 * H
    c = case(rec)
    assert R.reboot_never_happened(c.n, c.hist.incident.pending(), CONFIG)
    assert R.in_progress(c) is None and c.hist.incident.steps == () and c.hist.repairs == ()
    rec["reason"] = "gpufleet: xid48 gpu3 : reboot issued"
    c = case(rec)
    assert not R.reboot_never_happened(c.n, c.hist.incident.pending(), CONFIG)  # Slurm took it


# --- 3. nothing to repair --------------------------------------------------------------------------------------
def test_drain_requested_holds_a_degraded_node_the_check_wants_out():
    rep = dict(report("degraded", "monitor", "hw_slowdown"), drain=True)
    assert R.drain_requested(case(node(rep=rep, history=hist()))).rule == "drain_requested"
    rep["drain"] = False
    assert R.drain_requested(case(node(rep=rep, history=hist()))) is None


def test_drain_requested_drains_a_node_in_service_within_the_breaker_and_the_limits():
    """The agent leaves a drain request on a node that still runs jobs to the repair run (one writer)."""
    rep = dict(report("degraded", "monitor", "hw_slowdown"), drain=True)
    d = R.drain_requested(case(in_service(rep=rep)))
    assert (d.action, d.rule, d.runnable) == ("drain", "drain_requested", True) and "out of service" in d.reason
    d = R.drain_requested(case(in_service(rep=rep), brk=TRIPPED))
    assert (d.action, d.rule) == ("hold", "breaker") and "5 nodes failed" in d.reason
    d = R.drain_requested(case(in_service(rep=rep), fl=fleet(total=8, unavailable=4)))
    assert (d.action, d.rule) == ("hold", "blast_radius_drain") and "limit 4" in d.reason, d.reason
    approval = RepairConfig.from_dict({"blast_radius": {"max_unavailable": 4, "min_healthy": "25%"},
                                       "modes": {"default": "approval"}})
    d = R.drain_requested(case(in_service(rep=rep), config=approval))
    assert (d.action, d.needs_approval, d.runnable) == ("drain", True, False)
    # two drain requests in one run share the limits: max_unavailable 4 with 3 out lets one through
    (a, b) = plan(fleet(total=8, unavailable=3), [in_service("n1", rep=rep), in_service("n2", rep=rep)], CONFIG, NOW)
    assert (a.action, b.action, b.rule) == ("drain", "hold", "blast_radius_drain"), (a, b)


def test_healthy_resumes_a_node_we_drained_and_holds_one_in_service():
    d = R.healthy(case(node(rep=HEALTHY, history=hist(steps=[("reset_gpu", NOW - 900, "ok")]))))
    assert (d.action, d.rule, d.runnable) == ("resume", "healthy_resume", True)
    after = loads(d.history_after)
    assert after.incident is None and after.cooldown_until == NOW + 1800
    assert R.healthy(case(in_service(rep=HEALTHY))).rule == "healthy_in_service"
    assert R.healthy(case(node(rep=HEALTHY), brk=TRIPPED)).rule == "breaker"
    assert R.healthy(case(node())) is None  # unhealthy: not this rule


def test_degraded_monitor_keeps_watching_when_resume_degraded_is_off():
    config = RepairConfig.from_dict({"resume_degraded": False})
    c = case(node(rep=report("degraded", "monitor", "temp_high")), config=config)
    assert R.healthy(c) is None and R.degraded_monitor(c).rule == "degraded_monitor"
    assert R.degraded_monitor(case(node())) is None


def test_book_opens_the_incident_or_updates_it():
    c = case(node(history=None), booked=True)
    assert (c.hist.incident.id, c.hist.incident.first_seen, c.cls) == (1, NOW - H, "gpu_memory")
    c = case(node(rep=report(code="xid79", action="reboot"), history=hist()), booked=True)
    assert (c.hist.incident.id, c.hist.incident.code, c.cls) == (1, "xid79", "gpu_lost")
    c = case(in_service(history=hist(escalated=NOW - D)), booked=True)  # a person took it back
    assert (c.hist.incident.id, c.hist.incident.escalated) == (2, None)


# --- 4-8. an incident that waits -------------------------------------------------------------------------------
def test_escalated_holds_until_a_person_takes_the_node_back():
    assert R.escalated(case(node(history=hist(escalated=NOW - H)), booked=True)).rule == "escalated"
    assert R.escalated(case(node(history=hist()), booked=True)) is None


def test_breaker_holds_everything_and_says_so_in_slurm():
    d = R.breaker(case(node(history=hist()), brk=TRIPPED, booked=True))
    assert d.rule == "breaker" and d.slurm_reason.startswith("gpufleet: held (xid48): circuit breaker")
    assert R.breaker(case(node(history=hist()), booked=True)) is None


def test_ttl_waits_until_the_finding_persisted():
    d = R.ttl(case(node(history=hist(t0=NOW - 60)), booked=True))
    assert (d.action, d.rule, d.earliest) == ("wait", "ttl", NOW - 60 + 300)
    assert R.ttl(case(node(history=hist(t0=NOW - 301)), booked=True)) is None


def test_drain_drains_a_node_in_service_within_the_limits():
    d = R.drain(case(in_service(), booked=True))
    assert (d.action, d.rule, d.runnable) == ("drain", "drain", True)
    d = R.drain(case(in_service(), fl=fleet(total=8, unavailable=4), booked=True))
    assert (d.action, d.rule) == ("hold", "blast_radius_drain")
    assert R.drain(case(node(), booked=True)) is None  # already out of service


def test_draining_waits_for_jobs_to_end():
    assert R.draining(case(node(state="MIXED"), booked=True)).rule == "draining"
    assert R.draining(case(node(state="IDLE"), booked=True)) is None


def test_cooldown_waits_after_the_last_repair():
    # an incident first seen after the last repair's cooldown began... and still inside it: a relapse
    d = R.cooldown(case(node(history=hist(cooldown=NOW + 600)), booked=True))
    assert (d.action, d.rule) == ("escalate", "relapse")
    off = RepairConfig.from_dict({"escalate": {"relapse": False}})
    d = R.cooldown(case(node(history=hist(cooldown=NOW + 600)), config=off, booked=True))
    assert (d.rule, d.earliest) == ("cooldown", NOW + 600)
    # an incident that began after the cooldown ended, and one whose steps already began: no relapse
    assert R.cooldown(case(node(history=hist(t0=NOW - 60, cooldown=NOW - 120)), booked=True)) is None
    d = R.cooldown(case(node(history=hist(cooldown=NOW + 600, steps=[("reset_gpu", NOW - 60, "failed")])),
                        booked=True))
    assert d.rule == "cooldown"
    assert R.cooldown(case(node(history=hist(cooldown=None)), booked=True)) is None


# --- 9. the next step ------------------------------------------------------------------------------------------
def test_lemon_retires_a_node_with_too_many_incidents():
    past = [(NOW - k * D, "gpu_memory") for k in (2, 5, 9)]
    assert R.lemon(case(node(history=hist(past=past)), booked=True))[:2] == ("replace", "lemon")
    tried = hist(past=past, steps=[("replace", NOW - H, "failed")])
    assert R.lemon(case(node(history=tried), booked=True))[:2] == ("escalate", "lemon")
    assert R.lemon(case(node(history=hist(past=past[:2])), booked=True)) is None


def test_escalate_repairs_after_too_many_repairs_in_the_window():
    many = hist(repairs=[(NOW - k * D, "reboot") for k in (1, 2, 3, 4, 5)])
    assert R.escalate_repairs(case(node(history=many), booked=True))[:2] == ("escalate", "escalate_repairs")
    assert R.escalate_repairs(case(node(history=hist(repairs=[(NOW - D, "reboot")])), booked=True)) is None


def test_incident_attempts_escalates_when_the_incident_used_its_attempts():
    steps = [("reset_gpu", NOW - 3 * H, "failed"), ("reboot", NOW - 2 * H, "failed"), ("reimage", NOW - H, "failed")]
    got = R.incident_attempts(case(node(history=hist(steps=steps)), booked=True))
    assert got[:2] == ("escalate", "incident_attempts")
    assert R.incident_attempts(case(node(history=hist(steps=steps[:2])), booked=True)) is None


def test_ladder_takes_the_next_rung_from_the_reports_action():
    assert R.ladder(case(node(history=hist()), booked=True))[:2] == ("reset_gpu", "ladder")
    c = case(node(rep=report(action="reboot"), history=hist()), booked=True)
    assert R.ladder(c)[:2] == ("reboot", "ladder")  # skips reset_gpu
    done = hist(steps=[("reset_gpu", NOW - 2 * H, "failed"), ("reboot", NOW - H, "failed"),
                       ("replace", NOW - H, "failed")])
    assert R.ladder(case(node(history=done), booked=True))[:2] == ("escalate", "ladder_exhausted")
    assert R.ladder_start(("reset_gpu", "reboot"), "replace") == 1  # more than the ladder offers: the last rung
    assert R.ladder_start(("reset_gpu", "reboot"), "none") == 0


def test_next_step_asks_lemon_then_escalation_then_attempts_then_the_ladder():
    past = [(NOW - k * D, "gpu_memory") for k in (2, 5, 9)]
    many = [(NOW - k * D, "reboot") for k in (1, 2, 3, 4, 5)]
    assert R.next_step(case(node(history=hist(past=past, repairs=many)), booked=True))[1] == "lemon"
    assert R.next_step(case(node(history=hist(repairs=many)), booked=True))[1] == "escalate_repairs"
    assert R.next_step(case(node(history=hist()), booked=True))[1] == "ladder"


# --- 10. the step ----------------------------------------------------------------------------------------------
def test_budget_waits_until_a_slot_frees():
    used = hist(repairs=[(NOW - 3 * H, "reboot"), (NOW - 2 * H, "reset_gpu"), (NOW - H, "reset_gpu")])
    d = R.budget(case(node(history=used), booked=True), "reboot")
    assert (d.rule, d.earliest) == ("budget", NOW - 3 * H + D)
    assert R.budget(case(node(history=hist()), booked=True), "reboot") is None


def test_blast_radius_holds_a_step_over_the_limits():
    c = case(node(history=hist()), fl=fleet(total=8, unavailable=7), booked=True)  # below min_healthy 25 %
    d = R.blast_radius(c, "reset_gpu")
    assert d.rule == "min_healthy" and d.action == "hold" and "below min_healthy" in d.reason
    one = RepairConfig.from_dict({"blast_radius": {"max_unavailable": 8, "max_parallel": 1, "min_healthy": 0}})
    busy = case(node(history=hist()), config=one, booked=True)
    busy.limits.take_active(busy.n, started_now=True)  # one repair already started in this run
    d = R.blast_radius(busy, "reset_gpu")
    assert d.rule == "blast_radius" and "max_parallel 1" in d.reason, d
    assert R.blast_radius(case(node(history=hist()), booked=True), "reset_gpu") is None


def test_start_step_writes_the_intent_calls_the_hook_and_takes_a_spare():
    c = case(node(history=hist()), booked=True)
    d = R.start_step(c, "replace", "ladder", "why")
    after = loads(d.history_after)
    assert after.incident.pending().action == "replace" and after.incident.hooks == ("replace",)
    assert d.hook.idempotency_key == R.hook_key("node2", f"1@{NOW - H}", "replace")
    assert d.spare.spare == "spare1" and d.needs_approval and not d.runnable  # a replacement waits for a person
    assert c.limits.parallel == 0  # and takes no slot while it waits
    assert loads(d.history).incident.pending() is None  # the bookkeeping history has no intent
    c = case(node(history=hist()), config=RepairConfig.from_dict({"approval_for": []}), booked=True)
    assert R.start_step(c, "replace", "ladder", "why").runnable and c.limits.parallel == 1


def test_approval_for_gates_its_actions_in_automatic_mode():
    config = RepairConfig.from_dict({"approval_for": ["reboot"]})
    assert config.approval_for == ("reboot",) and RepairConfig().approval_for == ("replace",)
    assert config.to_dict()["approval_for"] == ["reboot"]
    d = R.start_step(case(node(history=hist()), config=config, booked=True), "reboot", "ladder", "why")
    assert d.needs_approval and not d.runnable and "[waiting for approval node2:reboot:1]" in d.reason
    d = R.start_step(case(node(history=hist()), config=config, booked=True), "reset_gpu", "ladder", "why")
    assert d.runnable and not d.needs_approval
    with pytest.raises(RepairError, match=r"approval_for\[0\]: expected one of reset_gpu, reboot, reimage, "
                                          r"replace, evict, got 'drain'"):
        RepairConfig.from_dict({"approval_for": ["drain"]})
    with pytest.raises(RepairError, match=r"approval_for: expected a list of actions"):
        RepairConfig.from_dict({"approval_for": "replace"})


def test_gate_waits_for_approval_of_a_changing_action():
    config = RepairConfig.from_dict({"modes": {"default": "approval"}})
    d = R.start_step(case(node(history=hist()), config=config, booked=True), "reset_gpu", "ladder", "why")
    assert d.needs_approval and not d.runnable and "[waiting for approval node2:reset_gpu:1]" in d.reason
    c = case(node(history=hist()), config=config, approved={("node2", "reset_gpu", "1")}, booked=True)
    d = R.start_step(c, "reset_gpu", "ladder", "why")
    assert d.approved and d.runnable


def test_decide_runs_the_rules_in_order():
    assert R.decide(case(node(reason="bios", history=hist()))).rule == "not_ours"
    assert R.decide(case(node(history=hist(t0=NOW - 60)), brk=TRIPPED)).rule == "breaker"  # breaker before ttl
    assert R.decide(case(node(history=hist()))).rule == "ladder"
    names = [r.__name__ for r in R.BEFORE_BOOKING + R.NOTHING_TO_REPAIR + R.WAITING + R.NEXT_STEP_RULES
             + R.STEP_LIMITS]
    assert names == ["foreign_history", "not_ours", "no_report", "in_progress", "drain_requested", "healthy",
                     "degraded_monitor", "escalated", "breaker", "ttl", "drain", "draining", "cooldown", "lemon",
                     "escalate_repairs", "incident_attempts", "budget", "blast_radius"]


def test_mk_inc_fills_the_fields_it_passes_by_position():
    # Case.mk_inc passes Decision's first 18 fields by position: a reordered Decision must fail here, not
    # shift a partition into a code
    from dataclasses import fields

    from ansible_collections.gpufleet.reliability.plugins.module_utils.repair import Decision

    assert [f.name for f in fields(Decision)][:18] == ["node", "action", "reason", "earliest", "needs_approval",
                                                       "failure_class", "incident", "partition", "code", "gpu",
                                                       "approved", "runnable", "verify", "spare", "hook", "hist",
                                                       "hist_after", "rule"]
    c = case(node(history=hist()), booked=True)
    after = c.hist.copy()
    for kw in ({"since": NOW - 9}, {}):  # with a field past rule (keywords), and without (all by position)
        d = c.mk_inc("wait", "why", "ttl", earliest=NOW + 5, hist=c.hist, hist_after=after, **kw)
        assert (d.node, d.action, d.reason, d.earliest, d.needs_approval, d.failure_class, d.incident, d.partition,
                d.code, d.gpu, d.rule, d.since) == ("node2", "wait", "why", NOW + 5, False, c.cls, "1", "gpu", c.code,
                                                    c.gpu, "ttl", kw.get("since"))
        assert (d.approved, d.runnable, d.verify, d.spare, d.hook, d.jobs) == (False, False, False, None, None, None)
        assert d.hist is c.hist and d.hist_after is after and d.slurm_reason is None


# --- the limits, in one place ----------------------------------------------------------------------------------
def test_limits_arithmetic():
    assert breaker_threshold(CONFIG, 100) == 50 and breaker_threshold(CONFIG, 2) == 3  # min_nodes 3
    from ansible_collections.gpufleet.reliability.plugins.module_utils.repair import Limit

    assert limit_of(Counts(10, 10, 0), Limit(share=0.01)) == 1  # a share never rounds below one node
    assert limit_of(Counts(10, 10, 0), Limit(count=0)) == 0
    h = loads(hist(repairs=[(NOW - 3 * H, "reboot"), (NOW - 2 * H, "reboot"), (NOW - H, "reboot")]))
    assert budget_free_at(h, CONFIG, NOW) == NOW - 3 * H + D
    assert budget_free_at(h, CONFIG, NOW + D) is None


@pytest.mark.parametrize("spares", [["s1", "s2", "s3"], ("s1", "s2", "s3")], ids=["list", "tuple"])
def test_hot_spares_are_taken_in_order_each_once(spares):
    fl = FleetSummary(8, {"gpu": Counts(8, 8, 0, spares)})
    lim = Limits(fl, RepairConfig.from_dict({}))
    a, b = NodeState.from_dict(in_service("a")), NodeState.from_dict(in_service("b"))
    got = [lim.take_spare(a), lim.take_spare(b), lim.take_spare(a), lim.take_spare(b)]
    assert [m.spare if m else None for m in got] == ["s1", "s2", "s3", None]
    assert [m.for_node for m in got[:3]] == ["a", "b", "a"]
    assert list(fl.partitions["gpu"].spares) == ["s1", "s2", "s3"]  # the fleet's own list is not consumed


def test_limits_count_drains_and_repairs_of_one_plan():
    lim = Limits(FleetSummary.from_dict(fleet(total=8, unavailable=0)), RepairConfig.from_dict(
        {"blast_radius": {"max_unavailable": 2, "min_healthy": 0, "max_parallel": 1}}))
    a, b = NodeState.from_dict(in_service("a")), NodeState.from_dict(in_service("b"))
    assert lim.drain_block(a) is None
    lim.take_drain(a)
    lim.take_drain(b)
    assert "3 nodes unavailable in partition gpu (limit 2)" in lim.drain_block(a)
    assert lim.repair_block(a) is None
    lim.take_active(a, started_now=True)
    assert "max_parallel 1" in lim.repair_block(b) or "under repair" in lim.repair_block(b)
    lim.release(a)
    assert lim.active[("partition", "gpu")] == 0


@pytest.mark.parametrize("state, flags, out, busy", [
    ("IDLE", (), False, False), ("idle", ("DRAIN",), True, False), ("MIXED+DRAIN", (), True, True),
    ("drained", (), True, False), ("draining", (), True, True), ("down*", (), True, False),
    ("allocated", (), False, True), ("IDLE", ("COMPLETING",), False, True), ("fail", (), True, False),
])
def test_node_state_applies_the_owner_rules(state, flags, out, busy):
    n = NodeState.from_dict({"name": "n", "partition": "gpu", "state": state, "flags": list(flags),
                             "reason": "gpufleet: x"})
    assert (n.out_of_service, n.busy) == (out, busy)
    assert n.drained_by("gpufleet:") == out and (n.foreign("gpufleet:") is None)
    other = NodeState.from_dict({"name": "n", "partition": "gpu", "state": state, "flags": list(flags),
                                 "reason": "bios"})
    assert other.drained_by("gpufleet:") is False and (other.foreign("gpufleet:") is not None) == out


# --- typed inputs ----------------------------------------------------------------------------------------------
def test_plan_on_typed_inputs_equals_plan_on_dicts_and_changes_no_input():
    recs = [node("n1", history=hist(steps=[("reset_gpu", NOW - 700, None)])), in_service("n2"),
            node("n3", rep=HEALTHY, history=hist(steps=[("reboot", NOW - 900, "ok")])),
            node("n4", history="not ours"), node("n5", history='{"gf":1,"i":'), node("n6", reason="bios")]
    fl = fleet(total=16, unavailable=4)
    typed = [NodeState.from_dict(r, i) for i, r in enumerate(recs)]
    before = [(t.history.copy() if t.history is not None else None) for t in typed]
    a = plan(fl, recs, CONFIG, NOW)
    b = plan(FleetSummary.from_dict(fl), typed, CONFIG, NOW)
    assert [d.to_dict() for d in a] == [d.to_dict() for d in b]
    assert [t.history for t in typed] == before  # plan() worked on copies
    assert {d.node: d.rule for d in b} == {"n1": "ladder", "n2": "ttl", "n3": "healthy_resume",
                                           "n4": "foreign_history", "n5": "history_unreadable", "n6": "not_ours"}
    assert (typed[3].history_foreign, typed[4].history_error is not None, typed[1].history_empty) == (True, True, True)
    # a decision's history is a History object; its text is the stored form
    d = next(d for d in b if d.node == "n3")
    assert d.history_after == json.dumps(json.loads(d.history_after), separators=(",", ":"), sort_keys=True)
    assert loads(d.history_after) == d.hist_after


def test_decision_history_text_follows_its_history_object():
    from ansible_collections.gpufleet.reliability.plugins.module_utils.repair import dumps

    d = R.start_step(case(node(history=hist()), booked=True), "reset_gpu", "ladder", "why")
    assert d.history == dumps(d.hist) and d.history_after == dumps(d.hist_after) != d.history
    d.hist = d.hist_after  # another History object: the text follows
    assert d.history == d.history_after and d.to_dict()["history"] == d.history_after
    d.history = None  # leave the field as it is
    assert d.hist is None and d.to_dict()["history"] is None
    d.history = hist(seq=7)
    assert d.hist.seq == 7 and d.history == hist(seq=7)


@pytest.mark.parametrize("state, flags", [("FAILING", ()), ("IDLE", ("DOWN",))])
def test_plan_counts_out_of_service_as_the_ownership_rule_does(state, flags):
    """sinfo's failing state and the DOWN flag: out of service for the policy too (it used to plan such a node of
    ours as in service: 'healthy and in service; nothing to do' instead of resuming it)."""
    ours = dict(node(rep=HEALTHY, state=state, flags=flags, history=hist(steps=[("reboot", NOW - 900, "ok")])),
                reason="gpufleet: xid48 gpu3")
    assert plan(fleet(), [ours], CONFIG, NOW)[0].rule == "healthy_resume"
    theirs = dict(ours, reason="hardware swap")
    assert plan(fleet(), [theirs], CONFIG, NOW)[0].rule == "not_ours"
