# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The job action: what plan() decides for the jobs on a node it drained (docs/jobs.md), and the Slurm edge that
reads them (squeue's job lines, hostile comments included)."""

from __future__ import annotations

import time

import pytest

from ansible_collections.gpufleet.reliability.plugins.module_utils.repair import policy
from ansible_collections.gpufleet.reliability.plugins.module_utils.repair.config import RepairConfig
from ansible_collections.gpufleet.reliability.plugins.module_utils.repair.history import (
    Eviction,
    History,
    HistoryError,
    dumps,
    loads,
)
from ansible_collections.gpufleet.reliability.plugins.module_utils.repair.model import RepairError
from ansible_collections.gpufleet.reliability.plugins.module_utils.repair.rules import requeue_after_eviction
from ansible_collections.gpufleet.reliability.plugins.module_utils.slurm.errors import SlurmError
from ansible_collections.gpufleet.reliability.plugins.module_utils.slurm.parse import parse_job_records

NOW = 1_800_000_000.0
REPORT = {"verdict": "unhealthy", "action": "reset_gpu", "code": "xid48", "gpu": 3, "findings": []}


def fleet(spares=("spare1",)):
    return {"partitions": {"gpu": {"total": 10, "available": 9, "unavailable": 1, "spares_idle": list(spares)}}}


def node(jobs=(("12", "RUNNING"),), history=None, state="MIXED+DRAIN", reason="gpufleet: xid48 gpu3", **kw):
    rec = {"name": "n1", "partition": "gpu", "state": state, "reason": reason, "reason_time": NOW - 600,
           "report": REPORT, "report_time": NOW,
           "jobs": None if jobs is None else [
               dict(job_id=j[0], state=j[1], **(j[2] if len(j) > 2 else {})) for j in jobs]}
    if history is not None:
        rec["history"] = history
    rec.update(kw)
    return rec


def decide(n, config=None, now=NOW, spares=("spare1",), **kw):
    cfg = {"ttl": 0}
    cfg.update(config or {})
    return policy.plan(fleet(spares), [n], cfg, now, **kw)[0]


def evicted(job="12", at=NOW, kind="c"):
    """The history a first evict decision wrote (its intent), for the runs after it."""
    d = decide(node(jobs=((job, "RUNNING"),)), now=at,
               config={"jobs": {"action": "requeue" if kind == "r" else "checkpoint_requeue"}})
    assert d.action == "evict" and d.history_after is not None
    return d.history_after


def test_checkpoint_requeue_is_the_default_with_the_spare_first_and_the_intent_recorded():
    d = decide(node())
    assert (d.action, d.rule, d.runnable) == ("evict", "evict", True)
    assert d.jobs.action == "checkpoint_requeue" and d.jobs.phase == "signal" and d.jobs.job_ids == ("12",)
    assert (d.jobs.signal, d.jobs.signal_to, d.jobs.grace, d.jobs.waits_for_nodes) == ("USR1", "steps", 600.0, 0)
    assert d.spare is not None and d.spare.spare == "spare1" and "hot spare spare1 brought into gpu first" in d.reason
    inc = loads(d.history_after).incident
    assert inc.eviction == Eviction(int(NOW), "checkpoint_requeue", ("12",)) and inc.spare == "spare1"
    assert d.to_dict()["jobs"]["job_ids"] == ["12"]


def test_without_a_spare_the_decision_says_the_job_waits_for_a_node():
    d = decide(node(), spares=())
    assert d.action == "evict" and d.spare is None and d.jobs.waits_for_nodes == 1
    assert "no idle hot spare: the requeued job(s) wait for 1 node" in d.reason


def test_wait_keeps_todays_behaviour_and_by_class_overrides():
    d = decide(node(), config={"jobs": {"action": "wait"}})
    assert (d.action, d.rule) == ("wait", "draining") and d.earliest == NOW + 60
    # xid48 is a gpu_memory finding: its class can say otherwise than the default
    d = decide(node(), config={"jobs": {"action": "wait", "by_class": {"gpu_memory": "requeue"}}})
    assert (d.action, d.jobs.action, d.jobs.phase) == ("evict", "requeue", "requeue")


def test_jobs_not_read_are_never_evicted():
    d = decide(node(jobs=None))
    assert (d.action, d.rule) == ("wait", "draining") and "not read" in d.reason


@pytest.mark.parametrize("job, config, why", [
    (("12", "RUNNING", {"requeue": False}), {}, "job 12 is not requeueable"),
    (("12", "RUNNING", {"comment": "llm run gpufleet:no-evict please"}), {}, "job 12 opted out (its comment"),
    (("12", "RUNNING", {"qos": "hero"}), {"jobs": {"opt_out_qos": ["hero"]}}, "job 12 opted out (QOS hero"),
])
def test_a_job_that_may_not_be_evicted_keeps_the_node(job, config, why):
    d = decide(node(jobs=(job,)), config=config)
    assert (d.action, d.rule) == ("wait", "job_kept") and why in d.reason, d.reason
    # beside an evictable one, only the evictable one goes; the reason names the one kept
    d = decide(node(jobs=(job, ("13", "RUNNING"))), config=config)
    assert d.action == "evict" and d.jobs.job_ids == ("13",) and d.jobs.kept and why in d.jobs.kept[0]


def test_a_job_that_is_not_on_the_node_or_not_running_is_not_evicted():
    d = decide(node(jobs=(("12", "RUNNING", {"on_node": False}), ("14", "PENDING"))))
    assert (d.action, d.rule) == ("wait", "draining")


def test_an_eviction_storm_is_held_loudly_past_the_limit():
    # three nodes, each drained by us with a job on it; at most two evictions per window
    nodes = [dict(node(jobs=((str(20 + i), "RUNNING"),)), name=f"n{i}", reason_time=NOW - 600 + i) for i in range(3)]
    storm = {"ttl": 0, "jobs": {"max_evictions": 2}, "breaker": {"min_nodes": 10}}
    plan = policy.plan(fleet(("s1", "s2", "s3")), nodes, storm, NOW)
    got = {d.node: (d.action, d.rule) for d in plan}
    assert got == {"n0": ("evict", "evict"), "n1": ("evict", "evict"), "n2": ("hold", "eviction_limit")}, got
    held = [d for d in plan if d.rule == "eviction_limit"][0]
    assert "2 evictions within 60 min already (jobs.max_evictions 2)" in held.reason
    # evictions on record (another node's history) count too: a later plan does not start a third
    rec = dict(nodes[0], jobs=[], state="IDLE+DRAIN", history=plan[0].history_after)
    rec1 = dict(nodes[1], jobs=[], state="IDLE+DRAIN", history=plan[1].history_after)
    later = policy.plan(fleet(("s3",)), [rec, rec1, nodes[2]], storm, NOW + 60)
    assert {d.node: d.rule for d in later}["n2"] == "eviction_limit"
    # outside the window they no longer count
    later = policy.plan(fleet(("s3",)), [rec, rec1, nodes[2]], storm, NOW + 3601)
    assert {d.node: d.rule for d in later}["n2"] == "evict"


def test_approval_mode_gates_the_eviction_with_a_key_of_its_own():
    d = decide(node(), config={"modes": {"default": "approval"}})
    assert d.action == "evict" and d.needs_approval and not d.runnable
    assert d.approval_key == ("n1", "evict", "1")
    d = decide(node(), config={"modes": {"default": "approval"}}, approvals=["n1:evict:1"])
    assert d.runnable and d.approved
    # approval_for: [evict] asks for a person in automatic mode too
    d = decide(node(), config={"approval_for": ["evict", "replace"]})
    assert d.needs_approval and not d.runnable


def test_a_run_killed_after_the_signal_converges():
    hist = evicted()
    # within the grace, the job still on the node: wait for it (no second signal)
    d = decide(node(history=hist), now=NOW + 100)
    assert (d.action, d.rule, d.earliest) == ("wait", "evicting", NOW + 600) and d.jobs is None
    # past the grace, still there: it ignored the signal, requeued anyway
    d = decide(node(history=hist), now=NOW + 601)
    assert (d.action, d.rule, d.runnable, d.jobs.phase, d.jobs.job_ids) == (
        "evict", "grace_expired", True, "requeue", ("12",))
    # it left the node in an end state but COMPLETED before the run could requeue it: requeued now
    for state in ("FAILED", "CANCELLED", "NODE_FAIL", "TIMEOUT"):
        d = decide(node(jobs=(("12", state, {"on_node": False}),), state="IDLE+DRAIN", history=hist), now=NOW + 60)
        assert (d.action, d.rule, d.jobs.phase) == ("evict", "requeue_evicted", "requeue"), state


def test_a_run_killed_after_the_requeue_converges_and_the_ladder_goes_on():
    hist = evicted()
    for jobs in ((("12", "PENDING", {"on_node": False}),), (("12", "RUNNING", {"on_node": False}),),
                 (("12", "COMPLETED", {"on_node": False}),), ()):
        d = decide(node(jobs=jobs, state="IDLE+DRAIN", history=hist), now=NOW + 60)
        assert (d.action, d.rule) == ("reset_gpu", "ladder"), (jobs, d.action, d.rule)
        ev = loads(d.history_after).incident.eviction
        assert ev.done == int(NOW + 60) and ev.jobs == ("12",)
    # done, recorded: the plans after it never requeue the job again, whatever becomes of it
    h = loads(d.history_after)
    h.incident.steps = ()
    d = decide(node(jobs=(("12", "FAILED", {"on_node": False}),), state="IDLE+DRAIN", history=dumps(h)),
               now=NOW + 120)
    assert d.action == "reset_gpu"


def test_requeue_kind_requeues_at_once_and_after_a_crash():
    d = decide(node(), config={"jobs": {"action": "requeue"}})
    assert (d.action, d.jobs.phase) == ("evict", "requeue") and "lost" in d.reason
    hist = evicted(kind="r")
    d = decide(node(history=hist), now=NOW + 5, config={"jobs": {"action": "requeue"}})
    assert (d.action, d.rule, d.jobs.phase) == ("evict", "requeue_evicted", "requeue")


@pytest.mark.parametrize("state, on_node, want", [
    ("RUNNING", True, True), ("COMPLETING", True, True), ("RUNNING", False, False), ("PENDING", False, False),
    ("REQUEUED", False, False), ("COMPLETED", False, False), ("FAILED", False, True), ("CANCELLED", False, True),
    ("OUT_OF_MEMORY", False, True),
])
def test_requeue_after_eviction(state, on_node, want):
    assert requeue_after_eviction(state, on_node) is want


def test_a_drain_and_an_eviction_ask_for_a_follow_up():
    got = policy.followups([], [{"node": "n1", "action": "drain"}, {"node": "n2", "action": "evict"},
                                {"node": "n3", "action": "evict", "check_mode": True}], NOW)
    assert got == {"n1": int(NOW + 60), "n2": int(NOW + 60)}


def test_jobs_config_errors_name_the_field():
    for bad, msg in (({"action": "kill"}, "jobs.action: expected one of wait, requeue, checkpoint_requeue"),
                     ({"signal": "KILL"}, "jobs.signal: expected a signal name"),
                     ({"signal_to": "all"}, "jobs.signal_to: expected one of steps, batch, full"),
                     ({"grace": "-1"}, "jobs.grace: expected a duration"),
                     ({"max_evictions": -1}, "jobs.max_evictions: expected an integer >= 0"),
                     ({"opt_out_qos": "hero"}, "jobs.opt_out_qos: expected a list of QOS names"),
                     ({"by_class": {"gpu": "drop"}}, "jobs.by_class.gpu: expected one of"),
                     ({"nope": 1}, "jobs: unknown key(s) nope")):
        with pytest.raises(RepairError, match=msg.replace("(", r"\(").replace(")", r"\)")):
            RepairConfig.from_dict({"jobs": bad})
    c = RepairConfig.from_dict({"jobs": {"signal": "SIGUSR2", "grace": "2m", "by_class": {"thermal": "wait"}}})
    assert (c.job_signal, c.job_grace_s, c.job_action_for("thermal"), c.job_action_for("gpu")) == (
        "USR2", 120.0, "wait", "checkpoint_requeue")
    assert RepairConfig.from_dict(c.to_dict()) == c


def test_the_eviction_in_the_history_round_trips_and_hostile_text_is_refused():
    h = History()
    h.open("gpu", "xid48", 3, NOW)
    h.incident.eviction = Eviction(int(NOW), "checkpoint_requeue", ("12", "13_4"), int(NOW + 9))
    assert loads(dumps(h)).incident.eviction == h.incident.eviction
    text = dumps(h)
    for evil in ('[1,"c","12;rm -rf /"]', '[1,"z","12"]', '[1,"c",12]', '[1,"c","' + ",".join(["1"] * 17) + '"]',
                 '"12"'):
        bad = text.replace('"ev":[' + text.split('"ev":[')[1].split("]")[0] + "]", '"ev":' + evil)
        with pytest.raises(HistoryError, match="i.ev"):
            loads(bad)


SEP = "\x1f"


def test_squeue_job_lines_hostile_comments_and_genuine_ones():
    line = SEP.join(["12", "RUNNING", "1", "normal", "node[1-3]", "2026-12-06T16:21:29",
                     "train " + SEP + "RUNNING" + SEP + "0"]) + SEP
    jobs = parse_job_records(line + "\n" + SEP.join(["13_4", "PENDING", "0", "(null)", "", "N/A", "(null)"])
                             + SEP + "\n")
    assert jobs == [
        {"job_id": "12", "state": "RUNNING", "requeue": True, "qos": "normal", "nodes": "node[1-3]",
         "eligible": int(time.mktime((2026, 12, 6, 16, 21, 29, 0, 0, -1))),
         "comment": "train " + SEP + "RUNNING" + SEP + "0"},
        {"job_id": "13_4", "state": "PENDING", "requeue": False, "qos": "", "nodes": "", "eligible": None,
         "comment": ""}]
    # a comment with a newline splits a job over two lines: refused, never guessed
    for text in ("12" + SEP + "RUNNING" + SEP + "1" + SEP + SEP + "n1" + SEP + "None" + SEP + "a\nb" + SEP,
                 "12;x" + SEP + "RUNNING" + SEP + "1" + SEP + SEP + "n1" + SEP + "None" + SEP + SEP,
                 "12" + SEP + "RUNNING" + SEP + "yes" + SEP + SEP + "n1" + SEP + "None" + SEP + SEP,
                 "12" + SEP + "RUNNING" + SEP + "1" + SEP + "n1" + SEP + "None"):  # a field short
        with pytest.raises(SlurmError, match="cannot parse squeue job line"):
            parse_job_records(text)
