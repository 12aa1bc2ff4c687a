# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The repair rules, each a small function, in the order they apply to one node (docs/repair.md has the table).

A rule reads the node's :class:`Case` and returns a Decision, or None to let the next rule decide. Its name is the
``rule`` field of every decision it makes. :func:`decide` runs them in order:

1. ``foreign_history``, ``not_ours``: the history field holds someone else's text, or the node is out of service
   with a reason that is not ours -> hold, never touched (our open incident on it is closed with a note).
   ``no_report``: a node in service without a report -> hold.
2. ``in_progress``: a step in progress counts only on proof that it ran (its own record after a reset; a boot
   after the intent for a reboot) -> wait, until a report newer than the proof verifies it (ok -> resume), fails
   it, or it times out; without proof it is never failed and ends ``unproven`` (offered again, not counted as
   tried); a reboot Slurm never took is forgotten.
3. ``drain_requested``: degraded and the health check asks for a drain -> drain (within the breaker and the
   limits) while in service, then hold for a person.
   ``healthy``: healthy (or degraded with nothing to do and ``resume_degraded``) -> resume when drained by us
   (``healthy_resume``), else ``healthy_in_service`` or ``breaker``; ``degraded_monitor`` otherwise.
4. ``escalated``: the incident was escalated -> hold until a person takes the node back.
5. ``breaker``: the circuit breaker is tripped -> hold.
6. ``ttl``: the finding must persist ``ttl`` -> wait (flap suppression).
7. ``drain``: still in service -> drain (``blast_radius_drain``: hold when a limit forbids it).
   Jobs still on it -> the class's job action (``jobs.action``): ``draining`` waits for them; ``evict`` signals
   them to checkpoint and requeues them (or requeues them at once), a hot spare brought in first; ``job_kept``
   waits for a job never evicted; ``eviction_limit`` holds past ``jobs.max_evictions``; while the eviction is
   under way ``evicting`` waits out the grace, ``grace_expired`` / ``requeue_evicted`` requeue what is left.
8. ``cooldown``: after the last repaired incident -> wait; an incident that began inside it (a relapse) ->
   escalate (``relapse``, unless ``escalate.relapse`` is off).
9. ``next_step``: ``lemon`` (N incidents in M days) -> replace, ``escalate_repairs`` (N repairs in M days) and
   ``incident_attempts`` -> escalate; ``ladder``: the next rung of the class's ladder (``ladder_exhausted`` ->
   escalate).
10. ``budget``: retry budget used -> wait; ``min_healthy``/``blast_radius``: a limit forbids the step -> hold;
    approval mode -> needs approval (``gate``).

The limits themselves (blast radius, concurrency, spares, budget, breaker) live in limits.py.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from ..slurmfacts import JOB_ACTIVE_STATES, JOB_QUEUED_STATES, REBOOT_FLAGS
from .classify import classify
from .config import RepairConfig
from .history import MAX_EVICT_JOBS, Eviction, History, Incident, Step, loads
from .limits import Limits, budget_free_at
from .model import (
    CHANGING_ACTIONS,
    REPAIR_STEPS,
    RULE_BLAST_RADIUS_DRAIN,
    RULE_BREAKER,
    RULE_DRAINING,
    RULE_EVICTION_LIMIT,
    RULE_JOB_KEPT,
    RULE_LEMON,
    SEVERITY,
    BreakerState,
    Decision,
    HookCall,
    JobStep,
)
from .state import JobInfo

# Steps done by someone else (a hook): a sick report meanwhile does not fail them; they end healthy or time out.
LONG_STEPS = ("reimage", "replace")
#: A step without a configured timeout times out after this many seconds.
DEFAULT_STEP_TIMEOUT_S = 1800.0
BREAKER_HELD = "circuit breaker tripped, a person checks the fleet and resets it"

Approvals = Set[Tuple[str, str, str]]


