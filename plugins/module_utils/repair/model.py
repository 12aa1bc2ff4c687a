# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Vocabulary of the repair policy: actions, failure classes, decisions and the plan.

Everything here is plain data (dataclasses, tuples, strings) so that the same objects serve the
Ansible modules, the node agent and the simulator.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Tuple

if TYPE_CHECKING:  # pragma: no cover - history.py imports this module
    from .history import History

#: Every action a decision can carry.
ACTIONS = ("wait", "drain", "evict", "reset_gpu", "reboot", "reimage", "replace", "resume", "escalate", "hold")
#: Repair steps, least drastic first (a ladder is an ordered subset of these).
REPAIR_STEPS = ("reset_gpu", "reboot", "reimage", "replace")
#: Actions that change something on the cluster (what approval mode gates).
CHANGING_ACTIONS = ("drain", "evict", "reset_gpu", "reboot", "reimage", "replace", "resume")
#: What happens to a job still running on a node the policy drained (``jobs.action``): ``wait`` for it to end,
#: ``requeue`` it at once (it loses the work since its last checkpoint), or signal it to checkpoint, then requeue it
#: (``checkpoint_requeue``: one checkpoint and a restart).
JOB_ACTIONS = ("wait", "requeue", "checkpoint_requeue")
#: Whom the checkpoint signal reaches (``jobs.signal_to``): the job steps' tasks (Slurm's default for ``--signal``),
#: the batch shell only (``scancel --batch``, Slurm's ``B:``), or both (``scancel --full``).
SIGNAL_TO = ("steps", "batch", "full")
#: How drastic a recommended action is; the health report's action maps onto the ladder with it.
SEVERITY = {"none": 0, "monitor": 0, "reset_gpu": 1, "reboot": 2, "reimage": 3, "replace": 4}
#: Failure classes the policy distinguishes.
FAILURE_CLASSES = ("gpu_memory", "gpu_lost", "nvlink", "thermal", "software", "probe", "gpu", "other")
MODES = ("automatic", "approval")
#: Rule names (``Decision.rule``) a body branches on; rules.py gives them and a body compares with these names,
#: never with a literal of its own.
RULE_BREAKER = "breaker"  # held: the circuit breaker is tripped, a person checks the fleet and resets it
RULE_LEMON = "lemon"  # retired (or escalated): too many incidents in the lemon window
RULE_BLAST_RADIUS_DRAIN = "blast_radius_drain"  # held: draining it would break a blast-radius limit
RULE_DRAINING = "draining"  # wait: drained by us, its jobs still ending
RULE_JOB_KEPT = "job_kept"  # wait: a job opted out of eviction keeps the node
RULE_EVICTION_LIMIT = "eviction_limit"  # held: evicting its jobs would break the eviction limit
VERDICTS = ("healthy", "degraded", "unhealthy", "unknown")

# One- or two-letter codes used by the compact history (see history.py). Never reuse a code.
ACTION_CODE = {
    "wait": "w",
    "drain": "d",
    "evict": "v",
    "reset_gpu": "g",
    "reboot": "b",
    "reimage": "i",
    "replace": "x",
    "resume": "u",
    "escalate": "e",
    "hold": "h",
}
CODE_ACTION = {v: k for k, v in ACTION_CODE.items()}
CLASS_CODE = {
    "gpu_memory": "gm",
    "gpu_lost": "gl",
    "nvlink": "nl",
    "thermal": "th",
    "software": "sw",
    "probe": "pr",
    "gpu": "gp",
    "other": "ot",
}
CODE_CLASS = {v: k for k, v in CLASS_CODE.items()}


class RepairError(ValueError):
    """Bad input to the repair policy; the message names the field and what was expected."""


