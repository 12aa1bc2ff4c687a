# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The repair policy: ``plan(fleet, attention, config, now) -> Plan`` (a list of Decision).

``fleet`` is a FleetSummary and ``attention`` a list of NodeState (state.py), built by the Slurm adapter or the
simulator; the older dicts (``fleet.build_inputs``'s shape) are accepted too and validated. The rules are the
functions of rules.py, the limits those of limits.py.

The fleet comes in as counts (per partition and per failure domain) and only the nodes that need
attention come in as records, so the cost of a plan grows with the number of sick nodes, never with
the size of the fleet. Rules, in the order they apply to one node (docs/repair.md has the table):

1. history field not ours -> hold; out of service with a reason that is not ours -> hold, never touched,
   whatever our history says; our open incident on it is closed with a note (slurmfacts.py). A history of ours that
   cannot be read, or a health report that cannot be used -> hold that node only, naming the problem.
2. a step in progress -> wait, until a fresh report verifies it (ok -> resume) or it times out.
3. healthy -> resume when drained by us (closes the incident, starts the cooldown).
4. escalated -> hold until a person takes the node back.
5. circuit breaker tripped -> hold (everything, fleet-wide, until a person resets it). Slurm keeps it too: nodes
   that show our breaker hold, set after the last reset, trip it when the stored state lost the trip.
6. flap suppression: the finding must persist ``ttl`` -> wait.
7. still in service -> drain (blast radius permitting); jobs still running -> the job action of the failure class
   (``jobs.action``): wait for them, or evict them (checkpoint and requeue, a hot spare brought in first) within
   the eviction limit.
8. cooldown after a repair -> wait.
9. lemon (N incidents in M days) -> replace; N repairs in M days -> escalate; attempts per incident
   used up -> escalate.
10. next rung of the class's ladder, starting from the report's action, one step of each kind per
    incident; none left -> escalate.
11. retry budget (attempts per window) -> wait; blast radius -> hold; approval mode -> needs approval.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Dict, Iterable, List, Optional, Set, Tuple, Union

from .classify import NO_REPORT, check_report
from .config import RepairConfig
from .history import History
from .limits import Limits, breaker_trips
from .model import ACTIONS, REPAIR_STEPS, BreakerState, Decision, Plan, RepairError
from .rules import Approvals, Case, breaker_in_slurm, decide, held_reason
from .state import FleetSummary, NodeState

_EMPTY = History()
_NO_APPROVALS: Approvals = frozenset()  # type: ignore[assignment]
_UNHEALTHY = ("unhealthy", "unknown")

# the names drain.py and older callers import from here
Fleet = FleetSummary
Node = NodeState


def _approvals(raw: Any) -> Approvals:
    if not raw:
        return _NO_APPROVALS
    out: Set[Tuple[str, str, str]] = set()
    for i, a in enumerate(raw):
        parts: List[Any]
        if isinstance(a, str):
            parts = a.split(":")
        elif isinstance(a, Mapping):
            parts = [a.get("node"), a.get("action"), a.get("incident")]
        elif isinstance(a, (list, tuple)):
            parts = list(a)
        else:
            parts = []
        if len(parts) != 3 or not all(p is not None and str(p) for p in parts) or parts[1] not in ACTIONS:
            raise RepairError(
                "approvals[{}]: expected (node, action, incident) or 'node:action:incident' "
                "with an action from {}, got {!r}".format(i, ", ".join(ACTIONS), a)
            )
        out.add((str(parts[0]), str(parts[1]), str(parts[2])))
    return out


def _first_seen(node: NodeState, hist: History, now: float, out: bool) -> float:
    if hist.incident is not None:
        return float(hist.incident.first_seen)
    t = now
    if node.reason_time is not None and out:
        # drained by us: the agent drained it when it first saw the fault; by someone else: a long-standing drain
        # is not a new failure (the breaker counts new ones)
        t = min(t, node.reason_time)
    return t


def retention(config: RepairConfig) -> Tuple[float, int]:
    """What plan() keeps of a node's history before it decides: entries of the last ``keep`` seconds, at most
    ``cap`` of each list (History.prune). A decision depends on the pruned history only."""
    got = _RETENTION.get(id(config))
    if got is not None and got[0] is config:
        return got[1]
    keep = max(config.budget_window_s, config.escalate_window_s, config.lemon_window_s, config.history_keep_s)
    cap = max(config.budget_attempts, config.escalate_repairs, config.lemon_incidents) + 1
    if len(_RETENTION) >= 64:
        _RETENTION.clear()
    _RETENTION[id(config)] = (config, (keep, cap))
    return keep, cap


# retention() per config object (a config is frozen; the entry holds the config, so its id is not reused)
_RETENTION: Dict[int, Tuple[RepairConfig, Tuple[float, int]]] = {}


def plan(
    fleet: Union[FleetSummary, Mapping[str, Any]],
    attention: Optional[Iterable[Union[NodeState, Mapping[str, Any]]]],
    config: Union[RepairConfig, Mapping[str, Any]],
    now: float,
    *,
    approvals: Iterable[Any] = (),
    breaker: Union[None, BreakerState, Mapping[str, Any]] = None,
) -> Plan:
    """Decide what to do with every node that needs attention. Pure: changes nothing (the inputs included).

    ``fleet`` is a FleetSummary (or its dict), ``attention`` NodeState records (or their dicts), ``config`` a
    RepairConfig or a plain dict (validated). ``approvals`` is an iterable of (node, action, incident) approvals;
    ``breaker`` the persisted BreakerState (or its dict). The returned Plan's ``breaker`` is the state to persist.
    """
    if not isinstance(config, RepairConfig):
        config = RepairConfig.from_dict(config)
    if isinstance(now, bool) or not isinstance(now, (int, float)):
        raise RepairError(f"now: expected epoch seconds, got {now!r}")
    fl = fleet if fleet.__class__ is FleetSummary else FleetSummary.from_dict(fleet)
    nodes: List[NodeState] = []
    for i, a in enumerate(attention or ()):  # a loop, not a comprehension: no frame of its own per plan
        nodes.append(a if a.__class__ is NodeState else NodeState.from_dict(a, i))
    if len(nodes) > 1:
        seen: Set[str] = set()
        for n in nodes:
            if n.name in seen:
                raise RepairError(f"attention: node {n.name} appears twice")
            seen.add(n.name)
    approved = _approvals(approvals)
    if breaker.__class__ is BreakerState:
        brk = breaker
    else:
        brk = BreakerState() if breaker is None else BreakerState.from_dict(breaker)
    if config.breaker_enabled and not brk.tripped:
        brk = breaker_in_slurm(nodes, brk, config.reason_prefix) or brk
    limits = Limits(fl, config)
    cases, problems = _prepare(nodes, config, now, limits, brk, approved)
    tripped = _trip_breaker(cases, problems, brk, fl, config, now)
    if tripped is not brk:
        brk = tripped
        for c in cases:
            c.brk = brk
    notes: List[str] = []
    if brk.tripped:
        notes.append(f"circuit breaker tripped: {brk.reason}; all automation holds until a person resets it")

    order = sorted(cases, key=lambda c: (c.t0, c.n.name)) if len(cases) > 1 else cases
    decisions: List[Decision] = []
    for c in order:
        n = c.n
        if n.name in problems:
            d = _problem(n, problems[n.name], c.why_foreign, config, now)
        else:
            d = decide(c)
        if d.hist is not None and n.history_empty and d.hist == _EMPTY:
            d.hist = None  # nothing to record: leave the field as it is
        decisions.append(d)
    unused: List[Tuple[str, str, str]] = []
    if approved:
        used = {d.approval_key for d in decisions if d.approved}
        unused = sorted(approved - used)
    return Plan(decisions, brk, notes, unused)


def _prepare(nodes: List[NodeState], config: RepairConfig, now: float, limits: Limits, brk: BreakerState,
             approved: Approvals) -> Tuple[List[Case], Dict[str, Tuple[str, str]]]:
    """Read the reports up front (errors name the node) and take a working copy of each history: a Case per node
    (its first-seen time ``t0``, the oldest incident first decides first). A node whose history or report cannot be
    used is held by itself (problems[name]: rule, why; its Case's ``hist`` is None); the others plan as usual.

    What is already under way counts against ``limits`` before anything new starts: evictions on record within the
    window (jobs.max_evictions), and nodes already under repair (the concurrency limits; a node someone else took
    over is not under repair by us any more)."""
    keep, cap = retention(config)
    since_ev = now - config.eviction_window_s
    cases: List[Case] = []
    problems: Dict[str, Tuple[str, str]] = {}
    prefix = config.reason_prefix
    for n in nodes:
        out = n.out_of_service
        foreign = n.foreign(prefix, out)
        if n.report_error:
            problems[n.name] = ("bad_report", f"health report unusable (attention[{n.name}].report: "
                                              f"unreadable: {n.report_error})")
            verdict, action, code, gpu = "unknown", "none", "", None
        else:
            try:
                verdict, action, code, gpu = check_report(n.report, f"attention[{n.name}].report")
            except RepairError as exc:
                problems[n.name] = ("bad_report", f"health report unusable ({exc})")
                verdict, action, code, gpu = "unknown", "none", "", None
        hist: Optional[History] = None  # unreadable, or another tool's
        t0 = float(now)
        if n.history_error is not None:
            problems[n.name] = ("history_unreadable", f"repair history unreadable ({n.history_error})")
        elif not n.history_foreign:
            hist = History() if n.history is None else n.history.pruned(now, keep, cap)
            t0 = _first_seen(n, hist, now, out)
            inc = hist.incident
            if inc is not None:
                if inc.eviction is not None and inc.eviction.at >= since_ev:
                    limits.evictions += 1
                if not foreign and inc.pending() is not None:
                    limits.take_active(n, started_now=False)
        cases.append(Case(n, hist, verdict, action, code, gpu, t0, config, limits, brk, approved, now, foreign, out))
    return cases, problems


def _trip_breaker(cases: List[Case], problems: Mapping[str, Any], brk: BreakerState, fl: FleetSummary,
                  config: RepairConfig, now: float) -> BreakerState:
    """The circuit breaker: distinct nodes failing, first seen within the window (and after the last reset); it
    trips at breaker_threshold() nodes, never fewer than breaker_min_nodes (a smaller plan cannot trip it)."""
    if not config.breaker_enabled or brk.tripped or len(cases) < config.breaker_min_nodes:
        return brk
    since = now - config.breaker_window_s
    if brk.reset_at is not None:
        since = max(since, brk.reset_at)
    failing = sorted(c.n.name for c in cases
                     if c.verdict in _UNHEALTHY and c.t0 >= since and c.n.name not in problems)
    why = breaker_trips(config, fl.total, len(failing), "nodes failed")
    return brk if why is None else BreakerState(tripped=True, since=float(now), nodes=failing, reason=why)


def _problem(n: NodeState, problem: Tuple[str, str], foreign: Optional[str], config: RepairConfig,
             now: float) -> Decision:
    """A node whose history or report cannot be used: hold it (never touched), say why; the others plan as usual.
    ``foreign``: why the node is not ours (NodeState.foreign), or None."""
    rule, why = problem
    short: Optional[str]
    if foreign:
        why = f"{foreign}; never touched; also: {why}"
        rule = "not_ours"
        short = None
    elif rule == "history_unreadable":
        why += (
            "; the node stays as it is until a person clears the history field "
            f"(scontrol update NodeName={n.name} Extra= , or Comment= when the history lives there); "
            "the next run starts a fresh history"
        )
        short = f"repair history unreadable, clear it: scontrol update NodeName={n.name} Extra="
    else:
        why += "; the node stays as it is until the health check writes a usable report"
        short = "health report unusable, see the repair plan"
    d = Decision(
        node=n.name,
        action="hold",
        reason=why,
        earliest=float(now),
        partition=n.partitions[0] if n.partitions else None,
        rule=rule,
    )
    if short:
        d.slurm_reason = held_reason(n, config, None, short)
    return d


#: The least time between a run and the follow-up it asks for (a run takes about a minute; a tighter loop would
#: only find the step still under way).
FOLLOWUP_MIN_DELAY_S = 60


def followups(decisions: Iterable[Mapping[str, Any]], results: Iterable[Mapping[str, Any]], now: float,
              min_delay: float = FOLLOWUP_MIN_DELAY_S) -> Dict[str, int]:
    """When a run should look at each node again without a new alert: ``{node: epoch second}``.

    ``decisions`` are a plan's decisions and ``results`` a run's step results, as dicts (what a repair run
    publishes). A node gets a follow-up when a step ran in this run and did not give the node back (it failed, or
    its verification was not healthy: the ladder's next step is due; a drain or an eviction: the job action or the
    first repair step is due), or when its decision waits for a time of our
    own (a step in progress, the TTL, a draining node, the cooldown, the budget) - at that time, never sooner than
    ``min_delay`` from now. A node waiting for a person (approval, escalation) or held (not ours, the breaker, a
    limit) gets none: only a person or another node's repair changes that.
    """
    soon = int(now + min_delay)
    out: Dict[str, int] = {}
    for r in results:
        node = r.get("node")
        if isinstance(node, str) and node and r.get("action") != "resume" and not r.get("check_mode") and (
                r.get("failed") or (r.get("verified") is not None and not r.get("resumed"))
                or r.get("action") in ("drain", "evict")):
            out[node] = soon
    for d in decisions:
        node, earliest = d.get("node"), d.get("earliest")
        if (not isinstance(node, str) or not node or node in out or d.get("action") != "wait"
                or d.get("needs_approval") or isinstance(earliest, bool) or not isinstance(earliest, (int, float))
                or not math.isfinite(earliest)):
            continue
        out[node] = max(soon, int(earliest))
    return out


def blind(decisions: Iterable[Mapping[str, Any]]) -> List[str]:
    """The nodes a plan would repair without a health report (as dicts, what a plan publishes): their ladder is
    the probe class's (a reboot first), chosen for want of a finding. A body that can fetch the node agent's own
    report should, and plan again with it (case 8 of docs/repair.md: the agent's report stays on the node)."""
    return [d["node"] for d in decisions
            if isinstance(d.get("node"), str) and d.get("code") == NO_REPORT and d.get("action") in REPAIR_STEPS]
