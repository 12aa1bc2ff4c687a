"""repair.time_horizon: how plan() reads the age of a node's input times (the simulator keys its plan cache on it).

The sweep checks the claim itself: random histories and records, each planned again with its times older than
``exact`` moved to other values that keep their side of every window and their order (ties included), give the same
decision, the moved times carried along unchanged. And the claim is not vacuous: moving an old time across a window
does change some decisions.
"""

from __future__ import annotations

import random
import re

import pytest
from repair_builders import HEALTHY, NOW, D, H, fleet, in_service, node, report

from ansible_collections.gpufleet.reliability.plugins.module_utils.repair import (
    History,
    RepairConfig,
    dumps,
    loads,
    plan,
    retention,
    time_horizon,
)
from ansible_collections.gpufleet.reliability.plugins.module_utils.repair.history import Incident, Step

SHORT = {"ttl": "5m", "cooldown": "30m", "budget": {"attempts": 2, "window": "12h"},
         "escalate": {"repairs": 3, "window": "3d"}, "lemon": {"incidents": 3, "window": "10d"},
         "history_keep": "20d", "step_timeout": {"replace": "1d"}}
TIME = re.compile(r"(?<![0-9])([0-9]{10})(?![0-9])")


def test_time_horizon_of_the_defaults():
    cfg = RepairConfig.from_dict({})
    exact, windows = time_horizon(cfg)
    # the longest step timeout (replace, 7 d) is the finest grain; the escalation window (7 d) is inside it
    assert exact == 7 * D
    assert windows == (30 * D,)
    assert time_horizon({}) == (exact, windows)
    # with no step in progress no step timeout counts; a reboot in progress counts its 30 min
    assert time_horizon(cfg, ()) == (1 * D, (7 * D, 30 * D))
    assert time_horizon(cfg, ("reboot",)) == (1 * D, (7 * D, 30 * D))
    assert time_horizon(cfg, ("replace",)) == (7 * D, (30 * D,))


def test_time_horizon_of_a_short_config():
    cfg = RepairConfig.from_dict(SHORT)
    assert time_horizon(cfg) == (1 * D, (3 * D, 10 * D, 20 * D))
    assert time_horizon(cfg, ()) == (12 * H, (3 * D, 10 * D, 20 * D))
    assert retention(cfg)[0] == 20 * D


def _random_input(rng: random.Random, exact: float, windows):
    """A node record (drained by us or in service) with a random history whose times straddle every window and
    sit on every boundary now and then."""
    span = int(max(windows) * 1.3)
    marks = [NOW - int(w) for w in windows] + [NOW - int(exact), NOW - int(exact) - 1]

    def t():
        if rng.random() < 0.15:
            return rng.choice(marks)
        return NOW - rng.randrange(0, span)

    classes = ["gpu_memory", "gpu_lost", "nvlink", "other"]
    actions = ["reset_gpu", "reboot", "reimage", "replace"]
    h = History()
    h.past = sorted((t(), rng.choice(classes)) for _i in range(rng.randrange(0, 7)))
    h.repairs = sorted((t(), rng.choice(actions)) for _i in range(rng.randrange(0, 7)))
    h.seq = len(h.past)
    if rng.random() < 0.8:
        h.seq += 1
        first = t()
        steps = []
        s = first
        for _i in range(rng.randrange(0, 4)):
            s = min(NOW, s + rng.randrange(0, 3 * D))
            steps.append(Step(rng.choice(actions), s, rng.choice(["ok", "failed", "timeout", None])))
            h.repairs.append((s, steps[-1].action))
        for st in steps[:-1]:
            st.outcome = st.outcome or "failed"
        h.incident = Incident(id=h.seq, failure_class=rng.choice(classes), code="xid48", gpu=3, first_seen=first,
                              steps=steps, escalated=t() if rng.random() < 0.1 else None)
    if rng.random() < 0.3:
        h.cooldown_until = rng.choice([t(), NOW + 2 * H, NOW + 60])
    rep = rng.choice([report(), report(action="reboot", code="xid79"), HEALTHY,
                      report(verdict="degraded", action="monitor", code="thermal")])
    rtime = rng.choice([None, t(), NOW - 30])
    if rng.random() < 0.25:
        n = in_service("n1", rep=rep, history=dumps(h), report_time=rtime)
    else:
        n = node("n1", rep=rep, reason_time=t(), history=dumps(h), report_time=rtime,
                 state=rng.choice(["IDLE", "IDLE", "MIXED"]))
    return n


