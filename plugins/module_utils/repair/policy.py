# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The repair policy: ``plan(fleet, attention, config, now) -> Plan`` (a list of Decision).

The fleet comes in as counts (per partition and per failure domain) and only the nodes that need
attention come in as records, so the cost of a plan grows with the number of sick nodes, never with
the size of the fleet. Rules, in the order they apply to one node (docs/repair.md has the table):

1. history field not ours -> hold; out of service with a reason that is not ours -> hold, never touched,
   whatever our history says; our open incident on it is closed with a note (owner.py). A history of ours that
   cannot be read, or a health report that cannot be used -> hold that node only, naming the problem.
2. a step in progress -> wait, until a fresh report verifies it (ok -> resume) or it times out.
3. healthy -> resume when drained by us (closes the incident, starts the cooldown).
4. escalated -> hold until a person takes the node back.
5. circuit breaker tripped -> hold (everything, fleet-wide, until a person resets it).
6. flap suppression: the finding must persist ``ttl`` -> wait.
7. still in service -> drain (blast radius permitting); jobs still running -> wait.
8. cooldown after a repair -> wait.
9. lemon (N incidents in M days) -> replace; N repairs in M days -> escalate; attempts per incident
   used up -> escalate.
10. next rung of the class's ladder, starting from the report's action, one step of each kind per
    incident; none left -> escalate.
11. retry budget (attempts per window) -> wait; blast radius -> hold; approval mode -> needs approval.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Set, Tuple

from .classify import check_report, classify
from .config import RepairConfig
from .history import History, HistoryError, dumps, loads_ours
from .model import (
    ACTIONS,
    CHANGING_ACTIONS,
    REPAIR_STEPS,
    SEVERITY,
    BreakerState,
    Decision,
    HookCall,
    Plan,
    RepairError,
    SpareMove,
)
from .owner import foreign_reason

_BUSY_STATES = {"ALLOCATED", "ALLOC", "MIXED", "MIX", "COMPLETING", "COMP"}
_REBOOT_FLAGS = {"REBOOT_REQUESTED", "REBOOT_ISSUED", "REBOOT"}
_OUT_FLAGS = {"DRAIN", "FAIL"}
# Steps done by someone else (a hook): a sick report meanwhile does not fail them; they end healthy or time out.
_LONG_STEPS = ("reimage", "replace")
_EMPTY_HISTORY = dumps(History())
_BREAKER_HELD = "circuit breaker tripped, a person checks the fleet and resets it"


# ------------------------------------------------------------------------------------------------
# inputs
# ------------------------------------------------------------------------------------------------
@dataclass
class Counts:
    total: int
    available: int
    unavailable: int
    spares: List[Optional[str]] = field(default_factory=list)


def _counts(d: Any, where: str) -> Counts:
    if not isinstance(d, Mapping):
        raise RepairError(f"{where}: expected a mapping with total, available, unavailable")
    vals = {}
    for key in ("total", "available", "unavailable"):
        v = d.get(key)
        if v is None and key == "unavailable" and isinstance(vals.get("total"), int):
            v = vals["total"] - vals["available"]
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise RepairError(f"{where}.{key}: expected an integer >= 0, got {v!r}")
        vals[key] = v
    spares: List[Optional[str]] = []
    raw = d.get("spares_idle", [])
    if isinstance(raw, int) and not isinstance(raw, bool):
        spares = [None] * raw
    elif isinstance(raw, (list, tuple)) and all(isinstance(s, str) for s in raw):
        spares = sorted(raw)
    else:
        raise RepairError(f"{where}.spares_idle: expected a list of idle spare node names or a count, got {raw!r}")
    return Counts(vals["total"], vals["available"], vals["unavailable"], spares)