@dataclass(frozen=True)
class SpareMove:
    """Bring the idle hot spare ``spare`` into ``partition`` because ``for_node`` left service.

    ``spare`` is None when the fleet summary only gave a count of idle spares (the body picks one).
    """

    spare: Optional[str]
    partition: str
    for_node: str

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class HookCall:
    """A call of the configured replacement / re-image hook, idempotent through ``idempotency_key``."""

    action: str
    node: str
    incident: str
    idempotency_key: str
    reason: str

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class JobStep:
    """What a body does to the jobs on a node the policy drained (the ``evict`` action).

    ``phase`` ``signal``: send ``signal`` to ``job_ids`` (to ``signal_to``), wait up to ``grace`` seconds for each to
    leave the node, then requeue each one that still runs on it or ended in any state but COMPLETED (a job that
    requeued itself, or runs elsewhere, is left alone). ``phase`` ``requeue``: requeue them now (``requeue``, a
    grace that ran out, a run that died after the signal). ``kept``: jobs on the node never evicted, and why.
    ``waits_for_nodes``: nodes the requeued jobs wait for when no hot spare comes in for them (0: one does)."""

    action: str
    phase: str
    job_ids: Tuple[str, ...]
    signal: str = "USR1"
    signal_to: str = "steps"
    grace: float = 600.0
    kept: Tuple[str, ...] = ()
    waits_for_nodes: int = 0

    def to_dict(self) -> Dict[str, Any]:
        d = asdict(self)
        d["job_ids"] = list(self.job_ids)
        d["kept"] = list(self.kept)
        return d


@dataclass
class Decision:
    """What to do with one node now.

    ``action`` is one of ACTIONS. ``earliest`` is the epoch second from which the action may run
    (for ``wait``/``hold``: when it is worth looking again). ``runnable`` tells a body whether to
    execute it in this run. ``hist`` is the node's history to store if the action is not executed
    (bookkeeping: first seen, outcomes); ``hist_after`` the one to store just before executing it.
    ``hist`` is None when the field must not be written (not ours). ``history`` and ``history_after``
    are the same histories as Slurm stores them (text, written out on first read).
    ``slurm_reason`` is the reason to show in Slurm on a held node that we keep out of service (why it waits and
    what a person does about it); None leaves the reason as it is. ``since`` is the start of the repair step that
    a health check after this decision verifies (the step started now, or the one in progress): kernel events up
    to it are what the step repaired, and the verification tells the node's agent to forget them.
    """

    node: str
    action: str
    reason: str
    earliest: float
    needs_approval: bool = False
    failure_class: Optional[str] = None
    incident: Optional[str] = None
    partition: Optional[str] = None
    code: Optional[str] = None
    gpu: Optional[int] = None
    approved: bool = False
    runnable: bool = False
    verify: bool = False
    spare: Optional[SpareMove] = None
    hook: Optional[HookCall] = None
    hist: Optional[History] = field(default=None, repr=False)
    hist_after: Optional[History] = field(default=None, repr=False)
    rule: str = ""
    slurm_reason: Optional[str] = None
    since: Optional[int] = None
    jobs: Optional[JobStep] = None

    @property
    def history(self) -> Optional[str]:
        """The history to store if the action is not executed, as text (None: leave the field as it is)."""
        return self._text_of("hist")

    @history.setter
    def history(self, text: Optional[str]) -> None:
        self.hist = None if text is None else _parse(text)

    @property
    def history_after(self) -> Optional[str]:
        """The history to store just before executing the action, as text."""
        return self._text_of("hist_after")

    def _text_of(self, attr: str) -> Optional[str]:
        """The stored text of the History in ``attr``, written out once per History object (a decision's
        histories are not changed after plan() returns them)."""
        h = getattr(self, attr)
        texts = self.__dict__.setdefault("_texts", {})
        got = texts.get(attr)
        if got is None or got[0] is not h:
            got = texts[attr] = (h, _text(h))
        return got[1]

    @property
    def approval_key(self) -> Tuple[str, str, str]:
        return (self.node, self.action, self.incident or "-")

    def to_dict(self) -> Dict[str, Any]:
        d: Dict[str, Any] = {}
        for f in fields(self):
            if f.name == "hist":
                d["history"] = self.history
            elif f.name == "hist_after":
                d["history_after"] = self.history_after
            else:
                d[f.name] = getattr(self, f.name)
        d["spare"] = self.spare.to_dict() if self.spare else None
        d["hook"] = self.hook.to_dict() if self.hook else None
        d["jobs"] = self.jobs.to_dict() if self.jobs else None
        return d


