"""The seam between the simulator and the collection's brain.

Nothing here models a health rule or a repair rule. Symptoms (synthetic kernel-log lines of a fault class) go
through ``plugins/module_utils/health.judge`` and the node's virtual Slurm record goes through
``plugins/module_utils/repair.plan`` — the very functions the Ansible modules and the node agent run. The adapter
only translates: simulated time <-> epoch seconds, the engine's node record <-> the Slurm-shaped ``attention``
record (state, reason, report, compact history text, which the engine keeps as a HistoryText until a real plan()
reads it), the fleet's counts <-> ``fleet``.

judge() results are cached per symptom pattern: a fault class always emits the same lines, so the verdict is the
same, and the cache keeps 100,000-GPU runs fast.

repair.plan() answers are cached too, exactly: the policy is a pure function of (history, report, node state, fleet
counts, config, now) (repair/history.py says so) and depends on time only through differences, so a call is keyed
with its times made relative to ``now`` (the history text split into its time-free pieces and its times, see
split_history) and without the node's name. A time older than ``repair.time_horizon``'s ``exact`` (for the step the
history has in progress) enters the key only as what plan() reads of it: its side of each longer window and its
rank among the node's old times; a stored decision refers to an old time it copies by that rank. The fleet counts
enter the key only as ``repair.fleet_view``: the outcomes of the checks plan() itself runs on them for a node
planned alone (the policy's code, not a model of its limits), memoised per distinct counts. Both views are the
policy's published contracts, tested against plan() in tests/unit/module_utils/repair. Times reach the brain on a
one-minute grid, as a repair run would see them. A miss calls the real plan() on the real inputs; a hit translates
the stored answer back. Every ``verify_every``-th hit is recomputed with the real plan() and compared field by
field: a difference raises (tests run with verify_every=1).
"""

from __future__ import annotations

import re
from bisect import bisect_left
from typing import Any

from ansible_collections.gpufleet.reliability.plugins.module_utils import health as _health
from ansible_collections.gpufleet.reliability.plugins.module_utils import repair as _repair

EPOCH0 = 1_767_571_200  # Monday 2026-01-05 00:00 UTC: simulated hour 0
PARTITION = "gpu"
HISTORY_VERSION = 1  # repair/history.py VERSION this translation knows
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


class HistoryText:
    """A repair history the cache rebuilt: its skeleton (the brain's record of its text pieces, see
    CollectionBrain._skeleton) and absolute times, formatted into the stored text only when something reads the text
    (a real plan() call, a verification). The engine keeps it in the node's record as it would keep the text, and the
    brain reads its times back without formatting or splitting anything."""

    __slots__ = ("sk", "times", "_text")

    def __init__(self, sk: tuple, times: tuple):
        self.sk, self.times, self._text = sk, times, None

    @property
    def text(self) -> str:
        t = self._text
        if t is None:
            pieces = self.sk[0]
            if self.times:
                fmt = _FORMATS.get(pieces)
                t = (_format(pieces) if fmt is None else fmt) % self.times
            else:
                t = pieces[0]
            self._text = t
        return t

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"HistoryText({self.text!r})"


def history_text(h):
    """The text of a history as the engine keeps it: a text, a HistoryText or None."""
    return h.text if h.__class__ is HistoryText else h