@dataclass
class Fleet:
    """Counts per partition (parsed up front: a handful) and per failure domain (parsed when a node that needs
    attention is in one, so that a fleet of many racks costs nothing)."""

    total: int
    partitions: Dict[str, Counts]
    domains: Mapping[str, Mapping[str, Any]]
    _parsed: Dict[Tuple[str, str], Optional[Counts]] = field(default_factory=dict)

    def domain(self, kind: str, name: str) -> Optional[Counts]:
        key = (kind, name)
        if key not in self._parsed:
            raw = (self.domains.get(kind) or {}).get(name)
            self._parsed[key] = None if raw is None else _counts(raw, f"fleet.domains.{kind}.{name}")
        return self._parsed[key]

    @classmethod
    def parse(cls, fleet: Any) -> Fleet:
        if not isinstance(fleet, Mapping):
            raise RepairError(f"fleet: expected a mapping with partitions (and domains), got {type(fleet).__name__}")
        parts_raw = fleet.get("partitions") or {}
        if not isinstance(parts_raw, Mapping):
            raise RepairError("fleet.partitions: expected a mapping of partition name to counts")
        parts = {str(k): _counts(v, f"fleet.partitions.{k}") for k, v in parts_raw.items()}
        doms_raw = fleet.get("domains") or {}
        if not isinstance(doms_raw, Mapping):
            raise RepairError("fleet.domains: expected a mapping of domain kind (rack, switch) to domains")
        for kind, members in doms_raw.items():
            if not isinstance(members, Mapping):
                raise RepairError(f"fleet.domains.{kind}: expected a mapping of domain name to counts")
        total = fleet.get("total")
        if total is None:
            total = sum(c.total for c in parts.values())
        if isinstance(total, bool) or not isinstance(total, int) or total < 0:
            raise RepairError(f"fleet.total: expected an integer >= 0, got {total!r}")
        return cls(total, parts, doms_raw)


@dataclass
class Node:
    name: str
    partitions: Tuple[str, ...]
    domains: Dict[str, str]
    report: Optional[Mapping[str, Any]]
    report_time: Optional[float]
    base: str
    flags: frozenset
    reason: str
    reason_user: str
    reason_time: Optional[float]
    history_text: Optional[str]
    boot_time: Optional[float] = None
    report_error: Optional[str] = None

    @classmethod
    def parse(cls, d: Any, i: int) -> Node:
        if not isinstance(d, Mapping):
            raise RepairError(f"attention[{i}]: expected a mapping (name, partition, report, state, ...)")
        name = d.get("name")
        if not isinstance(name, str) or not name:
            raise RepairError(f"attention[{i}].name: expected a node name, got {name!r}")
        where = f"attention[{name}]"
        parts = d.get("partitions", d.get("partition"))
        if isinstance(parts, str):
            parts = (parts,)
        if not isinstance(parts, (list, tuple, frozenset, set)) or not all(isinstance(p, str) for p in parts):
            raise RepairError(f"{where}.partition: expected a partition name (or partitions: a list), got {parts!r}")
        domains = d.get("domains") or {}
        if not isinstance(domains, Mapping):
            raise RepairError(f"{where}.domains: expected a mapping like {{rack: r1, switch: s1}}")
        state = d.get("state") or ""
        if not isinstance(state, str):
            raise RepairError(f"{where}.state: expected a Slurm state string, got {state!r}")
        words = [w for w in state.upper().replace("*", "").split("+") if w]
        base = words[0] if words else "UNKNOWN"
        flags = set(words[1:])
        raw_flags = d.get("flags") or ()
        if isinstance(raw_flags, str):
            raw_flags = [f for f in raw_flags.replace(",", "+").split("+") if f]
        if not isinstance(raw_flags, (list, tuple, set, frozenset)):
            raise RepairError(f"{where}.flags: expected a list of Slurm state flags, got {raw_flags!r}")
        flags |= {str(f).upper() for f in raw_flags}
        # sinfo's compound words
        if base in ("DRAINED", "DRAIN"):
            base, flags = "IDLE", flags | {"DRAIN"}
        elif base == "DRAINING":
            base, flags = "ALLOCATED", flags | {"DRAIN"}
        hist = d.get("history")
        if hist is not None and not isinstance(hist, (str, History)):
            raise RepairError(f"{where}.history: expected the stored history text, got {type(hist).__name__}")
        return cls(
            name=name,
            partitions=tuple(sorted(parts)),
            domains={str(k): str(v) for k, v in domains.items()},
            report=d.get("report"),
            report_time=_opt_time(d.get("report_time"), where + ".report_time"),
            base=base,
            flags=frozenset(flags),
            reason=str(d.get("reason") or ""),
            reason_user=str(d.get("reason_user") or ""),
            reason_time=_opt_time(d.get("reason_time"), where + ".reason_time"),
            history_text=dumps(hist) if isinstance(hist, History) else hist,
            boot_time=_opt_time(d.get("boot_time"), where + ".boot_time"),
            report_error=str(d["report_error"])[:300] if d.get("report_error") else None,
        )

    # state helpers
    @property
    def out_of_service(self) -> bool:
        return self.base == "DOWN" or bool(self.flags & _OUT_FLAGS)

    @property
    def out_reason(self) -> str:
        """The reason, only while the node is drained/down/failed; '' for a node in service.

        Slurm 24.11 keeps a node's last reason after RESUME (22.05 clears it) and no update clears it, so on an
        idle, undrained node the reason is a leftover of an earlier drain and means nothing.
        """
        return self.reason if self.out_of_service else ""

    @property
    def busy(self) -> bool:
        return self.base in _BUSY_STATES or "COMPLETING" in self.flags

    @property
    def rebooting(self) -> bool:
        return bool(self.flags & _REBOOT_FLAGS)