class Case:
    """One node being decided: its state, its (working copy of the) history, the report and the plan's context.

    ``hist`` is None when the history field holds someone else's text. ``pending_before`` is the step in progress
    as it came in, kept by the in-progress rule when it sets the step's outcome (``before()`` gives the history as
    it came in); ``booked`` the history with the incident opened or updated (rules 4-10 return it unchanged).
    """

    __slots__ = ("n", "hist", "verdict", "report_action", "code", "gpu", "t0", "config", "limits", "brk",
                 "approved", "now", "part", "actionable", "pending_before", "booked", "cls", "out", "why_foreign")

    def __init__(self, n: Any, hist: Optional[History], verdict: str, report_action: str, code: str,
                 gpu: Optional[int], t0: float, config: RepairConfig, limits: Limits, brk: BreakerState,
                 approved: Approvals, now: float, foreign: Optional[str], out: Optional[bool] = None):
        self.n = n
        self.hist = hist
        self.verdict = verdict
        self.report_action = report_action
        self.code = code
        self.gpu = gpu
        self.t0 = t0
        self.config = config
        self.limits = limits
        self.brk = brk
        self.approved = approved
        self.now = now
        self.part: Optional[str] = n.partitions[0] if n.partitions else None
        self.actionable = verdict in ("unhealthy", "unknown") or (
            verdict == "degraded" and report_action in REPAIR_STEPS)
        self.pending_before: Optional[Step] = None
        self.booked: Optional[History] = None
        self.cls: str = ""
        #: the node's Slurm facts, read once per plan (a plan never changes a node's record): out of service, and
        #: why the node is not ours (``n.foreign(config.reason_prefix)``); plan() reads both up front
        self.out: bool = n.out_of_service if out is None else out
        self.why_foreign = foreign

    def mk(self, action: str, reason: str, rule: str, earliest: Optional[float] = None, **kw: Any) -> Decision:
        # node, action, reason, earliest by position (see mk_inc)
        return Decision(self.n.name, action, reason, float(self.now if earliest is None else earliest),
                        partition=self.part, code=self.code, gpu=self.gpu, rule=rule, **kw)

    def before(self) -> Optional[History]:
        """The history as it came in: before the in-progress rule set the pending step's outcome."""
        hist, step = self.hist, self.pending_before
        if step is None or hist is None or hist.incident is None:
            return hist
        out = hist.copy()
        if out.incident is None:  # a rule reached without what the rule order guarantees
            raise AssertionError("repair rule order: out.incident is not None")
        out.incident.steps = (*out.incident.steps[:-1], step)  # finish() replaced the pending step
        return out

    def mk_inc(self, action: str, reason: str, rule: str, earliest: Optional[float] = None,
               hist: Optional[History] = None, hist_after: Optional[History] = None, **kw: Any) -> Decision:
        """mk() for rules 4-10 (and a resume): the decision names the incident (if one is open) and the failure
        class (``cls``)."""
        inc = self.hist.incident if self.hist is not None else None
        at = float(self.now if earliest is None else earliest)
        incident = None if inc is None else str(inc.id)
        # Decision's fields by position (node, action, reason, earliest, needs_approval, failure_class, incident,
        # partition, code, gpu, then approved ... rule; test_repair_rules pins the order): matching keywords to its
        # 21 parameters cost more than the rest of this call
        if kw:
            return Decision(self.n.name, action, reason, at, False, self.cls, incident, self.part, self.code, self.gpu,
                            rule=rule, hist=hist, hist_after=hist_after, **kw)
        return Decision(self.n.name, action, reason, at, False, self.cls, incident, self.part, self.code, self.gpu,
                        False, False, False, None, None, hist, hist_after, rule)

    def foreign(self) -> Optional[str]:
        return self.why_foreign


def inc_kw(inc: Optional[Incident]) -> Dict[str, Any]:
    if inc is None:
        return {}
    return {"incident": str(inc.id), "failure_class": inc.failure_class}


def held_reason(n: Any, config: RepairConfig, code: Optional[str], why: str) -> Optional[str]:
    """The Slurm reason that tells an operator why a node we keep out of service waits (None: leave it)."""
    if not n.out_of_service or n.foreign(config.reason_prefix):
        return None
    text = "{} held{}: {}".format(config.reason_prefix, f" ({code})" if code else "", why)
    return text[:250]


def breaker_in_slurm(nodes: Any, brk: BreakerState, prefix: str) -> Optional[BreakerState]:
    """The breaker as Slurm keeps it: a tripped state when nodes still show our breaker hold, set after the last
    reset (or with no reset on record), while the stored state says it is not tripped; else None.

    The state file is the breaker's first home; the held nodes' reasons are its second. A trip whose state could
    not be saved (a full or read-only state directory) still holds the fleet on the next run, and a person's reset
    (``reset_at``, later than every note) ends it.
    """
    if brk.tripped:
        return None
    suffix = ": " + BREAKER_HELD
    start = prefix + " held"
    held = []
    for n in nodes:
        reason = n.reason
        if not reason.startswith(start) or not reason.endswith(suffix) or n.reason_time is None:
            continue
        if not n.out_of_service or n.foreign(prefix):
            continue
        if brk.reset_at is None or n.reason_time > brk.reset_at:
            held.append(n)
    if not held:
        return None
    return BreakerState(tripped=True, since=min(float(n.reason_time) for n in held), reset_at=brk.reset_at,
                        nodes=sorted(n.name for n in held),
                        reason=f"{len(held)} nodes still show the breaker's hold in Slurm, newer than its last reset "
                               "(a trip whose state file was not saved)")


def hook_key(node: str, incident: str, action: str) -> str:
    """The idempotency key of a hook call (the same node, incident and action always give the same key)."""
    return "gpufleet-" + hashlib.sha256((f"{node}/{incident}/{action}").encode()).hexdigest()[:24]


def gate(d: Decision, config: RepairConfig, approved: Approvals, now: float) -> Decision:
    """Approval mode, and the actions of ``approval_for`` in any mode (a replacement, by default): a changing
    action runs only when (node, action, incident) was approved.

    An escalation only records and hands the node to a person, so it runs at once, unless it brings a hot spare
    into service: that changes the partition, and in approval mode nothing changes before approval.
    """
    changes = d.action in CHANGING_ACTIONS or d.spare is not None
    if changes and config.needs_approval(d.failure_class, d.action):
        key = (d.node, d.action, d.incident or "-")
        if key in approved:
            d.approved = True
        else:
            d.needs_approval = True
            d.reason += " [waiting for approval {}:{}:{}]".format(*key)
    d.runnable = not d.needs_approval and d.earliest <= now
    return d


# ------------------------------------------------------------------------------------------------
# 1. whose node, and is there anything to read
# ------------------------------------------------------------------------------------------------
def foreign_history(c: Case) -> Optional[Decision]:
    """The history field holds text that is not ours: hold, never touched."""
    if c.hist is None:
        return c.mk("hold", "history field holds text that is not ours; not touched", "foreign_history")
    return None


