"""The seam between the simulator and the collection's brain.

Nothing here models a health rule or a repair rule. Symptoms (synthetic kernel-log lines of a fault class) go
through ``plugins/module_utils/health.judge`` and the node's virtual Slurm record goes through
``plugins/module_utils/repair.plan`` — the very functions the Ansible modules and the node agent run. The adapter
only translates: simulated time <-> epoch seconds, the engine's node record <-> the Slurm-shaped ``attention``
record (state, reason, report, compact history text), the fleet's counts <-> ``fleet``.

judge() results are cached per symptom pattern: a fault class always emits the same lines, so the verdict is the
same, and the cache keeps 100,000-GPU runs fast.

repair.plan() answers are cached too, exactly: the policy is a pure function of (history, report, node state,
fleet counts, config, now) (repair/history.py says so) and depends on time only through differences, so a call is
keyed with every time made relative to ``now`` (the history text split into its time-free pieces and the
offsets of its times, see split_history) and without the node's name. The fleet counts enter the key only as
``repair.fleet_view``: the outcomes of the checks plan() itself runs on them for a node planned alone (the policy's
code, not a model of its limits), memoised per distinct counts. Times reach the brain on a one-minute grid, as a
repair run would see them. A miss calls the real plan() on the real inputs; a hit translates the
stored answer back. Every ``verify_every``-th hit is recomputed with the real plan() and compared field by field:
a difference raises (tests run with verify_every=1).
"""

from __future__ import annotations

import re
from typing import Any

from ansible_collections.gpufleet.reliability.plugins.module_utils import health as _health
from ansible_collections.gpufleet.reliability.plugins.module_utils import repair as _repair

EPOCH0 = 1_767_571_200  # Monday 2026-01-05 00:00 UTC: simulated hour 0
PARTITION = "gpu"
HISTORY_VERSION = 1  # repair/history.py VERSION this translation knows
CANON = 1_000_000_000  # the 'now' of a cached (time-translated) decision
GRID_S = 60  # times reach the brain on a one-minute grid


_SPLIT_MEMO = 100_000  # history texts whose split is remembered (cleared when full; a memo, not a result)
_GF = f'"gf":{HISTORY_VERSION}'
_TIME = re.compile(r"(?<![0-9])([0-9]{10})(?![0-9])")


def split_history(text, now: int):
    """A stored history as (text pieces, times relative to ``now``): the time-free skeleton and the offsets.

    Every time in the stored form (repair/history.py: ``i.t``, ``i.s[][1]``, ``i.e``, the ``r`` and ``p``
    entries, ``cd``) is a standalone ten-digit epoch second, and no other value of it is one (counters, GPU
    indices, codes and the node names of this simulator are shorter), so one regular-expression split finds them
    all. The cache's verification compares the rebuilt text with the real plan() output byte for byte.
    """
    if text is None:
        return None
    pieces, times = _split_abs(text)
    return pieces, tuple([t - now for t in times])


def _split_abs(text: str) -> tuple:
    """split_history with the times left absolute (what the brain memoises per text)."""
    if text and _GF not in text:
        raise ValueError(f"history text in an unknown format, cannot translate it: {text!r}")
    parts = _TIME.split(text)
    return tuple(parts[0::2]), tuple([int(t) for t in parts[1::2]])


_FORMATS: dict = {}  # text pieces -> the %-format that joins them around the times (a memo, bounded like _SPLIT_MEMO)


def join_history(split, now: int):
    """The inverse of split_history: the text with every offset turned back into a time at ``now``."""
    if split is None:
        return None
    pieces, rel = split
    if not rel:
        return pieces[0]
    return _format(pieces) % tuple([now + t for t in rel])


def _format(pieces: tuple) -> str:
    fmt = _FORMATS.get(pieces)
    if fmt is None:
        if len(_FORMATS) >= _SPLIT_MEMO:
            _FORMATS.clear()
        fmt = _FORMATS[pieces] = "%d".join([p.replace("%", "%%") for p in pieces])
    return fmt