def _horizon(cfg, n, narrow):
    """time_horizon for this node: narrowed to the step in progress in its history, or for any history."""
    if not narrow:
        return time_horizon(cfg)
    inc = loads(n["history"]).incident
    step = inc.pending() if inc is not None else None
    return time_horizon(cfg, () if step is None else (step.action,))


def _times(n):
    out = [int(x) for x in TIME.findall(n["history"] or "")]
    return out + [n[k] for k in ("reason_time", "report_time") if n.get(k) is not None]


def _remap(n, exact, windows, rng, cross=False):
    """The record with its old times moved: same side of every window, same order. With ``cross``, one old time
    instead moves across the nearest window (a change the contract says may matter)."""
    bounds = [NOW - int(exact)] + [NOW - int(w) for w in windows] + [NOW - int(max(windows) * 1.5)]
    old = sorted({x for x in _times(n) if x < NOW - exact})
    if not old:
        return None, {}
    new = {}
    for i in range(len(bounds) - 1):
        lo, hi = bounds[i + 1], bounds[i]  # the class [lo, hi): t >= now - w for the windows up to i
        mine = [x for x in old if lo <= x < hi]
        for a, b in zip(mine, sorted(rng.sample(range(lo, hi), len(mine)))):
            new[a] = b
    if cross:
        victim = rng.choice(old)
        cls = next(i for i in range(len(bounds) - 1) if bounds[i + 1] <= victim < bounds[i])
        if cls + 1 < len(bounds) - 1:
            new[victim] = bounds[cls + 1] - 1  # just outside the next window
        elif cls > 0:
            new[victim] = bounds[cls]  # just inside the previous one
    m = dict(n)
    if n["history"]:
        m["history"] = TIME.sub(lambda mt: str(new.get(int(mt.group(1)), int(mt.group(1)))), n["history"])
    for k in ("reason_time", "report_time"):
        if n.get(k) in new:
            m[k] = new[n[k]]
    return m, new


def _decision(n, cfg, back=None):
    d = plan(fleet(), [n], cfg, NOW)[0]

    def text(s):
        if s is None or not back:
            return s
        return TIME.sub(lambda mt: str(back.get(int(mt.group(1)), int(mt.group(1)))), s)

    spare = d.spare.spare if d.spare is not None else "-"
    return (d.action, d.rule, d.earliest, d.needs_approval, d.runnable, d.incident, d.failure_class, spare,
            text(d.history), text(d.history_after))


REACHED = {"lemon", "ladder", "healthy_resume", "in_progress", "ttl", "escalated"}
SHORT_REACHED = REACHED | {"escalate_repairs", "budget", "cooldown"}


@pytest.mark.parametrize("narrow", [False, True], ids=["any-step", "step-in-progress"])
@pytest.mark.parametrize("data,reached", [({}, REACHED), (SHORT, SHORT_REACHED),
                                          (dict(SHORT, modes={"default": "approval"}), SHORT_REACHED)],
                         ids=["defaults", "short", "approval"])
def test_old_times_decide_only_by_window_and_order(data, reached, narrow):
    cfg = RepairConfig.from_dict(data)
    rng, moves = random.Random(5), random.Random(6)  # the same inputs whatever the moves draw
    moved = 0
    seen = set()
    for _i in range(600):
        n = _random_input(rng, *time_horizon(cfg))
        exact, windows = _horizon(cfg, n, narrow)
        want = _decision(n, cfg)
        seen.add(want[1])
        for _k in range(3):
            m, new = _remap(n, exact, windows, moves)
            if m is None:
                break
            moved += 1
            back = {b: a for a, b in new.items()}
            assert _decision(m, cfg, back) == want, (n, m)
    assert moved > 500  # most inputs have old times to move
    # the inputs reach the rules that read times: lemons, escalations, budgets, cooldowns, the ladder, resumes
    assert reached <= seen


def test_crossing_a_window_can_change_the_decision():
    cfg = RepairConfig.from_dict(SHORT)
    exact, windows = time_horizon(cfg)
    rng = random.Random(11)
    changed = 0
    for _i in range(600):
        n = _random_input(rng, exact, windows)
        m, new = _remap(n, *_horizon(cfg, n, True), rng, cross=True)
        if m is None:
            continue
        back = {b: a for a, b in new.items()}
        if _decision(m, cfg, back) != _decision(n, cfg):
            changed += 1
    assert changed > 10