def _opt_time(v: Any, where: str) -> Optional[float]:
    if v is None or v == 0:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise RepairError(f"{where}: expected epoch seconds, got {v!r}")
    return float(v)


def _approvals(raw: Any) -> Set[Tuple[str, str, str]]:
    out: Set[Tuple[str, str, str]] = set()
    for i, a in enumerate(raw or ()):
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


# ------------------------------------------------------------------------------------------------
# the plan
# ------------------------------------------------------------------------------------------------
class _Ctx:
    """Fleet-wide counters that the decisions of one plan consume, oldest incident first."""

    def __init__(self, fleet: Fleet, config: RepairConfig, nodes: List[Node]):
        self.fleet = fleet
        self.config = config
        self.new_unavailable: Dict[Tuple[str, str], int] = {}  # drains planned this run
        self.active: Dict[Tuple[str, str], int] = {}  # nodes acted on (in progress + started now)
        self.parallel = 0
        self.spares: Dict[str, List[Optional[str]]] = {p: list(c.spares) for p, c in fleet.partitions.items()}
        self.spares_taken: Set[str] = set()

    def _groups(self, node: Node):
        for p in node.partitions:
            c = self.fleet.partitions.get(p)
            if c is not None:
                yield ("partition", p), c, self.config.max_unavailable
        for kind, dom in node.domains.items():
            limit = self.config.domain_limits.get(kind)
            if limit is None:
                continue
            c = self.fleet.domain(kind, dom)
            if c is not None:
                yield (kind, dom), c, limit

    def limit(self, counts: Counts, limit) -> int:
        n = limit.of(counts.total)
        if limit.share is not None:
            n = max(1, n)
        return n

    def min_healthy_block(self, node: Node) -> Optional[str]:
        for p in node.partitions:
            c = self.fleet.partitions.get(p)
            if c is None or c.total == 0:
                continue
            need = int(math.ceil(self.config.min_healthy * c.total - 1e-9))
            avail = c.available - self.new_unavailable.get(("partition", p), 0)
            if avail < need:
                return (
                    f"partition {p} has {avail} of {c.total} nodes available, "
                    f"below min_healthy {self.config.min_healthy * 100:g}% ({need}): automation waits"
                )
        return None

    def drain_block(self, node: Node) -> Optional[str]:
        msg = self.min_healthy_block(node)
        if msg:
            return msg
        for key, c, limit in self._groups(node):
            n = self.limit(c, limit)
            after = c.unavailable + self.new_unavailable.get(key, 0) + 1
            if after > n:
                return f"draining would make {after} nodes unavailable in {key[0]} {key[1]} (limit {n})"
        # the last available node of a partition is never drained by automation
        for p in node.partitions:
            c = self.fleet.partitions.get(p)
            if c is not None and c.available - self.new_unavailable.get(("partition", p), 0) <= 1 and c.total > 1:
                return f"partition {p} would have no available node left"
        return None

    def repair_block(self, node: Node) -> Optional[str]:
        msg = self.min_healthy_block(node)
        if msg:
            return msg
        for key, c, limit in self._groups(node):
            n = self.limit(c, limit)
            if self.active.get(key, 0) + 1 > n:
                return f"{self.active.get(key, 0)} nodes already under repair in {key[0]} {key[1]} (limit {n})"
        if self.config.max_parallel is not None and self.parallel + 1 > self.config.max_parallel:
            return f"max_parallel {self.config.max_parallel} repairs already started in this run"
        return None

    def take_drain(self, node: Node) -> None:
        for key, _c, _l in self._groups(node):
            self.new_unavailable[key] = self.new_unavailable.get(key, 0) + 1

    def take_active(self, node: Node, started_now: bool) -> None:
        for key, _c, _l in self._groups(node):
            self.active[key] = self.active.get(key, 0) + 1
        if started_now:
            self.parallel += 1

    def release(self, node: Node) -> None:
        for key, _c, _l in self._groups(node):
            self.active[key] = max(0, self.active.get(key, 0) - 1)

    def take_spare(self, node: Node) -> Optional[SpareMove]:
        for p in node.partitions:
            pool = self.spares.get(p) or []
            while pool:
                s = pool.pop(0)
                if s is None or s not in self.spares_taken:
                    if s is not None:
                        self.spares_taken.add(s)
                    return SpareMove(spare=s, partition=p, for_node=node.name)
        return None