class CachedDecision:
    """What the engine reads from a Decision, rebuilt from the cache (times translated back, histories rebuilt
    only when read)."""

    __slots__ = ("node", "action", "rule", "earliest", "needs_approval", "approved", "code", "incident",
                 "_h", "_ha", "_now", "_memo")
    FIELDS = ("action", "rule", "earliest", "needs_approval", "approved", "code", "incident", "history",
              "history_after")

    def __init__(self, node, action, rule, earliest, needs_approval, approved, code, incident, h, ha, now,
                 memo=None):
        self.node, self.action, self.rule, self.earliest = node, action, rule, earliest
        self.needs_approval, self.approved, self.code, self.incident = needs_approval, approved, code, incident
        self._h, self._ha, self._now, self._memo = h, ha, now, memo

    def _join(self, split):
        pieces, rel = split
        if not rel:
            text = pieces[0]
            times = rel
        else:
            now = self._now
            times = tuple([now + t for t in rel])
            text = _format(pieces) % times
        if self._memo is not None:
            # the engine hands this text back on the node's next decision: remember its split
            self._memo[text] = (pieces, times)
        return text

    @property
    def history(self):
        h = self._h
        if h is None or h.__class__ is str:
            return h
        self._h = h = self._join(h)  # joined once, on first read
        return h

    @property
    def history_after(self):
        h = self._ha
        if h is None or h.__class__ is str:
            return h
        self._ha = h = self._join(h)
        return h

    @property
    def approval_key(self):
        return (self.node, self.action, self.incident or "-")