def _text(h: Optional[History]) -> Optional[str]:
    if h is None:
        return None
    from .history import dumps  # history.py imports this module

    return dumps(h)


def _parse(text: str) -> History:
    from .history import loads  # history.py imports this module

    return loads(text)


class Plan(list):
    """A list of Decision (one per node that needs attention, in a stable order) plus fleet-wide results.

    ``breaker`` is the circuit-breaker state to persist; ``spare_moves`` and ``hook_calls`` collect
    the per-decision ones; ``notes`` explains fleet-wide holds; ``unused_approvals`` lists approvals
    that matched no decision (stale or mistyped).
    """

    __slots__ = ("breaker", "notes", "unused_approvals")

    def __init__(self, decisions: Iterable[Decision] = (), breaker: Optional[BreakerState] = None,
                 notes: Iterable[str] = (), unused_approvals: Iterable[Tuple[str, str, str]] = ()) -> None:
        list.__init__(self, decisions)
        self.breaker = breaker
        self.notes: List[str] = list(notes)
        self.unused_approvals: List[Tuple[str, str, str]] = list(unused_approvals)

    @property
    def spare_moves(self) -> List[SpareMove]:
        return [d.spare for d in self if d.spare is not None]

    @property
    def hook_calls(self) -> List[HookCall]:
        return [d.hook for d in self if d.hook is not None]

    def runnable(self) -> List[Decision]:
        return [d for d in self if d.runnable]

    def counts(self) -> Dict[str, int]:
        out: Dict[str, int] = {}
        for d in self:
            out[d.action] = out.get(d.action, 0) + 1
        return out

    def to_dict(self) -> Dict[str, Any]:
        return {
            "decisions": [d.to_dict() for d in self],
            "breaker": self.breaker.to_dict() if self.breaker is not None else None,
            "spare_moves": [s.to_dict() for s in self.spare_moves],
            "hook_calls": [h.to_dict() for h in self.hook_calls],
            "notes": list(self.notes),
            "unused_approvals": [list(a) for a in self.unused_approvals],
            "counts": self.counts(),
        }


@dataclass
class BreakerState:
    """Circuit breaker. Once tripped it stays tripped until a person resets it (``reset()``);
    failures first seen before ``reset_at`` no longer count. Persist it with to_dict/from_dict."""

    tripped: bool = False
    since: Optional[float] = None
    reason: str = ""
    reset_at: Optional[float] = None
    nodes: List[str] = field(default_factory=list)

    def reset(self, now: float) -> BreakerState:
        return BreakerState(tripped=False, since=None, reason="", reset_at=float(now), nodes=[])

    def to_dict(self) -> Dict[str, Any]:
        return {
            "tripped": self.tripped,
            "since": self.since,
            "reason": self.reason,
            "reset_at": self.reset_at,
            "nodes": list(self.nodes),
        }

    @classmethod
    def from_dict(cls, data: Any) -> BreakerState:
        if data is None:
            return cls()
        if isinstance(data, BreakerState):
            return data
        if not isinstance(data, dict):
            raise RepairError(
                f"breaker: expected a mapping (tripped, since, reason, reset_at), got {type(data).__name__}"
            )
        unknown = set(data) - {"tripped", "since", "reason", "reset_at", "nodes"}
        if unknown:
            raise RepairError(
                "breaker: unknown key(s) {}; expected tripped, since, reason, reset_at, nodes".format(
                    ", ".join(sorted(unknown))
                )
            )
        tripped = data.get("tripped", False)
        if not isinstance(tripped, bool):
            raise RepairError(f"breaker.tripped: expected true or false, got {tripped!r}")
        out = cls(tripped=tripped, reason=str(data.get("reason") or ""))
        for key in ("since", "reset_at"):
            val = data.get(key)
            if val is not None:
                if isinstance(val, bool) or not isinstance(val, (int, float)):
                    raise RepairError(f"breaker.{key}: expected epoch seconds or null, got {val!r}")
                setattr(out, key, float(val))
        nodes = data.get("nodes") or []
        if not isinstance(nodes, list) or not all(isinstance(n, str) for n in nodes):
            raise RepairError("breaker.nodes: expected a list of node names")
        out.nodes = list(nodes)
        return out
