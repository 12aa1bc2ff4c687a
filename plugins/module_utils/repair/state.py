# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Typed inputs of the repair policy: a node's state and the fleet summary.

The Slurm adapter (and the simulator) build these; ``plan()`` takes them as they are, with no parsing per call.
``NodeState.from_dict`` and ``FleetSummary.from_dict`` turn the older dict records (``fleet.build_inputs``'s
shape) into them, validating every field and naming the one that is wrong.

The history is a :class:`History` object here; it is text only at the Slurm edge (the node's ``Extra`` or
``Comment`` field), where ``NodeState.from_dict`` / :func:`history_fields` read it and ``dumps`` writes it.

Whether a node is out of service, whether we drained it and whether it is busy are the rules of ``slurmfacts.py``;
the properties here only apply them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Dict, FrozenSet, Iterable, List, Optional, Tuple, Union

from .. import slurmfacts
from .history import History, HistoryError, dumps, loads_ours
from .model import RepairError

REBOOT_FLAGS = slurmfacts.REBOOT_FLAGS  # imported from here by older callers; the one definition is in slurmfacts


# ------------------------------------------------------------------------------------------------
# fleet summary
# ------------------------------------------------------------------------------------------------
@dataclass
class Counts:
    """Nodes of one partition or failure domain: total, available (in service), unavailable, idle hot spares
    (their names, or None for each spare when only a count is known)."""

    total: int
    available: int
    unavailable: int
    spares: List[Optional[str]] = field(default_factory=list)

    @classmethod
    def from_dict(cls, d: Any, where: str) -> Counts:
        if not isinstance(d, Mapping):
            raise RepairError(f"{where}: expected a mapping with total, available, unavailable")
        vals: Dict[str, int] = {}
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
            raise RepairError(
                f"{where}.spares_idle: expected a list of idle spare node names or a count, got {raw!r}"
            )
        return cls(vals["total"], vals["available"], vals["unavailable"], spares)

    def to_dict(self, spares: bool = True) -> Dict[str, Any]:
        """As plain data (a body's report): ``spares_idle`` only for a partition (``spares``)."""
        out: Dict[str, Any] = {"total": self.total, "available": self.available, "unavailable": self.unavailable}
        if spares:
            out["spares_idle"] = list(self.spares)
        return out


@dataclass
class FleetSummary:
    """Counts per partition and per failure domain (``domains[kind][name]``, kind ``rack`` or ``switch``).

    ``domains`` holds Counts; a summary made by ``from_dict`` keeps the raw mappings and reads one only when a
    node that needs attention is in that domain, so a fleet of many racks costs nothing per plan.
    """

    total: int
    partitions: Dict[str, Counts]
    domains: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    _parsed: Dict[Tuple[str, str], Optional[Counts]] = field(default_factory=dict, repr=False, compare=False)

    def domain(self, kind: str, name: str) -> Optional[Counts]:
        raw = (self.domains.get(kind) or {}).get(name)
        if raw is None or raw.__class__ is Counts:
            return raw
        key = (kind, name)
        if key not in self._parsed:
            self._parsed[key] = Counts.from_dict(raw, f"fleet.domains.{kind}.{name}")
        return self._parsed[key]

    @classmethod
    def from_dict(cls, fleet: Any) -> FleetSummary:
        """The summary from ``fleet.build_inputs``'s dict (``{total, partitions: {p: counts}, domains: ...}``)."""
        if isinstance(fleet, FleetSummary):
            return fleet
        if not isinstance(fleet, Mapping):
            raise RepairError(f"fleet: expected a mapping with partitions (and domains), got {type(fleet).__name__}")
        parts_raw = fleet.get("partitions") or {}
        if not isinstance(parts_raw, Mapping):
            raise RepairError("fleet.partitions: expected a mapping of partition name to counts")
        parts = {str(k): Counts.from_dict(v, f"fleet.partitions.{k}") for k, v in parts_raw.items()}
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

    def to_dict(self) -> Dict[str, Any]:
        """As plain data, the shape ``from_dict`` reads (a body's report of the fleet it planned with)."""
        doms = {kind: {name: self.domain(kind, name).to_dict(spares=False)  # type: ignore[union-attr]
                       for name in members}
                for kind, members in self.domains.items()}
        return {"total": self.total, "partitions": {p: c.to_dict() for p, c in self.partitions.items()},
                "domains": doms}