class CollectionBrain:
    def __init__(self, health_config: dict | None = None, repair_config: dict | None = None,
                 mode: str = "automatic", cache: bool = True, verify_every: int = 97):
        self.health_config = dict(health_config or {})
        cfg = dict(repair_config or {})
        if mode == "approval":
            modes = dict(cfg.get("modes") or {})
            modes["default"] = "approval"
            cfg["modes"] = modes
        self.repair_config = _repair.RepairConfig.from_dict(cfg)
        self._retention = _repair.retention(self.repair_config)
        self._judged: dict[tuple, dict] = {}
        self.calls = {"judge": 0, "judge_cached": 0, "plan": 0, "plan_cached": 0, "plan_verified": 0}
        self._healthy = None
        self.cache = cache
        self.verify_every = verify_every
        self._plans: dict = {}
        self._views: dict = {}  # the fleet counts a decision is asked with -> repair.fleet_view of them
        self._splits: dict = {}  # history text -> (pieces, absolute times): _split_abs, memoised

    # --- health rules --------------------------------------------------------------------------------------------
    def judge(self, lines: tuple) -> dict:
        """The real rules' verdict on a node showing these kernel-log lines (cached per pattern)."""
        hit = self._judged.get(lines)
        if hit is not None:
            self.calls["judge_cached"] += 1
            return hit
        self.calls["judge"] += 1
        rep = _health.judge(snapshot=None, kmsg_lines=list(lines), config=self.health_config or None, state=None,
                            now=EPOCH0).to_dict()
        out = {"verdict": rep.get("verdict"), "action": rep.get("action"), "code": rep.get("code"),
               "gpu": rep.get("gpu"), "report": rep}
        self._judged[lines] = out
        return out

    def healthy_report(self) -> dict:
        if self._healthy is None:
            self._healthy = self.judge(())
        return self._healthy

    # --- repair policy -------------------------------------------------------------------------------------------
    def plan_node(self, record: dict, fleet, now_h: float, approvals=(), breaker=None, fleet_key=None) -> Any:
        """One Decision for one node (the fleet comes in as counts, as in a real repair run).

        ``fleet`` is the counts (Sim.fleet_counts' shape) or a function that builds them; ``fleet_key``, when
        given, is what _fleet_key gives for them plus the record's partition and domain kinds (the caller builds
        it without the dict; the counts are then built only when the real plan() or fleet_view() reads them)."""
        now = to_epoch(now_h)
        if not self.cache or breaker is not None:
            return self._plan(record, _counts(fleet), now, approvals, breaker)
        name = record["name"]
        rt, pt = record.get("reason_time"), record.get("report_time")
        # the fleet enters the key only through what plan() reads of it for this node (repair.fleet_view: the
        # outcomes of its own blast-radius, min-healthy, breaker and spare checks), memoised per raw counts
        if fleet_key is None:
            fleet = _counts(fleet)
            fleet_key = _fleet_key(fleet) + (record.get("partition"), tuple(record.get("domains") or ()))
        view = self._views.get(fleet_key)
        if view is None:
            fleet = _counts(fleet)
            view = self._views[fleet_key] = _repair.fleet_view(fleet, record, self.repair_config)
        key = (record["state"], record.get("reason"), record.get("reason_user"),
               None if rt is None else rt - now, id(record.get("report")), None if pt is None else pt - now,
               self._split(record.get("history"), now), view,
               frozenset((a, i) for n, a, i in approvals if n == name) if approvals else None)
        hit = self._plans.get(key)
        if hit is None:
            # second chance: plan() decides on the pruned history only (repair.retention), so a history whose
            # stale entries (expired cooldown, incidents older than every window) differ decides the same way
            text = record.get("history")
            if text is not None and text.strip():
                h = _repair.loads(text)
                h.prune(now, *self._retention)
                ckey = key[:6] + (("pruned", self._split(_repair.dumps(h), now)),) + key[7:]
                hit = self._plans.get(ckey)
                if hit is not None:
                    self._plans[key] = hit
            else:
                ckey = key
        if hit is None:
            d = self._plan(record, _counts(fleet), now, approvals, breaker)
            hit = (d.action, d.rule, d.earliest - now, d.needs_approval, d.approved, d.code, d.incident,
                   self._split(d.history, now), self._split(d.history_after, now))
            self._plans[key] = self._plans[ckey] = hit
            return d
        self.calls["plan_cached"] += 1
        a, rule, e_rel, na, ap, code, inc, h, ha = hit
        src = key[6]
        if src is not None:
            # a history the decision leaves as it came in is that very text: no join needed
            if h == src:
                h = record["history"]
            if ha == src:
                ha = record["history"]
        d = CachedDecision(name, a, rule, now + e_rel, na, ap, code, inc, h, ha, now, self._splits)
        if self.verify_every and self.calls["plan_cached"] % self.verify_every == 0:
            self.calls["plan_verified"] += 1
            real = self._plan(record, _counts(fleet), now, approvals, breaker)
            for f in CachedDecision.FIELDS:
                if getattr(real, f) != getattr(d, f):
                    raise RuntimeError(f"repair.plan cache diverged on {f}: real {getattr(real, f)!r}, "
                                       f"cached {getattr(d, f)!r} (record {record!r})")
        return d

    def _split(self, text, now: int):
        """split_history(text, now), the text's split memoised (histories come back on the next decision)."""
        if text is None:
            return None
        s = self._splits.get(text)
        if s is None:
            if len(self._splits) >= _SPLIT_MEMO:
                self._splits.clear()
            s = self._splits[text] = _split_abs(text)
        return s[0], tuple([t - now for t in s[1]])

    def _plan(self, record, fleet, now, approvals, breaker):
        self.calls["plan"] += 1
        p = _repair.plan(fleet, [record], self.repair_config, now, approvals=approvals, breaker=breaker)
        return p[0]


def _counts(fleet):
    """The fleet counts: ``fleet`` itself, or what the function ``fleet`` builds."""
    return fleet() if callable(fleet) else fleet


def _fleet_key(fleet: dict) -> tuple:
    """The raw counts of a fleet as Sim.fleet_counts builds it (one partition, the node's rack): the memo key of
    its repair.fleet_view."""
    part = fleet["partitions"][PARTITION]
    (_rack, rc), = fleet["domains"]["rack"].items()
    return (fleet["total"], part["total"], part["available"], part["unavailable"], part.get("spares_idle", 0),
            rc["total"], rc["available"], rc["unavailable"])


def to_epoch(h: float) -> int:
    """Simulated hours -> epoch seconds on the brain's one-minute grid."""
    return EPOCH0 + int(round(h * 60.0)) * GRID_S


def to_hours(epoch: float) -> float:
    return (epoch - EPOCH0) / 3600.0


def default_brain(sc: dict, mode: str = "automatic", **kw) -> CollectionBrain:
    return CollectionBrain(sc.get("health_config"), sc.get("repair_config"), mode=mode, **kw)