def not_ours(c: Case) -> Optional[Decision]:
    """Out of service with a reason that is not ours: hold, never touched, whatever our history says (a pending
    step of ours included: Slurm keeps our prefix through its own reboot); our open incident is closed with a
    note."""
    if not c.foreign():
        return None
    n, hist = c.n, c.hist
    if hist is None:  # a rule reached without what the rule order guarantees
        raise AssertionError("repair rule order: hist is not None")
    inc = hist.incident
    pending = inc.pending() if inc is not None else None
    if n.in_maintenance:
        who = "in an active maintenance reservation (Slurm's MAINT flag)"
    else:
        who = "out of service by someone else ({}{})".format(
            n.reason or "no reason", " by " + n.reason_user if n.reason_user else ""
        )
    closed = None
    if inc is not None:
        hist.abandon(c.now, who[:90])
        closed = hist
        who += f"; our incident {inc.id} closed" + (f" ({pending.action} pending)" if pending is not None else "")
    return c.mk("hold", who + "; never touched", "not_ours", hist=closed)


def no_report(c: Case) -> Optional[Decision]:
    """No health report for a node in service: nothing to act on."""
    if c.verdict == "unknown" and c.n.report is None and not c.out:
        return c.mk("hold", "no health report for a node in service; nothing to act on", "no_report", hist=c.hist)
    return None


# ------------------------------------------------------------------------------------------------
# 2. a step in progress
# ------------------------------------------------------------------------------------------------
def reboot_never_happened(n: Any, pending: Step, config: RepairConfig) -> bool:
    """The run that wrote a reboot's intent died before Slurm took the reboot: no reboot flag, no boot since, no
    "reboot issued" in the reason. Only the reason of a node out of service counts: on 24.11 a resumed node keeps
    an old "reboot issued" reason."""
    return (
        pending.action == "reboot"
        and not n.rebooting
        and n.boot_time is not None
        and n.boot_time < pending.started
        and "reboot" not in n.out_reason.lower().replace(config.reason_prefix.lower() + " reboot", "")
    )


def proof(n: Any, pending: Step) -> Optional[float]:
    """When the pending step is proven to have run, or None: a step's own record that it ran (a reset, written
    right after the reset returned), or for a reboot a boot of the node after the intent. A boot time Slurm does
    not know (0 or missing: slurmctld restarted and the node's slurmd has not registered yet) proves nothing."""
    if pending.ran is not None:
        return pending.ran
    if pending.action == "reboot" and n.boot_time is not None and n.boot_time >= pending.started:
        return n.boot_time
    return None


def record_verification(text: Any, outcome: str, n: Any, now: float, cooldown_s: float = 1800.0) -> History:
    """The history ``text`` with the body's verification of its pending step recorded: ``outcome`` (ok or failed)
    when the step is proven to have run (:func:`proof`; a reboot's boot time is kept as its proof), ``unproven``
    when it is not (a check of a node whose reboot never happened says nothing about the reboot). An ok closes
    the incident and starts the cooldown. ``n``: the node as Slurm shows it now (``boot_time``)."""
    h = loads(text).copy()
    inc = h.incident
    pending = inc.pending() if inc is not None else None
    if pending is not None and pending.action not in LONG_STEPS:
        proved = proof(n, pending)
        if proved is None:
            outcome = "unproven"
        else:
            h.ran(proved)
    h.settle(outcome, now, cooldown_s)
    return h


def in_progress(c: Case) -> Optional[Decision]:
    """A step in progress counts only on proof that it ran (:func:`proof`). With proof, a report newer than the
    proof judges it (healthy: ok; sick: failed), else it times out. Without proof it is never failed: it waits,
    and at its timeout (or when a fresh report finds the node healthy anyway) it ends ``unproven``, which does not
    count as tried, so the ladder offers the same step again (within the budget and the incident's attempts).
    A reboot Slurm never took is forgotten. A reimage or replacement (done by a hook) ends on a healthy report or
    its timeout."""
    hist, n, config, now = c.hist, c.n, c.config, c.now
    if hist is None:  # a rule reached without what the rule order guarantees
        raise AssertionError("repair rule order: hist is not None")
    inc = hist.incident
    pending = inc.pending() if inc is not None else None
    if pending is None:
        return None
    if reboot_never_happened(n, pending, config):
        hist.retract(pending)
        c.limits.release(n)  # it counted as under repair; the node must not block its own next step
        return None
    timeout = config.step_timeout_s.get(pending.action, DEFAULT_STEP_TIMEOUT_S)
    done_by = pending.started + timeout
    # only a short step (reset, reboot) is verified by the playbook while it waits: a reimage or replacement
    # ends on a healthy report or its timeout, never on a check of the still-broken node
    check = pending.action not in LONG_STEPS
    proved = proof(n, pending) if check else pending.started
    newer = n.report_time is not None and n.report_time > (proved if proved is not None else pending.started)
    if proved is not None and c.verdict == "healthy" and (n.report_time is None or newer):
        hist.finish("ok")
    elif n.rebooting and now < done_by:
        return c.mk(
            "wait",
            "{} in progress since {} (Slurm: {})".format(
                pending.action, pending.started, "+".join(sorted(n.flags & REBOOT_FLAGS))
            ),
            "in_progress",
            earliest=done_by,
            hist=hist,
            verify=check,
            since=pending.started if check else None,
            **inc_kw(inc),
        )
    elif proved is not None and check and c.actionable and newer:
        hist.finish("failed")
    elif now >= done_by:
        hist.finish("timeout" if proved is not None else "unproven")
    elif proved is None and c.verdict == "healthy" and newer:
        hist.finish("unproven")  # healthy anyway: the step is not credited, the node goes back as it is
    else:
        if proved is not None:
            why = f"{pending.action} started at {pending.started}; waiting for a health report newer than it"
        elif pending.action == "reboot":
            why = "reboot started at {}; no boot of the node since ({}); waiting, never judged without one".format(
                pending.started, "Slurm does not know its boot time: its slurmd has not registered"
                if n.boot_time is None else f"last boot {int(n.boot_time)}")
        else:
            why = f"{pending.action} started at {pending.started}; no record that it ran; waiting, never judged " \
                  "without one"
        verify = check and proved is not None
        return c.mk("wait", why, "in_progress", earliest=done_by, hist=hist, verify=verify,
                    since=pending.started if verify else None, **inc_kw(inc))
    c.pending_before = pending  # for before(): the outcome set above replaced it
    c.limits.release(n)
    return None