def _first_seen(node: Node, hist: History, ours: bool, now: float) -> float:
    if hist.incident is not None:
        return float(hist.incident.first_seen)
    t = now
    if node.out_of_service and node.reason_time is not None:
        # drained by us: the agent drained it when it first saw the fault; by someone else: a long-standing drain
        # is not a new failure (the breaker counts new ones)
        t = min(t, node.reason_time)
    return t


def _key(node: str, incident: str, action: str) -> str:
    return "gpufleet-" + hashlib.sha256((f"{node}/{incident}/{action}").encode()).hexdigest()[:24]


def retention(config: RepairConfig) -> Tuple[float, int]:
    """What plan() keeps of a node's history before it decides: entries of the last ``keep`` seconds, at most
    ``cap`` of each list (History.prune). A decision depends on the pruned history only."""
    keep = max(config.budget_window_s, config.escalate_window_s, config.lemon_window_s, config.history_keep_s)
    cap = max(config.budget_attempts, config.escalate_repairs, config.lemon_incidents) + 1
    return keep, cap


def time_horizon(config: Any, pending_steps: Optional[Iterable[str]] = None) -> Tuple[float, Tuple[float, ...]]:
    """How plan() reads the age of a node's input times: ``(exact, windows)``.

    The input times of a node are those of its history and its record's ``reason_time``, ``report_time`` and
    ``boot_time`` (and the breaker's ``reset_at`` when a breaker state is passed). plan() at ``now`` reads a time
    ``t >= now - exact`` by its exact age. It reads an older time in three ways only:

    - whether ``t >= now - w``, for each ``w`` in ``windows`` (the lemon, escalation and retention windows longer
      than ``exact``);
    - its order among the node's other input times, ties included (History.prune sorts, retract matches);
    - as a value copied unchanged into a returned history (a past incident, an old repair step, a first-seen time).

    Every time a decision computes (a step's start, a cooldown, an escalation, ``earliest``) is ``now`` or later,
    or a copy of an input time. So two inputs that differ only in times older than ``exact``, where those times
    agree in the first two ways, get the same decision, the old times carried along. ``exact`` covers every
    comparison of a time with ``now`` that has a finer grain: the flap ttl, the cooldown, the retry-budget and
    breaker windows and the timeout of a step in progress (a step without one times out after 1800 s).
    ``pending_steps`` narrows that last part to the actions that may be in progress in the node's history (the open
    incident's last step, when it has no outcome yet): ``()`` when none is; by default every action. A cache of
    decisions (the simulator's) can key on this instead of on every time.
    """
    if not isinstance(config, RepairConfig):
        config = RepairConfig.from_dict(config)
    if pending_steps is None:
        timeouts = [1800.0] + list(config.step_timeout_s.values())
    else:
        timeouts = [config.step_timeout_s.get(a, 1800.0) for a in pending_steps]
    exact = max([config.ttl_s, config.cooldown_s, config.budget_window_s, config.breaker_window_s, 60.0] + timeouts)
    keep, _cap = retention(config)
    windows = sorted({w for w in (config.escalate_window_s, config.lemon_window_s, keep) if w > exact})
    return exact, tuple(windows)


def breaker_threshold(config: RepairConfig, total: int) -> int:
    """How many distinct nodes failing within the breaker window trip the circuit breaker in a fleet of ``total``."""
    return max(config.breaker_min_nodes, int(math.ceil(config.breaker_fraction * total - 1e-9)))


def fleet_view(fleet: Any, record: Any, config: Any) -> Tuple[Any, ...]:
    """What plan() reads of the fleet counts when ``record`` is the only node in ``attention``.

    Two fleets with the same view give the same one-node plan for the same node record, history, report,
    config and time (the Decision's reason text, which quotes the counts, aside). The view holds the outcomes
    of the very checks plan() runs for a node, on the fresh context a one-node plan starts from: the breaker
    threshold (``breaker_threshold``), whether a drain is blocked (``min_healthy`` and the partition and domain
    limits), whether a repair step is blocked with nothing under repair and with the node's own step counted
    (plan() releases a step it retracts - an intent written by a run that died before Slurm took it - so that
    step never blocks its own node), and the spare the node would get. A caller that plans nodes one at a time
    (the simulator) can key a cache on it instead of on the counts.
    """
    if not isinstance(config, RepairConfig):
        config = RepairConfig.from_dict(config)
    fl = Fleet.parse(fleet)
    n = Node.parse(record, 0)
    ctx = _Ctx(fl, config, [n])
    drain = ctx.drain_block(n) is None
    repair = ctx.repair_block(n) is None
    ctx.take_active(n, started_now=False)
    repair_own = ctx.repair_block(n) is None
    spare = ctx.take_spare(n)
    return (
        breaker_threshold(config, fl.total),
        drain,
        repair,
        repair_own,
        None if spare is None else (spare.spare, spare.partition),
    )