class CachedDecision:
    """What the engine reads from a Decision (a real one, or one rebuilt from the cache with its times translated
    back). ``history`` and ``history_after`` are the texts; ``history_ref`` and ``history_after_ref`` the same
    histories as the engine keeps them (a text or a HistoryText, formatted only if a real plan() reads it)."""

    __slots__ = ("node", "action", "rule", "earliest", "needs_approval", "approved", "code", "incident",
                 "_h", "_ha", "_now")
    FIELDS = ("action", "rule", "earliest", "needs_approval", "approved", "code", "incident", "history",
              "history_after")

    def __init__(self, node, action, rule, earliest, needs_approval, approved, code, incident, h, ha, now):
        self.node, self.action, self.rule, self.earliest = node, action, rule, earliest
        self.needs_approval, self.approved, self.code, self.incident = needs_approval, approved, code, incident
        self._h, self._ha, self._now = h, ha, now

    @property
    def history_ref(self):
        h = self._h
        if h.__class__ is tuple:  # (skeleton, offsets from now): made into a HistoryText once, on first read
            sk, rel = h
            self._h = h = HistoryText(sk, tuple(map(self._now.__add__, rel)))
        return h

    @property
    def history_after_ref(self):
        h = self._ha
        if h.__class__ is tuple:
            sk, rel = h
            self._ha = h = HistoryText(sk, tuple(map(self._now.__add__, rel)))
        return h

    @property
    def history(self):
        return history_text(self.history_ref)

    @property
    def history_after(self):
        return history_text(self.history_after_ref)

    @property
    def approval_key(self):
        return (self.node, self.action, self.incident or "-")

    @classmethod
    def of(cls, d, now: int):
        """A real Decision in the same shape."""
        return cls(d.node, d.action, d.rule, d.earliest, d.needs_approval, d.approved, d.code, d.incident,
                   d.history, d.history_after, now)


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
        self._skels: dict = {}  # history text pieces -> the brain's record of that skeleton (see _skeleton)
        self._n_skels = 0
        self._no_skel = self._skeleton(None)  # no history at all
        self._judged: dict[tuple, dict] = {}
        self.calls = {"judge": 0, "judge_cached": 0, "plan": 0, "plan_cached": 0, "plan_verified": 0,
                      "plan_cached_old": 0}
        self._healthy = None
        self.cache = cache
        self.verify_every = verify_every
        self._plans: dict = {}
        self._views: dict = {}  # the fleet counts a decision is asked with -> repair.fleet_view of them
        self._splits: dict = {}  # history text -> (skeleton, absolute times): _split, memoised

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
        now = EPOCH0 + round(now_h * 60.0) * GRID_S  # to_epoch(now_h)
        if not self.cache or breaker is not None:
            return CachedDecision.of(self._plan(record, _counts(fleet), now, approvals, breaker), now)
        get = record.get
        # the fleet enters the key only through what plan() reads of it for this node (repair.fleet_view: the
        # outcomes of its own blast-radius, min-healthy, breaker and spare checks), memoised per raw counts
        if fleet_key is None:
            fleet = _counts(fleet)
            fleet_key = _fleet_key(fleet) + (get("partition"), tuple(get("domains") or ()))
        view = self._views.get(fleet_key)
        if view is None:
            fleet = _counts(fleet)
            view = self._views[fleet_key] = _repair.fleet_view(fleet, _textual(record), self.repair_config)
        # the times (see _times): when none is older than the horizon, every one is an offset from now
        text = get("history")
        if text is None:
            sk, abs_t = self._no_skel, ()
        elif text.__class__ is HistoryText:
            sk, abs_t = text.sk, text.times
        else:
            s = self._splits.get(text)
            sk, abs_t = self._split(text) if s is None else s
        rt, pt = get("reason_time"), get("report_time")
        cut = now - sk[2]
        if ((rt is None or rt >= cut) and (pt is None or pt >= cut) and get("boot_time") is None
                and (not abs_t or min(abs_t) >= cut)):
            olds = ()
            tkey = (sk[1], tuple(map(now.__rsub__, abs_t)), None if rt is None else rt - now,
                    None if pt is None else pt - now)
        else:
            tkey, olds = self._times(now, sk, abs_t, (rt, pt, get("boot_time")))
        key = (record["state"], get("reason"), get("reason_user"), id(get("report")), tkey, view,
               frozenset((a, i) for n, a, i in approvals if n == record["name"]) if approvals else None)
        hit = self._plans.get(key)
        if hit is None:
            d = self._plan(record, _counts(fleet), now, approvals, breaker)
            hit = self._store(d, record, now, olds, cut)
            if hit is not None:
                self._plans[key] = hit
            return CachedDecision.of(d, now)
        self.calls["plan_cached"] += 1
        if olds:
            self.calls["plan_cached_old"] += 1  # a hit on a key with times older than the horizon
        a, rule, e_rel, na, ap, code, inc, h, ha, old_refs = hit
        if h is _SAME:
            h = record["history"]  # the decision leaves the history as it came in: that very history
        if ha is _SAME:
            ha = record["history"]
        if old_refs:
            # times the decision copied from the input's old times: this input's values of them
            if h.__class__ is tuple:
                h = _resolve(h, olds, now)
            if ha.__class__ is tuple:
                ha = _resolve(ha, olds, now)
        d = CachedDecision(record["name"], a, rule, now + e_rel, na, ap, code, inc, h, ha, now)
        if self.verify_every and self.calls["plan_cached"] % self.verify_every == 0:
            self.calls["plan_verified"] += 1
            real = self._plan(record, _counts(fleet), now, approvals, breaker)
            for f in CachedDecision.FIELDS:
                if getattr(real, f) != getattr(d, f):
                    raise RuntimeError(f"repair.plan cache diverged on {f}: real {getattr(real, f)!r}, "
                                       f"cached {getattr(d, f)!r} (record {record!r})")
        return d

    def _skeleton(self, pieces):
        """The brain's record of a history skeleton (the text pieces around its times; None for no history):
        ``(pieces, id, exact, windows, code base of old times)``, with repair.time_horizon for the step the skeleton
        has in progress (the open incident's last step without an outcome: the skeleton says which, whatever the
        times). Keys hold the id, a small int never reused, instead of the pieces."""
        sk = self._skels.get(pieces)
        if sk is None:
            steps = ()
            if pieces is not None:
                inc = _repair.loads("1000000000".join(pieces)).incident  # any times will do
                step = inc.pending() if inc is not None else None
                steps = () if step is None else (step.action,)
            exact, windows = _repair.time_horizon(self.repair_config, steps)
            if len(self._skels) >= _SPLIT_MEMO:
                self._skels.clear()
            self._n_skels += 1
            sk = self._skels[pieces] = (pieces, self._n_skels, exact, windows, -int(exact) - 1)
        return sk

    def _times(self, now: int, sk, abs_t, rec):
        """The key of a node's times (its history's, and the record's reason, report and boot times) at ``now``
        when some are older than the horizon, and the distinct old times in order (plan_node keys the others).

        repair.time_horizon: plan() reads a time ``t >= now - exact`` by its exact age (kept as the offset
        ``t - now``) and an older one only by its side of each longer window and its order among the input times
        (kept as its rank among the distinct old times, and per window how many old times lie outside it), or
        copies it: a stored decision refers to a copied old time by its rank."""
        _pieces, sid, exact, windows, base = sk
        cut = now - exact
        olds = sorted({t for t in abs_t + rec if t is not None and t < cut})
        # an old time's code is its rank, below every offset (offsets are >= -exact); the key adds, per window,
        # how many of the old times lie outside it (they are in order, so that gives each one's side)
        codes = dict(zip(olds, range(base, base - len(olds), -1)))
        return (sid, tuple([codes[t] if t < cut else t - now for t in abs_t]),
                tuple([None if t is None else codes[t] if t < cut else t - now for t in rec]),
                tuple([bisect_left(olds, now - w) for w in windows]), "old"), olds

    def _store(self, d, record, now: int, olds, cut):
        """The cache entry of a real Decision: times relative to ``now``, or a rank into ``olds`` where the
        decision copied an old input time; None when it cannot be stored that way (a time older than the horizon
        that is no input time: time_horizon says that does not happen, and then nothing is cached)."""
        if d.earliest < cut:
            return None
        src = history_text(record.get("history"))
        rank = {t: i for i, t in enumerate(olds)}
        old_refs = False
        out = []
        for text in (d.history, d.history_after):
            if text is None:
                out.append(None)
                continue
            if text == src:
                out.append(_SAME)
                continue
            sk, abs_t = self._split(text)
            refs = []
            for t in abs_t:
                if t >= cut:
                    refs.append(t - now)
                elif t in rank:
                    refs.append((rank[t],))
                    old_refs = True
                else:
                    return None
            out.append((sk, tuple(refs)))
        return (d.action, d.rule, d.earliest - now, d.needs_approval, d.approved, d.code, d.incident, out[0], out[1],
                old_refs)

    def _split(self, text):
        """A history text as (its skeleton, its absolute times), memoised (histories come back on the node's next
        decision)."""
        s = self._splits.get(text)
        if s is None:
            if len(self._splits) >= _SPLIT_MEMO:
                self._splits.clear()
            pieces, times = _split_abs(text)
            s = self._splits[text] = (self._skeleton(pieces), times)
        return s

    def _plan(self, record, fleet, now, approvals, breaker):
        self.calls["plan"] += 1
        p = _repair.plan(fleet, [_textual(record)], self.repair_config, now, approvals=approvals, breaker=breaker)
        return p[0]


_SAME = object()  # a cached history that is the input's own text


def _resolve(split, olds, now: int):
    """A stored (skeleton, refs) with every old-time rank turned into its offset from ``now`` in this input."""
    sk, refs = split
    return sk, tuple([r if r.__class__ is int else olds[r[0]] - now for r in refs])


def _textual(record: dict) -> dict:
    """The record as repair.plan() takes it: the history as its text."""
    h = record.get("history")
    return dict(record, history=h.text) if h.__class__ is HistoryText else record


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
    return EPOCH0 + round(h * 60.0) * GRID_S  # round() of a float is an int


def to_hours(epoch: float) -> float:
    return (epoch - EPOCH0) / 3600.0


def default_brain(sc: dict, mode: str = "automatic", **kw) -> CollectionBrain:
    return CollectionBrain(sc.get("health_config"), sc.get("repair_config"), mode=mode, **kw)