# ------------------------------------------------------------------------------------------------
# 3. nothing to repair
# ------------------------------------------------------------------------------------------------
def drain_requested(c: Case) -> Optional[Decision]:
    """Degraded with a drain request (a node-level problem such as a power brake on every GPU): no automatic
    repair applies. In service, the node still runs jobs, so its agent left the drain to this run: drain it when
    the breaker and the limits allow (``blast_radius_drain`` / ``breaker`` hold it otherwise). Drained by us: it
    waits for a person (resuming would undo the drain)."""
    report = c.n.report
    if c.actionable or c.verdict != "degraded" or not isinstance(report, Mapping) or report.get("drain") is not True:
        return None
    what = report.get("code") or c.report_action
    if not c.out:
        if c.brk.tripped:
            return c.mk("hold", f"should drain ({what}) but the circuit breaker is tripped ({c.brk.reason}); a "
                        "person must reset it", RULE_BREAKER, hist=c.before())
        return limited_drain(c, c.mk, what, f"degraded ({what}) and the health check asks for the node out of service",
                             "drain_requested", hist=c.before())
    return c.mk(
        "hold",
        f"degraded ({what}) and the health check asks for the node out of service: a person investigates, "
        "then resumes it",
        "drain_requested",
        hist=c.before(),
    )


def healthy(c: Case) -> Optional[Decision]:
    """Healthy (or degraded and nothing to do, with ``resume_degraded``): back to service if we drained it
    (``healthy_resume``, closes the incident, starts the cooldown); held while the breaker is tripped."""
    if c.actionable or not (c.verdict == "healthy" or (c.verdict == "degraded" and c.config.resume_degraded)):
        return None
    hist, n, config, now = c.hist, c.n, c.config, c.now
    if hist is None:  # a rule reached without what the rule order guarantees
        raise AssertionError("repair rule order: hist is not None")
    inc = hist.incident
    cls = inc.failure_class if inc is not None else classify(n.report, config.class_map)
    after = hist.copy()
    after.close(now, config.cooldown_s)
    if not c.out:
        hist.close(now, config.cooldown_s)
        return c.mk("hold", f"{c.verdict} and in service; nothing to do", "healthy_in_service", hist=hist,
                    failure_class=cls)
    if c.brk.tripped:
        return c.mk(
            "hold",
            f"healthy but the circuit breaker is tripped ({c.brk.reason})",
            RULE_BREAKER,
            hist=hist,
            failure_class=cls,
            slurm_reason=held_reason(n, config, None, BREAKER_HELD),
            **inc_kw(inc),
        )
    c.cls = cls
    d = c.mk_inc(
        "resume",
        "{} report{}; drained by us ({})".format(
            c.verdict, " after " + inc.steps[-1].action if inc is not None and inc.steps else "", n.reason
        ),
        "healthy_resume",
        hist=hist,
        hist_after=after,
    )
    return gate(d, config, c.approved, now)


def degraded_monitor(c: Case) -> Optional[Decision]:
    """Degraded with nothing to do and ``resume_degraded`` false: keep watching, the node stays where it is."""
    if c.actionable:
        return None
    return c.mk("hold", f"degraded ({c.report_action}); monitoring", "degraded_monitor", hist=c.before())


def book(c: Case) -> None:
    """Open the incident (first seen ``t0``) or bring it up to date with the report; a person who took the node
    back after an escalation ended that incident."""
    hist, n, now = c.hist, c.n, c.now
    if hist is None:  # a rule reached without what the rule order guarantees
        raise AssertionError("repair rule order: hist is not None")
    cls = c.cls = classify(n.report, c.config.class_map)
    if hist.incident is None:
        hist.open(cls, c.code, c.gpu, c.t0)
    else:
        if hist.incident.escalated is not None and not c.out:
            hist.close(now, 0)
            hist.open(cls, c.code, c.gpu, now)
        inc = hist.incident
        if inc is None:  # a rule reached without what the rule order guarantees
            raise AssertionError("repair rule order: inc is not None")
        inc.failure_class = cls
        inc.code = c.code
        if c.gpu is not None:
            inc.gpu = c.gpu
    c.booked = hist