def plan(
    fleet: Any, attention: Iterable[Any], config: Any, now: float, *, approvals: Any = (), breaker: Any = None
) -> Plan:
    """Decide what to do with every node that needs attention. Pure: changes nothing.

    ``config`` is a RepairConfig or a plain dict (validated). ``approvals`` is an iterable of
    (node, action, incident) approvals; ``breaker`` the persisted BreakerState (or its dict).
    The returned Plan's ``breaker`` is the state to persist.
    """
    if not isinstance(config, RepairConfig):
        config = RepairConfig.from_dict(config)
    if isinstance(now, bool) or not isinstance(now, (int, float)):
        raise RepairError(f"now: expected epoch seconds, got {now!r}")
    fl = Fleet.parse(fleet)
    nodes = [Node.parse(d, i) for i, d in enumerate(attention or [])]
    seen: Set[str] = set()
    for n in nodes:
        if n.name in seen:
            raise RepairError(f"attention: node {n.name} appears twice")
        seen.add(n.name)
    approved = _approvals(approvals)
    brk = BreakerState.from_dict(breaker)
    ctx = _Ctx(fl, config, nodes)
    keep, cap = retention(config)

    # Parse histories and reports up front (errors name the node).
    # A node whose history or report cannot be used is held by itself (problems[name]); the others plan as usual.
    prepared = []
    problems: Dict[str, Tuple[str, str]] = {}
    for n in nodes:
        where = f"attention[{n.name}].report"
        try:
            if n.report_error:
                raise RepairError(f"{where}: unreadable: {n.report_error}")
            verdict, action, code, gpu = check_report(n.report, where)
        except RepairError as exc:
            problems[n.name] = ("bad_report", f"health report unusable ({exc})")
            verdict, action, code, gpu = "unknown", "none", "", None
        try:
            hist = loads_ours(n.history_text)
        except HistoryError as exc:
            problems[n.name] = ("history_unreadable", f"repair history unreadable ({exc})")
            hist = None
        if hist is None:
            prepared.append((n, None, verdict, action, code, gpu, now))
            continue
        hist.prune(now, keep, cap)
        ours = n.out_reason.startswith(config.reason_prefix)
        prepared.append((n, hist, verdict, action, code, gpu, _first_seen(n, hist, ours, now)))

    # Circuit breaker: distinct nodes failing, first seen within the window (and after the last reset).
    notes: List[str] = []
    if config.breaker_enabled and not brk.tripped:
        since = now - config.breaker_window_s
        if brk.reset_at is not None:
            since = max(since, brk.reset_at)
        failing = sorted(
            n.name
            for n, h, verdict, _a, _c, _g, t0 in prepared
            if verdict in ("unhealthy", "unknown") and t0 >= since and n.name not in problems
        )
        threshold = breaker_threshold(config, fl.total)
        if len(failing) >= threshold:
            brk = BreakerState(
                tripped=True,
                since=float(now),
                nodes=failing,
                reason=f"{len(failing)} nodes failed within {config.breaker_window_s:g}s "
                f"(threshold {threshold} of {fl.total})",
            )
    if brk.tripped:
        notes.append(f"circuit breaker tripped: {brk.reason}; all automation holds until a person resets it")

    # Nodes already under repair count against the concurrency limits before anything new starts.
    # A node someone else took over is not under repair by us any more.
    for n, hist, *_rest in prepared:
        if (
            hist is not None
            and hist.incident is not None
            and hist.incident.pending() is not None
            and not _foreign(n, config)
        ):
            ctx.take_active(n, started_now=False)

    order = sorted(prepared, key=lambda p: (p[6], p[0].name))
    decisions: List[Decision] = []
    empty = _EMPTY_HISTORY
    for n, hist, verdict, action, code, gpu, t0 in order:
        if n.name in problems:
            d = _problem(n, problems[n.name], config, now)
        else:
            d = _decide(n, hist, verdict, action, code, gpu, t0, config, ctx, brk, approved, now)
        if d.history == empty and not (n.history_text or "").strip():
            d.history = None  # nothing to record: leave the field as it is
        decisions.append(d)
    used = {d.approval_key for d in decisions if d.approved}
    unused = sorted(approved - used)
    return Plan(decisions, breaker=brk, notes=notes, unused_approvals=unused)


def _foreign(n: Node, config: RepairConfig) -> Optional[str]:
    """The ownership rule (owner.py) for a node record: why the node is not ours, or None."""
    return foreign_reason(n.base, n.flags, n.reason, config.reason_prefix)


