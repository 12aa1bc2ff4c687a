# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A node's repair history, small enough to live in its Slurm ``Extra``/``Comment`` field.

Serialised as one line of JSON with short keys, integer epoch seconds and one-letter codes::

    {"gf":1,"n":3,"i":{"id":3,"c":"gm","k":"xid48","g":3,"t":1764680000,
     "s":[["g",1764680300,"f"],["b",1764680400,null]]},"r":"g1764680300,b1764680400",
     "p":"gl1764000000","cd":1764000900}

- ``gf``: format version (and the mark that the field is ours); ``n``: incidents opened so far.
- ``i``: the open incident: id, failure class, finding code, GPU index, first seen, steps
  ``[action, started, outcome]`` or ``[action, started, outcome, ran]`` with outcome ``o`` ok, ``f`` failed,
  ``t`` timed out, ``u`` never proven (the step's intent was written, but nothing shows that it ran: it does not
  count as tried), ``null`` pending; ``ran``: when the step was proven to have run (a reset: its own record right
  after the reset returned; a reboot: the node's boot time, once seen newer than the intent);
  ``e`` when it was escalated, ``sp`` the spare brought in for it, ``hk`` hook called (action codes),
  ``ev`` the eviction of the jobs on the node ``[signalled at, kind, "job,job", done at or null]`` with kind ``c``
  (checkpoint_requeue: signalled first) or ``r`` (requeue), written before the body acts (intent).
- ``r``: repair steps started (any incident), ``<action code><time>`` comma-separated, for budgets
  and escalation.
- ``p``: past incidents, ``<class code><first seen>`` comma-separated, for lemon detection.
- ``cd``: no new repair before this time (cooldown after a repair).
- ``nt``: a note on how the last incident ended when it did not end by a repair (an operator took the node
  over); dropped when the next incident opens.

A text that starts like ours (``{"gf":`` or ``{"cd":``) but does not parse is ours and damaged (a truncated
write): loads_ours() raises HistoryError for it ("history unreadable"), never calls it somebody else's.

Lists are pruned to the longest configured window and capped, so the text stays short (docs/repair.md
gives measured sizes). Everything a decision depends on is in here, so a decision is reproducible from
the history, the health report, the node state, the fleet counts and the config.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from ..slurmfacts import is_job_id
from .model import ACTION_CODE, CLASS_CODE, CODE_ACTION, CODE_CLASS, REPAIR_STEPS, RepairError

VERSION = 1
MAX_REPAIRS = 8
MAX_PAST = 8
MAX_CODE = 32
MAX_NOTE = 120
#: Jobs one eviction names at most (a node shared by more jobs evicts the first ones, the rest on the next run).
MAX_EVICT_JOBS = 16
EVICT_KINDS = {"c": "checkpoint_requeue", "r": "requeue"}
EVICT_KIND_CODES = {v: k for k, v in EVICT_KINDS.items()}
OUTCOMES = {"o": "ok", "f": "failed", "t": "timeout", "u": "unproven"}
OUTCOME_CODES = {v: k for k, v in OUTCOMES.items()}


class HistoryError(RepairError):
    """The stored text is not a gpufleet repair history."""


@dataclass
class Step:
    """One step of an incident. History never changes a Step in place (finish() puts a new one in its place), so
    copies of a history share their Steps."""

    action: str
    started: int
    outcome: Optional[str] = None  # None (pending), "ok", "failed", "timeout", "unproven"
    ran: Optional[int] = None  # when the step was proven to have run; None: no proof yet


@dataclass(frozen=True)
class Eviction:
    """The jobs of a node evicted in an incident: when the eviction began, its kind (``checkpoint_requeue`` or
    ``requeue``), the job ids, and when the policy saw every one of them off the node (None: under way)."""

    at: int
    kind: str
    jobs: Tuple[str, ...]
    done: Optional[int] = None


@dataclass
class Incident:
    """The open incident. ``steps`` and ``hooks`` are tuples, never changed in place (a change puts a new tuple in
    the field), so a copy shares them."""

    id: int
    failure_class: str
    code: str
    gpu: Optional[int]
    first_seen: int
    steps: Tuple[Step, ...] = ()
    escalated: Optional[int] = None
    spare: Optional[str] = None
    hooks: Tuple[str, ...] = ()
    eviction: Optional[Eviction] = None

    def tried(self, action: str) -> bool:
        """A step of ``action`` ran in this incident (a step never proven to have run was not tried)."""
        return any(s.action == action and s.outcome != "unproven" for s in self.steps)

    def pending(self) -> Optional[Step]:
        if self.steps and self.steps[-1].outcome is None:
            return self.steps[-1]
        return None


@dataclass
class History:
    """A node's repair history. ``repairs`` (started, action) and ``past`` (first seen, failure class) are tuples,
    never changed in place (a change puts a new tuple in the field), so a copy shares them."""

    seq: int = 0
    incident: Optional[Incident] = None
    repairs: Tuple[Tuple[int, str], ...] = ()
    past: Tuple[Tuple[int, str], ...] = ()
    cooldown_until: Optional[int] = None
    note: Optional[str] = None

    # -- queries --------------------------------------------------------------------------------
    def repairs_since(self, since: float) -> List[Tuple[int, str]]:
        return [r for r in self.repairs if r[0] >= since]

    def incidents_since(self, since: float) -> int:
        n = sum(1 for p in self.past if p[0] >= since)
        if self.incident is not None and self.incident.first_seen >= since:
            n += 1
        return n

    # -- changes (all return nothing; callers copy first) -----------------------------------------
    def open(self, failure_class: str, code: str, gpu: Optional[int], first_seen: float) -> Incident:
        self.seq += 1
        self.note = None
        self.incident = Incident(
            id=self.seq, failure_class=failure_class, code=code, gpu=gpu, first_seen=int(first_seen)
        )
        return self.incident

    def start(self, action: str, now: float) -> None:
        if self.incident is None:
            raise HistoryError(f"history: no open incident to start {action} in")
        self.incident.steps = (*self.incident.steps, Step(action, int(now)))
        if action in REPAIR_STEPS:
            self.repairs = (*self.repairs, (int(now), action))

    def started(self, action: str, now: float) -> History:
        """A copy with ``action`` started at ``now``: what ``h.copy()`` then ``.start(action, now)`` give, in one
        pass (a repair step's intent, once per step decided)."""
        inc = self.incident
        if inc is None:
            raise HistoryError(f"history: no open incident to start {action} in")
        t = int(now)
        return History(self.seq, self._incident_copy((*inc.steps, Step(action, t))),
                       (*self.repairs, (t, action)) if action in REPAIR_STEPS else self.repairs, self.past,
                       self.cooldown_until, self.note)

    def finish(self, outcome: str) -> bool:
        """Set the outcome of the pending step. Returns False when no step was pending."""
        if outcome not in OUTCOME_CODES:
            raise HistoryError("outcome: expected one of {}, got {!r}".format(", ".join(OUTCOME_CODES), outcome))
        inc = self.incident
        step = inc.pending() if inc is not None else None
        if inc is None or step is None:
            return False
        inc.steps = (*inc.steps[:-1], Step(step.action, step.started, outcome, step.ran))
        return True

    def settle(self, outcome: str, now: float, cooldown_s: float, close: Optional[bool] = None) -> None:
        """Set the pending step's ``outcome``; an ``ok`` (or ``close``) closes the incident and starts the cooldown."""
        self.finish(outcome)
        if close if close is not None else outcome == "ok":
            self.close(now, cooldown_s)

    def ran(self, now: float) -> bool:
        """Record that the pending step ran (proof, written right after it did). Returns False when no step was
        pending; a step already proven keeps its first proof."""
        inc = self.incident
        step = inc.pending() if inc is not None else None
        if inc is None or step is None:
            return False
        if step.ran is None:
            inc.steps = (*inc.steps[:-1], Step(step.action, step.started, None, int(now)))
        return True

    def retract(self, step: Step) -> None:
        """Forget a step that never ran (its intent was written, then the run died before acting)."""
        inc = self.incident
        if inc is not None and step in inc.steps:
            inc.steps = _without(inc.steps, step)
            if (step.started, step.action) in self.repairs:
                self.repairs = _without(self.repairs, (step.started, step.action))

    def close(self, now: float, cooldown_s: float) -> None:
        inc = self.incident
        if inc is None:
            return
        for s in inc.steps:  # a loop, not any() of a generator (a frame of its own per incident closed)
            if s.action in REPAIR_STEPS:
                self.cooldown_until = int(now + cooldown_s)
                break
        self.past = (*self.past, (inc.first_seen, inc.failure_class))
        self.incident = None

    def abandon(self, now: float, why: str) -> None:
        """Close the open incident without a repair (someone else owns the node now), with a note saying so."""
        inc = self.incident
        if inc is None:
            return
        self.past = (*self.past, (inc.first_seen, inc.failure_class))
        self.incident = None
        self.note = f"{int(now)} incident {inc.id} closed: {why}"[:MAX_NOTE]

    def prune(self, now: float, keep_s: float, cap: int = 0) -> None:
        """Forget entries older than ``keep_s`` and keep at most max(cap, MAX_*) of each list."""
        cut = now - keep_s
        self.repairs = _kept(self.repairs, cut, max(cap, MAX_REPAIRS))
        self.past = _kept(self.past, cut, max(cap, MAX_PAST))
        if self.cooldown_until is not None and self.cooldown_until <= now:
            self.cooldown_until = None

    def pruned(self, now: float, keep_s: float, cap: int = 0) -> History:
        """A copy with prune() applied: what ``h.copy()`` then ``.prune(now, keep_s, cap)`` give, in one pass."""
        cut = now - keep_s
        cd = self.cooldown_until
        if cd is not None and cd <= now:
            cd = None
        return History(self.seq, self._incident_copy(), _kept(self.repairs, cut, max(cap, MAX_REPAIRS)),
                       _kept(self.past, cut, max(cap, MAX_PAST)), cd, self.note)

    def _incident_copy(self, steps: Optional[Tuple[Step, ...]] = None) -> Optional[Incident]:
        """A copy of the open incident (``steps`` in place of its own, when given)."""
        inc = self.incident
        if inc is None:
            return None
        # id, failure_class, code, gpu, first_seen, steps and hooks (tuples, never changed in place: shared),
        # escalated, spare, eviction (positional: this runs twice per decision)
        return Incident(inc.id, inc.failure_class, inc.code[:MAX_CODE], inc.gpu, inc.first_seen,
                        inc.steps if steps is None else steps, inc.escalated, inc.spare or None, inc.hooks,
                        inc.eviction)

    def copy(self) -> History:
        """A copy that no change to it reaches the original through (what loads(dumps(self)) gives, without the text
        round trip): the records it shares (tuples, Steps, an Eviction) are never changed in place."""
        return History(self.seq, self._incident_copy(), self.repairs, self.past, self.cooldown_until, self.note)


def _kept(entries: Tuple[Tuple[int, str], ...], cut: float, keep: int) -> Tuple[Tuple[int, str], ...]:
    """prune() of one list: the entries at or after ``cut``, oldest first, the last ``keep`` (``entries`` itself
    when that is all of them, in order: this runs twice per decision)."""
    n = len(entries)
    if n < 2:
        return entries if not n or entries[0][0] >= cut else ()
    if n == 2 and entries[0] <= entries[1] and entries[0][0] >= cut and keep >= 2:
        return entries
    out = sorted(entries)
    if out[0][0] < cut:
        out = [e for e in out if e[0] >= cut]
    return tuple(out[-keep:] if len(out) > keep else out)


def _without(entries: Tuple[Any, ...], item: Any) -> Tuple[Any, ...]:
    """``entries`` without the first entry equal to ``item``."""
    i = entries.index(item)
    return (*entries[:i], *entries[i + 1:])


def dumps(h: History) -> str:
    """The stored form: what ``json.dumps(obj, separators=(",", ":"), sort_keys=True)`` gives for the
    documented object, written out directly (keys in sorted order; strings escaped as json does)."""
    cd = h.cooldown_until
    out = f'{{"gf":{VERSION}' if cd is None else f'{{"cd":{int(cd)},"gf":{VERSION}'
    inc = h.incident
    if inc is not None:
        i = f'"c":"{CLASS_CODE[inc.failure_class]}"'
        if inc.escalated is not None:
            i += f',"e":{int(inc.escalated)}'
        ev = inc.eviction
        if ev is not None:
            i += (f',"ev":[{int(ev.at)},"{EVICT_KIND_CODES[ev.kind]}",' + _json_str(",".join(ev.jobs))
                  + ("]" if ev.done is None else f",{int(ev.done)}]"))
        if inc.gpu is not None:
            i += f',"g":{int(inc.gpu)}'
        if inc.hooks:
            i += ',"hk":"' + "".join([ACTION_CODE[a] for a in inc.hooks]) + '"'
        i += f',"id":{int(inc.id)},"k":' + _json_str_memo(inc.code[:MAX_CODE])
        i += ',"s":[' + ",".join([f'["{ACTION_CODE[s.action]}",{int(s.started)},{_step_outcome_json(s.outcome)}'
                                  + ("]" if s.ran is None else f",{int(s.ran)}]") for s in inc.steps]) + "]"
        if inc.spare:
            i += ',"sp":' + _json_str_memo(inc.spare)
        out += ',"i":{' + i + f',"t":{int(inc.first_seen)}}}'
    out += f',"n":{int(h.seq)}'
    if h.note:
        out += ',"nt":' + _json_str(h.note[:MAX_NOTE])
    if h.past:
        out += ',"p":"' + ",".join([f"{CLASS_CODE[c]}{int(t)}" for t, c in h.past]) + '"'
    if h.repairs:
        out += ',"r":"' + ",".join([f"{ACTION_CODE[a]}{int(t)}" for t, a in h.repairs]) + '"'
    return out + "}"


def _json_str_memo(s: str) -> str:
    """_json_str(s), remembered for the few distinct codes and spare names a fleet has."""
    out = _JSON_STRS.get(s)
    if out is None:
        if len(_JSON_STRS) >= 4096:
            _JSON_STRS.clear()
        out = _JSON_STRS[s] = _json_str(s)
    return out


_JSON_STRS: Dict[str, str] = {}
_json_str = json.JSONEncoder(ensure_ascii=True).encode
# _outcome_json for every outcome a Step holds (anything else, None and "" included, is null)
_OUTCOME_JSON = {v: f'"{k}"' for k, v in OUTCOMES.items()}


def _step_outcome_json(outcome: Optional[str]) -> str:
    """A step's outcome in the stored form (anything but ok, failed and timeout is null)."""
    return _OUTCOME_JSON.get(outcome or "", "null")


def _outcome_json(outcome: Optional[str]) -> str:
    code = OUTCOME_CODES.get(outcome) if outcome else None
    return "null" if code is None else f'"{code}"'


def is_ours(text: Optional[str]) -> bool:
    """True when ``text`` is empty (nothing to lose) or a gpufleet history."""
    if text is None or not str(text).strip():
        return True
    try:
        d = json.loads(text)
    except (ValueError, RecursionError):
        return False
    return isinstance(d, dict) and "gf" in d


def _int(v: Any, where: str) -> int:
    if v.__class__ is int:  # the stored form's numbers: int(v) is v
        return v
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise HistoryError(f"history {where}: expected a number, got {v!r}")
    return int(v)


def _entries(v: Any, where: str) -> List[str]:
    if v is None or v == "":
        return []
    if not isinstance(v, str):
        raise HistoryError(f"history {where}: expected a comma-separated string, got {v!r}")
    return v.split(",")


def _num(v: str, where: str) -> int:
    if not v.isdigit():
        raise HistoryError(f"history {where}: expected a number, got {v!r}")
    return int(v)


def loads(text: Optional[str]) -> History:
    """Parse a stored history; empty text is an empty history. Raises HistoryError for foreign text."""
    if isinstance(text, History):
        return text
    if text is None or not str(text).strip():
        return History()
    try:
        d = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise HistoryError(f"history: not JSON ({exc}); the field holds something that is not ours")
    if not isinstance(d, dict) or "gf" not in d:
        raise HistoryError("history: no 'gf' key; the field holds something that is not ours")
    return _from_obj(d)


def looks_ours(text: Optional[str]) -> bool:
    """True when ``text`` starts the way every stored history starts (``{"gf":`` or ``{"cd":``), parsable or not."""
    return str(text or "").lstrip().startswith(('{"gf":', '{"cd":'))


def loads_ours(text: Optional[str]) -> Optional[History]:
    """loads() for a field that may hold somebody else's text: None when it is not ours (is_ours() false),
    the parsed History when it is; HistoryError when it is ours but malformed or truncated. One JSON parse."""
    if text is None or not str(text).strip():
        return History()
    try:
        d = json.loads(text)
    except (ValueError, RecursionError) as exc:
        if looks_ours(text):
            raise HistoryError(f"history: damaged or truncated ({exc})")
        return None
    if not isinstance(d, dict) or "gf" not in d:
        return None
    return _from_obj(d)


def _from_obj(d: dict) -> History:
    if d["gf"] != VERSION:
        raise HistoryError("history: version {!r}, expected {}".format(d["gf"], VERSION))
    try:
        h = History(seq=_int(d.get("n", 0), "n"))
        i = d.get("i")
        if i is not None:
            for key in ("k", "sp", "hk"):
                if i.get(key) is not None and not isinstance(i[key], str):
                    raise HistoryError(f"history i.{key}: expected a string, got {type(i[key]).__name__}")
            steps = []
            for s in i.get("s", []):
                if len(s) not in (3, 4):
                    raise HistoryError(f"history i.s: expected [action, started, outcome(, ran)], got {s!r}")
                outcome = OUTCOMES[s[2]] if s[2] is not None else None
                ran = _int(s[3], "i.s") if len(s) == 4 and s[3] is not None else None
                steps.append(Step(CODE_ACTION[s[0]], _int(s[1], "i.s"), outcome, ran))
            h.incident = Incident(
                id=_int(i["id"], "i.id"),
                failure_class=CODE_CLASS[i["c"]],
                code=str(i.get("k", "")),
                gpu=_int(i["g"], "i.g") if i.get("g") is not None else None,
                first_seen=_int(i["t"], "i.t"),
                steps=tuple(steps),
                escalated=_int(i["e"], "i.e") if i.get("e") is not None else None,
                spare=i.get("sp"),
                hooks=tuple(CODE_ACTION[c] for c in i.get("hk", "")),
                eviction=_eviction(i.get("ev")),
            )
        h.repairs = tuple([(_num(e[1:], "r"), CODE_ACTION[e[0]]) for e in _entries(d.get("r"), "r")])
        h.past = tuple([(_num(e[2:], "p"), CODE_CLASS[e[:2]]) for e in _entries(d.get("p"), "p")])
        if d.get("cd") is not None:
            h.cooldown_until = _int(d["cd"], "cd")
        if d.get("nt") is not None:
            if not isinstance(d["nt"], str):
                raise HistoryError("history nt: expected a note string")
            h.note = d["nt"][:MAX_NOTE]
    except (KeyError, IndexError, TypeError, AttributeError, ValueError, OverflowError) as exc:
        raise HistoryError(f"history: malformed ({type(exc).__name__}: {exc})")
    return h


def _eviction(v: Any) -> Optional[Eviction]:
    if v is None:
        return None
    if not isinstance(v, list) or len(v) not in (3, 4) or v[1] not in EVICT_KINDS or not isinstance(v[2], str):
        raise HistoryError(f"history i.ev: expected [signalled at, kind c or r, job ids, (done at)], got {v!r}")
    jobs = tuple(j for j in v[2].split(",") if j)
    if len(jobs) > MAX_EVICT_JOBS or not all(is_job_id(j) for j in jobs):
        raise HistoryError(f"history i.ev: expected at most {MAX_EVICT_JOBS} Slurm job ids, got {v[2]!r}")
    done = _int(v[3], "i.ev") if len(v) == 4 and v[3] is not None else None
    return Eviction(_int(v[0], "i.ev"), EVICT_KINDS[v[1]], jobs, done)


def record_outcome(
    text: Optional[str], outcome: str, now: float, cooldown_s: float = 1800.0, close: Optional[bool] = None
) -> str:
    """Record a verification result for the pending step of ``text`` and return the new text.

    ``outcome`` is ok, failed, timeout or unproven. An ``ok`` closes the incident (the node is back in service)
    unless ``close`` is False; the cooldown starts then.
    """
    h = loads(text)
    h.settle(outcome, now, cooldown_s, close)
    return dumps(h)


def record_ran(text: Optional[str], now: float) -> str:
    """Record in ``text`` that its pending step ran at ``now`` (the proof a reset leaves) and return the new text."""
    h = loads(text)
    h.ran(now)
    return dumps(h)