# ------------------------------------------------------------------------------------------------
# 4-8. an incident that waits
# ------------------------------------------------------------------------------------------------
def escalated(c: Case) -> Optional[Decision]:
    """The incident was escalated: hold until a person takes the node back."""
    inc = c.hist.incident if c.hist is not None else None
    if inc is None or inc.escalated is None:
        return None
    return c.mk_inc("hold", f"escalated at {inc.escalated}; waiting for a person", "escalated", hist=c.booked)


def breaker(c: Case) -> Optional[Decision]:
    """The circuit breaker is tripped: hold until a person resets it."""
    if not c.brk.tripped:
        return None
    return c.mk_inc(
        "hold",
        f"circuit breaker tripped ({c.brk.reason}); a person must reset it",
        RULE_BREAKER,
        hist=c.booked,
        slurm_reason=held_reason(c.n, c.config, c.code, BREAKER_HELD),
    )


def ttl(c: Case) -> Optional[Decision]:
    """Flap suppression: the finding must persist ``ttl`` before any action."""
    inc = c.hist.incident if c.hist is not None else None
    if inc is None:  # a rule reached without what the rule order guarantees
        raise AssertionError("repair rule order: inc is not None")
    until = inc.first_seen + c.config.ttl_s
    if c.now >= until:
        return None
    return c.mk_inc(
        "wait",
        f"{c.code} first seen at {inc.first_seen}; must persist {c.config.ttl_s:g}s before action",
        "ttl",
        earliest=until,
        hist=c.booked,
    )


def limited_drain(c: Case, mk: Callable[..., Decision], what: str, why: str, rule: str, **kw: Any) -> Decision:
    """Drain a node in service when the limits allow (taking its place in them), behind the approval gate;
    ``blast_radius_drain`` holds it otherwise. The one drain step of the rules ``drain`` and ``drain_requested``."""
    block = c.limits.drain_block(c.n)
    if block:
        return mk("hold", f"should drain ({what}) but {block}", RULE_BLAST_RADIUS_DRAIN, hist=kw.get("hist"))
    c.limits.take_drain(c.n)
    return gate(mk("drain", why, rule, **kw), c.config, c.approved, c.now)


def drain(c: Case) -> Optional[Decision]:
    """Still in service: drain it, when the limits allow (``blast_radius_drain`` holds it otherwise)."""
    if c.out:
        return None
    why = "{} {}{}".format(c.verdict, c.code, f" gpu{c.gpu}" if c.gpu is not None else "")
    return limited_drain(c, c.mk_inc, c.code, why, "drain", hist=c.booked, hist_after=c.booked)


#: How soon a node whose jobs keep it (draining, a kept job, jobs not read) is looked at again.
JOBS_RECHECK_S = 60.0


def _jobs_text(ids: Any) -> str:
    ids = list(ids)
    return ", ".join(ids[:6]) + (f" and {len(ids) - 6} more" if len(ids) > 6 else "")


def kept_because(j: JobInfo, config: RepairConfig) -> Optional[str]:
    """Why job ``j`` is never evicted (not requeueable, opted out), or None."""
    if not j.requeue:
        return f"job {j.job_id} is not requeueable (--no-requeue or JobRequeue=0)"
    if config.opt_out_comment and config.opt_out_comment in j.comment:
        return f"job {j.job_id} opted out (its comment holds {config.opt_out_comment!r})"
    if j.qos and j.qos in config.opt_out_qos:
        return f"job {j.job_id} opted out (QOS {j.qos} is in jobs.opt_out_qos)"
    return None


def requeue_after_eviction(state: str, on_node: bool) -> bool:
    """Whether an evicted job (Slurm job ``state``, ``on_node``: it holds the node now) is requeued: when it still
    holds the node (the grace ran out, or no signal was asked for), or when it ended in any state but COMPLETED
    (it checkpointed and exited, or the signal ended it). A job queued again (it requeued itself), running
    elsewhere, or COMPLETED (it finished its work) is left alone. The body (job_evict) applies this same rule."""
    if state in JOB_ACTIVE_STATES:
        return on_node
    return state not in JOB_QUEUED_STATES and state != "COMPLETED"