def _held_reason(n: Node, config: RepairConfig, code: Optional[str], why: str) -> Optional[str]:
    """The Slurm reason that tells an operator why a node we keep out of service waits (None: leave it)."""
    if not n.out_of_service or _foreign(n, config):
        return None
    text = "{} held{}: {}".format(config.reason_prefix, f" ({code})" if code else "", why)
    return text[:250]


def _problem(n: Node, problem: Tuple[str, str], config: RepairConfig, now: float) -> Decision:
    """A node whose history or report cannot be used: hold it (never touched), say why; the others plan as usual."""
    rule, why = problem
    foreign = _foreign(n, config)
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
        d.slurm_reason = _held_reason(n, config, None, short)
    return d


def _decide(
    n: Node,
    hist: Optional[History],
    verdict: str,
    report_action: str,
    code: str,
    gpu: Optional[int],
    t0: float,
    config: RepairConfig,
    ctx: _Ctx,
    brk: BreakerState,
    approved,
    now: float,
) -> Decision:
    part = n.partitions[0] if n.partitions else None

    def mk(action, reason, rule, earliest=None, **kw) -> Decision:
        return Decision(
            node=n.name,
            action=action,
            reason=reason,
            earliest=float(now if earliest is None else earliest),
            partition=part,
            code=code,
            gpu=gpu,
            rule=rule,
            **kw,
        )

    if hist is None:
        return mk("hold", "history field holds text that is not ours; not touched", "foreign_history")

    # the history as it came in, written out only where a decision returns it unchanged (below: before a pending
    # step's outcome changes it; elsewhere at the return, nothing having changed it yet)
    before = None
    inc = hist.incident
    pending = inc.pending() if inc is not None else None

    # 1. somebody else's node: never touched, whatever our history says (a pending step of ours included: Slurm
    # keeps our prefix through its own reboot); our open incident on it is closed with a note
    if _foreign(n, config):
        who = "out of service by someone else ({}{})".format(
            n.reason or "no reason", " by " + n.reason_user if n.reason_user else ""
        )
        closed = None
        if inc is not None:
            hist.abandon(now, who[:90])
            closed = dumps(hist)
            who += f"; our incident {inc.id} closed" + (f" ({pending.action} pending)" if pending is not None else "")
        return mk("hold", who + "; never touched", "not_ours", history=closed)

    actionable = verdict in ("unhealthy", "unknown") or (verdict == "degraded" and report_action in REPAIR_STEPS)
    if verdict == "unknown" and n.report is None and not n.out_of_service:
        return mk("hold", "no health report for a node in service; nothing to act on", "no_report", history=dumps(hist))

    # 2. a step in progress
    if (
        pending is not None
        and pending.action == "reboot"
        and not n.rebooting
        and n.boot_time is not None
        and n.boot_time < pending.started
        and "reboot" not in n.out_reason.lower().replace(config.reason_prefix.lower() + " reboot", "")
    ):
        # the run that wrote the intent died before Slurm took the reboot (no flag, no new boot, no "reboot
        # issued" in the reason): that reboot never happened, so it does not count. Only the reason of a node out of
        # service counts: on 24.11 a resumed node keeps an old "reboot issued" reason
        hist.retract(pending)
        inc, pending = hist.incident, None
        ctx.release(n)  # it counted as under repair; the node must not block its own next step
    if pending is not None:
        before = dumps(hist)
        timeout = config.step_timeout_s.get(pending.action, 1800.0)
        done_by = pending.started + timeout
        # only a short step (reset, reboot) is verified by the playbook while it waits: a reimage or replacement
        # ends on a healthy report or its timeout, never on a check of the still-broken node
        check = pending.action not in _LONG_STEPS
        if verdict == "healthy" and (n.report_time is None or n.report_time > pending.started):
            hist.finish("ok")
        elif n.rebooting and now < done_by:
            return mk(
                "wait",
                "{} in progress since {} (Slurm: {})".format(
                    pending.action, pending.started, "+".join(sorted(n.flags & _REBOOT_FLAGS))
                ),
                "in_progress",
                earliest=done_by,
                history=before,
                verify=check,
                **_inc_kw(inc),
            )
        elif (
            actionable
            and pending.action not in _LONG_STEPS
            and n.report_time is not None
            and n.report_time > pending.started
        ):
            hist.finish("failed")
        elif now >= done_by:
            hist.finish("timeout")
        else:
            return mk(
                "wait",
                f"{pending.action} started at {pending.started}; waiting for a health report newer than it",
                "in_progress",
                earliest=done_by,
                history=before,
                verify=check,
                **_inc_kw(inc),
            )
        ctx.release(n)

    # 3a. degraded with a drain request (a node-level problem such as a power brake on every GPU): no automatic
    # repair applies and resuming would undo the agent's drain; the node waits for a person
    if not actionable and verdict == "degraded" and isinstance(n.report, Mapping) and n.report.get("drain") is True:
        return mk(
            "hold",
            "degraded ({}) and the health check asks for the node out of service: a person investigates, "
            "then resumes it".format(n.report.get("code") or report_action),
            "drain_requested",
            history=dumps(hist) if before is None else before,
        )

    # 3. healthy (or degraded and nothing to do): back to service if we drained it
    if not actionable and (verdict == "healthy" or (verdict == "degraded" and config.resume_degraded)):
        inc = hist.incident
        cls = inc.failure_class if inc is not None else classify(n.report, config.class_map)
        hk = dict(_inc_kw(inc), failure_class=cls)
        after = hist.copy()
        after.close(now, config.cooldown_s)
        if not n.out_of_service:
            hist.close(now, config.cooldown_s)
            return mk(
                "hold",
                f"{verdict} and in service; nothing to do",
                "healthy_in_service",
                history=dumps(hist),
                failure_class=cls,
            )
        if brk.tripped:
            return mk(
                "hold",
                f"healthy but the circuit breaker is tripped ({brk.reason})",
                "breaker",
                history=dumps(hist),
                failure_class=cls,
                slurm_reason=_held_reason(n, config, None, _BREAKER_HELD),
                **_inc_kw(inc),
            )
        d = mk(
            "resume",
            "{} report{}; drained by us ({})".format(
                verdict, " after " + inc.steps[-1].action if inc is not None and inc.steps else "", n.reason
            ),
            "healthy_resume",
            history=dumps(hist),
            history_after=dumps(after),
            **hk,
        )
        return _gate(d, config, approved, now)
    if not actionable:
        # degraded, resume_degraded false: keep watching, node stays where it is
        return mk(
            "hold",
            f"degraded ({report_action}); monitoring",
            "degraded_monitor",
            history=dumps(hist) if before is None else before,
        )

    # 4-11: unhealthy / unknown / degraded with a repair action
    cls = classify(n.report, config.class_map)
    if hist.incident is None:
        hist.open(cls, code, gpu, t0)
    else:
        if hist.incident.escalated is not None and not n.out_of_service:
            # a person took the node back after the escalation: that incident is over
            hist.close(now, 0)
            hist.open(cls, code, gpu, now)
        hist.incident.failure_class = cls
        hist.incident.code = code
        if gpu is not None:
            hist.incident.gpu = gpu
    inc = hist.incident
    booked = dumps(hist)
    ikw = _inc_kw(inc)
    ikw["failure_class"] = cls

    def escalate(reason, rule) -> Decision:
        after = hist.copy()
        after.incident.escalated = int(now)
        spare = None
        if config.spares_enabled and "escalate" in config.spare_on and inc.spare is None:
            spare = ctx.take_spare(n)
            if spare is not None:
                after.incident.spare = spare.spare or "?"
        d = mk("escalate", reason, rule, history=booked, history_after=dumps(after), spare=spare, **ikw)
        return _gate(d, config, approved, now)

    if inc.escalated is not None:
        return mk("hold", f"escalated at {inc.escalated}; waiting for a person", "escalated", history=booked, **ikw)
    if brk.tripped:
        return mk(
            "hold",
            f"circuit breaker tripped ({brk.reason}); a person must reset it",
            "breaker",
            history=booked,
            slurm_reason=_held_reason(n, config, code, _BREAKER_HELD),
            **ikw,
        )
    if now < inc.first_seen + config.ttl_s:
        return mk(
            "wait",
            f"{code} first seen at {inc.first_seen}; must persist {config.ttl_s:g}s before action",
            "ttl",
            earliest=inc.first_seen + config.ttl_s,
            history=booked,
            **ikw,
        )
    if not n.out_of_service:
        block = ctx.drain_block(n)
        if block:
            return mk("hold", f"should drain ({code}) but {block}", "blast_radius_drain", history=booked, **ikw)
        ctx.take_drain(n)
        d = mk(
            "drain",
            "{} {}{}".format(verdict, code, f" gpu{gpu}" if gpu is not None else ""),
            "drain",
            history=booked,
            history_after=booked,
            **ikw,
        )
        return _gate(d, config, approved, now)
    if n.busy:
        return mk("wait", "draining: jobs still running", "draining", earliest=now + 60, history=booked, **ikw)
    if hist.cooldown_until is not None and now < hist.cooldown_until:
        return mk(
            "wait",
            f"cooldown after the last repair until {hist.cooldown_until}",
            "cooldown",
            earliest=hist.cooldown_until,
            history=booked,
            **ikw,
        )

    # lemon, escalation, per-incident attempts
    lemon_n = hist.incidents_since(now - config.lemon_window_s)
    step = None
    rule = "ladder"
    if lemon_n >= config.lemon_incidents:
        if config.lemon_action == "escalate" or inc.tried(config.lemon_action):
            return escalate(f"lemon: {lemon_n} incidents in {config.lemon_window_s / 86400:g}d", "lemon")
        step, rule = config.lemon_action, "lemon"
        why = f"lemon: {lemon_n} incidents in {config.lemon_window_s / 86400:g}d; retire it"
    if step is None:
        recent = len(hist.repairs_since(now - config.escalate_window_s))
        if recent >= config.escalate_repairs:
            return escalate(
                f"{recent} repairs in {config.escalate_window_s / 86400:g}d "
                f"(limit {config.escalate_repairs}): a person should look",
                "escalate_repairs",
            )
        attempts = sum(1 for s in inc.steps if s.action in REPAIR_STEPS)
        if attempts >= config.max_attempts_per_incident:
            return escalate(
                f"{attempts} attempts in this incident (limit {config.max_attempts_per_incident})", "incident_attempts"
            )
        ladder = config.ladder_for(cls)
        sev = SEVERITY.get(report_action, 0)
        start = next((i for i, s in enumerate(ladder) if SEVERITY[s] >= sev), len(ladder)) if sev else 0
        if start == len(ladder) and report_action in REPAIR_STEPS:
            # the report asks for more than the ladder offers: take the most drastic rung
            start = len(ladder) - 1
        for s in ladder[start:]:
            if not inc.tried(s):
                step = s
                break
        if step is None:
            tried = ",".join(s.action for s in inc.steps) or "none"
            return escalate("ladder {} exhausted (tried {})".format("/".join(ladder), tried), "ladder_exhausted")
        last = inc.steps[-1] if inc.steps else None
        why = "{} {}{}: {}".format(
            cls,
            code,
            f" gpu{gpu}" if gpu is not None else "",
            f"after {last.action} {last.outcome}" if last else "first step",
        )

    # retry budget
    window = hist.repairs_since(now - config.budget_window_s)
    if len(window) >= config.budget_attempts:
        free_at = sorted(t for t, _a in window)[len(window) - config.budget_attempts] + config.budget_window_s
        return mk(
            "wait",
            f"retry budget used: {len(window)} attempts in {config.budget_window_s / 3600:g}h "
            f"(limit {config.budget_attempts})",
            "budget",
            earliest=free_at,
            history=booked,
            **ikw,
        )
    block = ctx.repair_block(n)
    if block:
        return mk("hold", f"{step} next, but {block}", "blast_radius", history=booked, **ikw)

    after = hist.copy()
    after.start(step, now)
    hook = None
    if step in config.hook_actions:
        hook = HookCall(
            action=step,
            node=n.name,
            incident=str(inc.id),
            # the incident's first-seen time too: incident numbers start again at 1 when the history is lost (a
            # slurmctld clean start, a person clearing Extra), and a new incident must never reuse an old key
            idempotency_key=_key(n.name, f"{inc.id}@{inc.first_seen}", step),
            reason=why,
        )
        after.incident.hooks.append(step)
    spare = None
    if config.spares_enabled and step in config.spare_on and inc.spare is None:
        spare = ctx.take_spare(n)
        if spare is not None:
            after.incident.spare = spare.spare or "?"
    d = mk(step, why, rule, history=booked, history_after=dumps(after), hook=hook, spare=spare, **ikw)
    d = _gate(d, config, approved, now)
    if d.runnable:
        ctx.take_active(n, started_now=True)
    return d


def _inc_kw(inc) -> Dict[str, Any]:
    if inc is None:
        return {}
    return {"incident": str(inc.id), "failure_class": inc.failure_class}


def _gate(d: Decision, config: RepairConfig, approved, now: float) -> Decision:
    """Approval mode: a changing action runs only when (node, action, incident) was approved.

    An escalation only records and hands the node to a person, so it runs at once, unless it brings a hot spare
    into service: that changes the partition, and in approval mode nothing changes before approval.
    """
    changes = d.action in CHANGING_ACTIONS or d.spare is not None
    if changes and config.mode_for(d.failure_class) == "approval":
        key = (d.node, d.action, d.incident or "-")
        if key in approved:
            d.approved = True
        else:
            d.needs_approval = True
            d.reason += " [waiting for approval {}:{}:{}]".format(*key)
    d.runnable = not d.needs_approval and d.earliest <= now
    return d