# ------------------------------------------------------------------------------------------------
# jobs
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class JobInfo:
    """A job the policy may act on: one running on a node that needs attention (``on_node``), or one named by that
    node's eviction under way, wherever it is now. ``state`` is Slurm's job state in upper case; ``requeue`` whether
    Slurm may requeue it (``--no-requeue`` or ``JobRequeue=0`` make it False); ``comment`` and ``qos`` are read for
    the opt-out (``jobs.opt_out_comment``, ``jobs.opt_out_qos``)."""

    job_id: str
    state: str
    requeue: bool = True
    comment: str = ""
    qos: str = ""
    on_node: bool = True

    @classmethod
    def from_dict(cls, d: Any, where: str) -> JobInfo:
        if isinstance(d, JobInfo):
            return d
        if not isinstance(d, Mapping):
            raise RepairError(f"{where}: expected a mapping (job_id, state, requeue, comment, qos, on_node)")
        jid = d.get("job_id")
        if not slurmfacts.is_job_id(jid):
            raise RepairError(f"{where}.job_id: expected a Slurm job id (123 or 123_4), got {jid!r}")
        state = d.get("state")
        if not isinstance(state, str) or not state:
            raise RepairError(f"{where}.state: expected a Slurm job state, got {state!r}")
        for key in ("requeue", "on_node"):
            if key in d and not isinstance(d[key], bool):
                raise RepairError(f"{where}.{key}: expected true or false, got {d[key]!r}")
        return cls(str(jid), state.upper(), d.get("requeue", True), str(d.get("comment") or ""),
                   str(d.get("qos") or ""), d.get("on_node", True))


# ------------------------------------------------------------------------------------------------
# node state
# ------------------------------------------------------------------------------------------------
def split_state(state: str, flags: Iterable[Any] = ()) -> Tuple[str, FrozenSet[str]]:
    """A Slurm state as scontrol or sinfo writes it (``IDLE+DRAIN``, ``down*``, ``drained``) and extra flags ->
    (base state in lower case, upper-case flags). sinfo's compound words become a base and the DRAIN flag."""
    words = [w for w in state.upper().replace("*", "").split("+") if w]
    base = words[0] if words else "UNKNOWN"
    fl = set(words[1:])
    fl |= {str(f).upper() for f in flags}
    if base in ("DRAINED", "DRAIN"):
        base = "IDLE"
        fl.add("DRAIN")
    elif base == "DRAINING":
        base = "ALLOCATED"
        fl.add("DRAIN")
    return base.lower(), frozenset(fl)