def draining(c: Case) -> Optional[Decision]:
    """Drained by us with jobs still on it: the job action of the failure class (``jobs.action``).

    ``wait`` (rule ``draining``): the jobs keep the node until they end. ``requeue`` / ``checkpoint_requeue``
    (rule ``evict``): every job that may be evicted (requeueable, not opted out: ``job_kept`` waits for the others)
    is evicted, within ``jobs.max_evictions`` per window (``eviction_limit`` holds it otherwise), with a hot spare
    brought in first where one is idle. The eviction is recorded in the history before the body acts; while it is
    under way, :func:`evicting` follows it up."""
    hist, n, config, now = c.hist, c.n, c.config, c.now
    inc = hist.incident if hist is not None else None
    if inc is None:  # a rule reached without what the rule order guarantees
        raise AssertionError("repair rule order: inc is not None")
    if inc.eviction is not None and inc.eviction.done is None:
        d = evicting(c, inc, inc.eviction)
        if d is not None:
            return d
    if not n.busy:
        return None
    action = config.job_action_for(c.cls)
    if action == "wait":
        return c.mk_inc("wait", "draining: jobs still running; they keep the node until they end (jobs.action wait)",
                        RULE_DRAINING, earliest=now + JOBS_RECHECK_S, hist=c.booked)
    if n.jobs is None:
        return c.mk_inc("wait", "draining: jobs still running (the jobs on the node were not read: none is evicted)",
                        RULE_DRAINING, earliest=now + JOBS_RECHECK_S, hist=c.booked)
    evict: List[str] = []
    kept: List[str] = []
    for j in n.jobs:
        if j.on_node and j.state in JOB_ACTIVE_STATES:
            why = kept_because(j, config)
            if why:
                kept.append(why)
            else:
                evict.append(j.job_id)
    if not evict:
        if kept:
            return c.mk_inc("wait", "draining: " + "; ".join(kept[:4]) + ": the node waits for it to end",
                            RULE_JOB_KEPT, earliest=now + JOBS_RECHECK_S, hist=c.booked)
        return c.mk_inc("wait", "draining: jobs still ending", RULE_DRAINING, earliest=now + JOBS_RECHECK_S,
                        hist=c.booked)
    evict = evict[:MAX_EVICT_JOBS]
    block = c.limits.eviction_block()
    if block:
        return c.mk_inc("hold", f"would {action} job(s) {_jobs_text(evict)} but {block}", RULE_EVICTION_LIMIT,
                        hist=c.booked)
    c.limits.take_eviction()
    after = hist.copy() if hist is not None else History()
    if after.incident is None:  # a rule reached without what the rule order guarantees
        raise AssertionError("repair rule order: after.incident is not None")
    after.incident.eviction = Eviction(int(now), action, tuple(evict))
    spare = None
    waits = 0
    if config.spares_enabled and "evict" in config.spare_on and inc.spare is None:
        spare = c.limits.take_spare(n)
        if spare is not None:
            after.incident.spare = spare.spare or "?"
    if spare is None and inc.spare is None:
        waits = 1
    step = JobStep(action, "signal" if action == "checkpoint_requeue" else "requeue", tuple(evict), config.job_signal,
                   config.job_signal_to, config.job_grace_s, tuple(kept), waits)
    if action == "checkpoint_requeue":
        why = (f"{c.code}: job(s) {_jobs_text(evict)} told to checkpoint (SIG{config.job_signal} to "
               f"{config.job_signal_to}), {config.job_grace_s:g}s to leave, then requeued")
    else:
        why = f"{c.code}: job(s) {_jobs_text(evict)} requeued (their work since the last checkpoint is lost)"
    why += (f"; hot spare {spare.spare or '(one idle)'} brought into {spare.partition} first" if spare is not None
            else "; no idle hot spare: the requeued job(s) wait for 1 node" if waits else "")
    if kept:
        why += "; kept: " + "; ".join(kept[:4])
    d = c.mk_inc("evict", why, "evict", hist=c.booked, hist_after=after, spare=spare, jobs=step)
    return gate(d, config, c.approved, now)


def evicting(c: Case, inc: Incident, ev: Eviction) -> Optional[Decision]:
    """An eviction under way (its intent on record): wait while the signalled jobs have time to checkpoint and
    leave (``evicting``); requeue a job still on the node when the grace ran out or the run died before the requeue
    (``grace_expired``), and a job that left the node in any end state but COMPLETED (``requeue_evicted``: it
    checkpointed and exited, or the signal ended it). When every job is off the node (queued again, running
    elsewhere, finished, or gone from Slurm) the eviction is done: recorded, and the next rules decide."""
    n, config, now = c.n, c.config, c.now
    if n.jobs is None:
        return c.mk_inc("wait", f"evicting job(s) {_jobs_text(ev.jobs)} since {ev.at}; the jobs were not read",
                        "evicting", earliest=now + JOBS_RECHECK_S, hist=c.booked)
    known = {j.job_id: j for j in n.jobs}
    still = [jid for jid in ev.jobs if jid in known and known[jid].on_node and known[jid].state in JOB_ACTIVE_STATES]
    ended = [jid for jid in ev.jobs if jid in known and jid not in still
             and requeue_after_eviction(known[jid].state, known[jid].on_node)]
    until = ev.at + config.job_grace_s
    if still and ev.kind == "checkpoint_requeue" and now < until:
        return c.mk_inc("wait", f"evicting: job(s) {_jobs_text(still)} signalled at {ev.at}, {until - now:g}s left to "
                        "checkpoint and leave", "evicting", earliest=until, hist=c.booked)
    todo = still + ended
    if todo:
        rule = "grace_expired" if still and ev.kind == "checkpoint_requeue" else "requeue_evicted"
        why = (f"job(s) {_jobs_text(still)} still on the node {now - ev.at:g}s after the signal (grace "
               f"{config.job_grace_s:g}s): requeued anyway" if rule == "grace_expired"
               else f"job(s) {_jobs_text(todo)} evicted at {ev.at} not queued again yet: requeued")
        step = JobStep(ev.kind, "requeue", tuple(todo), config.job_signal, config.job_signal_to, config.job_grace_s)
        d = c.mk_inc("evict", why, rule, hist=c.booked, jobs=step)
        d.runnable = True  # the eviction was approved (or needed none) when it began
        return d
    inc.eviction = Eviction(ev.at, ev.kind, ev.jobs, int(now))  # the working copy: every later decision records it
    return None


def cooldown(c: Case) -> Optional[Decision]:
    """No new repair before the cooldown after the last repaired incident ends. An incident that began inside it
    (the node failed again soon after a verified repair: the repair did not hold) goes to a person at once when
    ``escalate.relapse`` is on (the default): another round of the same ladder would not hold either."""
    hist = c.hist
    if hist is None or hist.incident is None:  # a rule reached without what the rule order guarantees
        raise AssertionError("repair rule order: hist is not None and hist.incident is not None")
    until = hist.cooldown_until
    inc = hist.incident
    if until is not None and c.config.escalate_relapse and inc.first_seen < until and not inc.steps:
        closed = until - c.config.cooldown_s
        return escalate(c, f"relapse: {c.code} {max(0, inc.first_seen - int(closed))}s after the last verified "
                           f"repair (cooldown until {until}): the repair did not hold; a person should look",
                        "relapse")
    if until is None or c.now >= until:
        return None
    return c.mk_inc("wait", f"cooldown after the last repair until {until}", "cooldown", earliest=until,
                    hist=c.booked)


# ------------------------------------------------------------------------------------------------
# 9. the next step: lemon, escalation, attempts, ladder
# ------------------------------------------------------------------------------------------------
def escalate(c: Case, reason: str, rule: str) -> Decision:
    """Hand the node to a person (and bring a hot spare in where configured)."""
    hist, config = c.hist, c.config
    if hist is None or hist.incident is None:  # a rule reached without what the rule order guarantees
        raise AssertionError("repair rule order: hist is not None and hist.incident is not None")
    after = hist.copy()
    if after.incident is None:  # a rule reached without what the rule order guarantees
        raise AssertionError("repair rule order: after.incident is not None")
    after.incident.escalated = int(c.now)
    spare = None
    if config.spares_enabled and "escalate" in config.spare_on and hist.incident.spare is None:
        spare = c.limits.take_spare(c.n)
        if spare is not None:
            after.incident.spare = spare.spare or "?"
    d = c.mk_inc("escalate", reason, rule, hist=c.booked, hist_after=after, spare=spare)
    return gate(d, config, c.approved, c.now)


def lemon(c: Case) -> Optional[Tuple[str, str, str]]:
    """A lemon (``lemon.incidents`` incidents within ``lemon.window``): retire it with ``lemon.action``."""
    hist, config, now = c.hist, c.config, c.now
    if hist is None or hist.incident is None:  # a rule reached without what the rule order guarantees
        raise AssertionError("repair rule order: hist is not None and hist.incident is not None")
    if len(hist.past) + 1 < config.lemon_incidents:
        return None  # fewer incidents than that, whatever their times
    lemon_n = hist.incidents_since(now - config.lemon_window_s)
    if lemon_n < config.lemon_incidents:
        return None
    days = f"{config.lemon_window_s / 86400:g}d"
    if config.lemon_action == "escalate" or hist.incident.tried(config.lemon_action):
        return ("escalate", RULE_LEMON, f"lemon: {lemon_n} incidents in {days}")
    return (config.lemon_action, RULE_LEMON, f"lemon: {lemon_n} incidents in {days}; retire it")


def escalate_repairs(c: Case) -> Optional[Tuple[str, str, str]]:
    """``escalate.repairs`` repair steps within ``escalate.window`` on this node: a person should look."""
    hist, config = c.hist, c.config
    if hist is None:  # a rule reached without what the rule order guarantees
        raise AssertionError("repair rule order: hist is not None")
    if len(hist.repairs) < config.escalate_repairs:
        return None  # fewer repairs than that, whatever their times
    recent = len(hist.repairs_since(c.now - config.escalate_window_s))
    if recent < config.escalate_repairs:
        return None
    return ("escalate", "escalate_repairs", f"{recent} repairs in {config.escalate_window_s / 86400:g}d "
            f"(limit {config.escalate_repairs}): a person should look")


def incident_attempts(c: Case) -> Optional[Tuple[str, str, str]]:
    """``max_attempts_per_incident`` repair steps in this incident: escalate."""
    inc = c.hist.incident if c.hist is not None else None
    if inc is None:  # a rule reached without what the rule order guarantees
        raise AssertionError("repair rule order: inc is not None")
    attempts = 0
    for s in inc.steps:
        if s.action in REPAIR_STEPS:
            attempts += 1
    if attempts < c.config.max_attempts_per_incident:
        return None
    return ("escalate", "incident_attempts",
            f"{attempts} attempts in this incident (limit {c.config.max_attempts_per_incident})")


def ladder(c: Case) -> Tuple[str, str, str]:
    """The next rung of the class's ladder, from the first rung at least as drastic as the report's action, one
    step of each kind per incident; none left -> escalate (``ladder_exhausted``)."""
    inc = c.hist.incident if c.hist is not None else None
    if inc is None:  # a rule reached without what the rule order guarantees
        raise AssertionError("repair rule order: inc is not None")
    steps = c.config.ladder_for(c.cls)
    done = []
    for st in inc.steps:  # a loop, not a comprehension (a frame of its own on 3.9-3.11)
        if st.outcome != "unproven":  # a step never proven to have run: offered again
            done.append(st.action)
    step = None
    for s in steps[ladder_start(steps, c.report_action):]:
        if s not in done:
            step = s
            break
    if step is None:
        tried = ",".join(s.action for s in inc.steps) or "none"
        return ("escalate", "ladder_exhausted", "ladder {} exhausted (tried {})".format("/".join(steps), tried))
    last = inc.steps[-1] if inc.steps else None
    gpu = "" if c.gpu is None else f" gpu{c.gpu}"
    return (step, "ladder", f"{c.cls} {c.code}{gpu}: " + (f"after {last.action} {last.outcome}" if last else
                                                          "first step"))