@dataclass
class NodeState:
    """One node that needs attention, as the repair policy reads it.

    ``state`` is Slurm's base state in lower case (``idle``, ``mixed``, ``allocated``, ``down``, ...), ``flags``
    the upper-case state flags (``DRAIN``, ``COMPLETING``, ``REBOOT_ISSUED``, ...). ``report`` is the latest health
    report (the health brain's dict) and ``report_time`` when it was written; ``report_error`` says why it could
    not be read. ``history`` is the node's repair history (None: the field is empty); ``history_foreign`` is True
    when the field holds someone else's text (never touched), ``history_error`` says why a history of ours cannot
    be read. ``jobs`` are the jobs on the node (and those its eviction under way names), read by the adapter for a
    busy node we drained; None when they were not read.
    """

    name: str
    partitions: Tuple[str, ...] = ()
    domains: Dict[str, str] = field(default_factory=dict)
    state: str = "unknown"
    flags: FrozenSet[str] = frozenset()
    reason: str = ""
    reason_user: str = ""
    reason_time: Optional[float] = None
    report: Optional[Mapping[str, Any]] = None
    report_time: Optional[float] = None
    history: Optional[History] = None
    history_foreign: bool = False
    history_error: Optional[str] = None
    boot_time: Optional[float] = None
    report_error: Optional[str] = None
    #: the jobs on the node, and those its eviction under way names (None: not read; the policy then only waits)
    jobs: Optional[Tuple[JobInfo, ...]] = None

    # -- the rules of slurmfacts.py, applied ---------------------------------------------------------------------------
    @property
    def out_of_service(self) -> bool:
        """DOWN, drained, draining or failed."""
        return slurmfacts.out_of_service_split(self.state, self.flags)

    def foreign(self, prefix: str, out: Optional[bool] = None) -> Optional[str]:
        """None when we may act on the node; else why not (out of service with a reason that is not ours, or in a
        maintenance reservation). ``out``: :attr:`out_of_service`, when the caller has read it already."""
        if out is None:
            out = self.out_of_service
        maint = slurmfacts.in_maintenance_split(self.flags)
        if not out and prefix and not maint:
            return None  # in service and in no maintenance window: nobody's
        return slurmfacts.foreign_reason(self.state, self.flags, self.reason, prefix, out=out, maint=maint)

    @property
    def in_maintenance(self) -> bool:
        """In an active maintenance reservation (Slurm's MAINT flag)."""
        return slurmfacts.in_maintenance_split(self.flags)

    def drained_by(self, prefix: str) -> bool:
        """Out of service with a reason that starts with ``prefix``: we took it out."""
        out = self.out_of_service
        return out and slurmfacts.foreign_reason(self.state, self.flags, self.reason, prefix, out=out,
                                                 maint=slurmfacts.in_maintenance_split(self.flags)) is None

    @property
    def out_reason(self) -> str:
        """The reason, only while the node is out of service; '' for a node in service.

        Slurm 24.11 keeps a node's last reason after RESUME (22.05 clears it) and no update clears it, so on an
        idle, undrained node the reason is a leftover of an earlier drain and means nothing.
        """
        return self.reason if self.out_of_service else ""

    @property
    def busy(self) -> bool:
        """Jobs still on the node (running or completing)."""
        return slurmfacts.busy_split(self.state.lower(), self.flags)

    @property
    def rebooting(self) -> bool:
        return bool(self.flags & REBOOT_FLAGS)

    @property
    def history_empty(self) -> bool:
        """The history field holds nothing at all (nothing to lose, nothing to write back unchanged)."""
        return self.history is None and not self.history_foreign and self.history_error is None

    # -- the older dict records -----------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: Any, i: int = 0) -> NodeState:
        """A node from ``fleet.build_inputs``'s record (name, partition(s), domains, state, flags, reason,
        reason_user, reason_time, report, report_time, report_error, history text or History, boot_time).
        ``i`` is the record's index, for error messages."""
        if isinstance(d, NodeState):
            return d
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
        raw_flags = d.get("flags") or ()
        if isinstance(raw_flags, str):
            raw_flags = [f for f in raw_flags.replace(",", "+").split("+") if f]
        if not isinstance(raw_flags, (list, tuple, set, frozenset)):
            raise RepairError(f"{where}.flags: expected a list of Slurm state flags, got {raw_flags!r}")
        base, flags = split_state(state, raw_flags)
        hist = d.get("history")
        if hist is not None and not isinstance(hist, (str, History)):
            raise RepairError(f"{where}.history: expected the stored history text, got {type(hist).__name__}")
        history, foreign, error = history_fields(hist)
        jobs = d.get("jobs")
        if jobs is not None:
            if not isinstance(jobs, (list, tuple)):
                raise RepairError(f"{where}.jobs: expected a list of jobs (job_id, state, requeue, ...), got {jobs!r}")
            jobs = tuple(JobInfo.from_dict(j, f"{where}.jobs[{k}]") for k, j in enumerate(jobs))
        return cls(
            name=name,
            partitions=tuple(sorted(parts)),
            domains={str(k): str(v) for k, v in domains.items()},
            state=base,
            flags=flags,
            reason=str(d.get("reason") or ""),
            reason_user=str(d.get("reason_user") or ""),
            reason_time=_opt_time(d.get("reason_time"), where + ".reason_time"),
            report=d.get("report"),
            report_time=_opt_time(d.get("report_time"), where + ".report_time"),
            history=history,
            history_foreign=foreign,
            history_error=error,
            boot_time=_opt_time(d.get("boot_time"), where + ".boot_time"),
            report_error=str(d["report_error"])[:300] if d.get("report_error") else None,
            jobs=jobs,
        )

    def history_text(self) -> Optional[str]:
        """The history as Slurm stores it (None when the field is empty or not ours to read)."""
        return None if self.history is None else dumps(self.history)


def history_fields(text: Union[str, History, None]) -> Tuple[Optional[History], bool, Optional[str]]:
    """The Slurm edge: a history field's text -> (History or None when empty, foreign, error).

    ``foreign``: the field holds someone else's text (never overwritten). ``error``: the text is ours but cannot
    be read (a newer version, damaged, truncated); the policy holds that node, naming the problem.
    """
    if isinstance(text, History):
        return text, False, None
    if text is None or not text.strip():
        return None, False, None
    try:
        h = loads_ours(text)
    except HistoryError as exc:
        return None, False, str(exc)
    if h is None:
        return None, True, None
    return h, False, None


def _opt_time(v: Any, where: str) -> Optional[float]:
    if v is None or v == 0:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise RepairError(f"{where}: expected epoch seconds, got {v!r}")
    return float(v)