def ladder_start(steps: Tuple[str, ...], report_action: str) -> int:
    """The first rung at least as drastic as the report's action (a report asking for more than the ladder offers
    gets the most drastic rung)."""
    sev = SEVERITY.get(report_action, 0)
    if not sev:
        return 0
    for i, s in enumerate(steps):
        if SEVERITY[s] >= sev:
            return i
    return len(steps) - 1 if report_action in REPAIR_STEPS else len(steps)


#: How the next step is chosen, in order: the first rule that answers decides.
NEXT_STEP_RULES: Tuple[Callable[[Case], Optional[Tuple[str, str, str]]], ...] = (
    lemon, escalate_repairs, incident_attempts)


def next_step(c: Case) -> Tuple[str, str, str]:
    """(action, rule, why) of the next step: lemon, escalate_repairs, incident_attempts, else the ladder."""
    for rule in NEXT_STEP_RULES:
        got = rule(c)
        if got is not None:
            return got
    return ladder(c)


# ------------------------------------------------------------------------------------------------
# 10. the step: budget, blast radius, approval
# ------------------------------------------------------------------------------------------------
def budget(c: Case, step: str) -> Optional[Decision]:
    """Retry budget used (attempts per window, any incident): wait until a slot frees."""
    hist, config = c.hist, c.config
    if hist is None:  # a rule reached without what the rule order guarantees
        raise AssertionError("repair rule order: hist is not None")
    free_at = budget_free_at(hist, config, c.now)
    if free_at is None:
        return None
    used = len(hist.repairs_since(c.now - config.budget_window_s))
    return c.mk_inc(
        "wait",
        f"retry budget used: {used} attempts in {config.budget_window_s / 3600:g}h (limit {config.budget_attempts})",
        "budget",
        earliest=free_at,
        hist=c.booked,
    )


def blast_radius(c: Case, step: str) -> Optional[Decision]:
    """A limit (min_healthy, nodes under repair per partition or domain, max_parallel) forbids the step: hold.
    Rule ``min_healthy`` when the partition is below min_healthy (nothing ends that but nodes coming back or a
    person: the run reports it as a problem), else ``blast_radius``."""
    below = c.limits.min_healthy_block(c.n)
    block = below or c.limits.concurrency_block(c.n)
    if not block:
        return None
    return c.mk_inc("hold", f"{step} next, but {block}", "min_healthy" if below else "blast_radius", hist=c.booked)


def start_step(c: Case, step: str, rule: str, why: str) -> Decision:
    """The step itself: the intent in the history, the hook call and the hot spare where configured, gated by
    approval mode; a runnable step counts as under repair."""
    hist, config, n, now = c.hist, c.config, c.n, c.now
    if hist is None or hist.incident is None:  # a rule reached without what the rule order guarantees
        raise AssertionError("repair rule order: hist is not None and hist.incident is not None")
    inc = hist.incident
    after = hist.started(step, now)
    if after.incident is None:  # a rule reached without what the rule order guarantees
        raise AssertionError("repair rule order: after.incident is not None")
    hook = None
    if step in config.hook_actions:
        hook = HookCall(
            action=step,
            node=n.name,
            incident=str(inc.id),
            # the incident's first-seen time too: incident numbers start again at 1 when the history is lost (a
            # slurmctld clean start, a person clearing Extra), and a new incident must never reuse an old key
            idempotency_key=hook_key(n.name, f"{inc.id}@{inc.first_seen}", step),
            reason=why,
        )
        after.incident.hooks = (*after.incident.hooks, step)
    spare = None
    if config.spares_enabled and step in config.spare_on and inc.spare is None:
        spare = c.limits.take_spare(n)
        if spare is not None:
            after.incident.spare = spare.spare or "?"
    d = c.mk_inc(step, why, rule, hist=c.booked, hist_after=after, hook=hook, spare=spare,
                 since=after.incident.steps[-1].started)
    d = gate(d, config, c.approved, now)
    if d.runnable:
        c.limits.take_active(n, started_now=True)
    return d


#: The rules before an incident is booked, in order.
BEFORE_BOOKING: Tuple[Callable[[Case], Optional[Decision]], ...] = (foreign_history, not_ours, no_report, in_progress)
#: Then, in order, for a node with nothing to repair (``Case.actionable`` false: each passes any other node on).
NOTHING_TO_REPAIR: Tuple[Callable[[Case], Optional[Decision]], ...] = (drain_requested, healthy, degraded_monitor)
#: The rules after the incident is booked, in order, before the next step is chosen.
WAITING: Tuple[Callable[[Case], Optional[Decision]], ...] = (escalated, breaker, ttl, drain, draining, cooldown)
#: The limits on the chosen step, in order.
STEP_LIMITS: Tuple[Callable[[Case, str], Optional[Decision]], ...] = (budget, blast_radius)


def decide(c: Case) -> Decision:
    """Run the rules in order for one node; the first that decides wins."""
    for rule in BEFORE_BOOKING:
        d = rule(c)
        if d is not None:
            return d
    if not c.actionable:
        for rule in NOTHING_TO_REPAIR:
            d = rule(c)
            if d is not None:
                return d
    book(c)
    for rule in WAITING:
        d = rule(c)
        if d is not None:
            return d
    step, rule_name, why = next_step(c)
    if step == "escalate":
        return escalate(c, why, rule_name)
    for limit in STEP_LIMITS:
        d = limit(c, step)
        if d is not None:
            return d
    return start_step(c, step, rule_name, why)


__all__: List[str] = ["Case", "decide", "gate", "held_reason", "hook_key", "inc_kw"]
