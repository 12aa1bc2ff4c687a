# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Slurm waiters (module_utils/slurm/waiters.py): when a node counts as drained, resumed or rebooted, and the
deadline. The reader replays successive Slurm readings; the clock is a counter (no sleeping, no timing asserts)."""
from __future__ import annotations

import pytest

from ansible_collections.gpufleet.reliability.plugins.module_utils.slurm import (
    Node,
    WaitTimeout,
    reached,
    split_state,
    wait_for_nodes,
)


def node(name, state, reason="", boot_time=None):
    base, flags = split_state(state)
    return Node(name, base, flags, reason, boot_time=boot_time)


@pytest.mark.parametrize("want, before, now, done", [
    ("drained", "IDLE", "MIXED+DRAIN", False),               # draining: a job is still there
    ("drained", "IDLE", "IDLE+DRAIN", True),
    ("drained", "IDLE", "IDLE+DRAIN+COMPLETING", False),
    ("resumed", "IDLE+DRAIN", "IDLE+DRAIN", False),
    ("resumed", "DOWN", "DOWN", False),
    ("resumed", "DOWN", "IDLE*", False),                     # not responding yet
    ("resumed", "DOWN", "UNKNOWN", False),
    ("resumed", "IDLE+DRAIN", "IDLE+FAIL", False),
    ("resumed", "IDLE+DRAIN", "MIXED", True),
    ("down", "IDLE", "IDLE", True),                          # DOWN takes effect at once: nothing to wait for
])
def test_reached(want, before, now, done):
    assert reached(want, node("n1", before), node("n1", now)) is done


@pytest.mark.parametrize("now, nextstate, done", [
    (node("n1", "IDLE+DRAIN+REBOOT_REQUESTED", boot_time=100), "resume", False),
    (node("n1", "DOWN+REBOOT_ISSUED", boot_time=100), "down", False),
    (node("n1", "DOWN*", boot_time=200), "down", False),        # not responding
    (node("n1", "IDLE", boot_time=100), "resume", False),       # the same boot: not rebooted yet
    (node("n1", "DOWN", boot_time=200), "down", True),
    (node("n1", "DOWN", boot_time=200), "resume", False),        # came back DOWN but RESUME was asked for
    (node("n1", "IDLE", boot_time=200), "resume", True),
])
def test_reached_rebooted(now, nextstate, done):
    assert reached("rebooted", node("n1", "IDLE", boot_time=100), now, nextstate) is done


def test_unknown_state_is_refused():
    with pytest.raises(ValueError, match="state must be one of"):
        reached("drainde", node("n1", "IDLE"), node("n1", "IDLE"))


class Replay:
    """Successive readings of Slurm; the last one repeats. Counts reads and sleeps; the clock moves 1 s a sleep."""

    def __init__(self, *readings):
        self.readings = list(readings)
        self.reads = 0
        self.t = 0.0
        self.sleeps = []

    def read(self):
        self.reads += 1
        return self.readings[min(self.reads - 1, len(self.readings) - 1)]

    def clock(self):
        return self.t

    def sleep(self, s):
        self.sleeps.append(s)
        self.t += 1.0


def test_waits_until_every_target_is_there():
    before = {"n1": node("n1", "MIXED"), "n2": node("n2", "ALLOCATED")}
    r = Replay({"n1": node("n1", "MIXED+DRAIN"), "n2": node("n2", "ALLOCATED+DRAIN")},
               {"n1": node("n1", "IDLE+DRAIN"), "n2": node("n2", "MIXED+DRAIN")},
               {"n1": node("n1", "IDLE+DRAIN"), "n2": node("n2", "IDLE+DRAIN")})
    now, waited = wait_for_nodes(r.read, "drained", before, ["n1", "n2"], timeout=60, poll_interval=0.5,
                                 clock=r.clock, sleep=r.sleep)
    assert r.reads == 3 and r.sleeps == [0.5, 0.75] and waited == 2.0
    assert all(n.drained for n in now.values())


def test_polls_back_off_to_ten_seconds_and_the_last_one_is_at_the_deadline():
    before = {"n1": node("n1", "IDLE")}
    stuck = {"n1": node("n1", "MIXED+DRAIN")}
    t = [0.0]
    sleeps = []

    def sleep(s):
        sleeps.append(s)
        t[0] += s

    with pytest.raises(WaitTimeout):
        wait_for_nodes(lambda: stuck, "drained", before, ["n1"], timeout=40, poll_interval=1,
                       clock=lambda: t[0], sleep=sleep)
    assert sleeps[:7] == [1, 1.5, 2.25, 3.375, 5.0625, 7.59375, 10.0]
    assert sleeps[7:] == [pytest.approx(40 - sum(sleeps[:7]))] and t[0] == pytest.approx(40)  # the deadline
    # a poll interval longer than the cap is kept as it is
    t[0], sleeps[:] = 0.0, []
    with pytest.raises(WaitTimeout):
        wait_for_nodes(lambda: stuck, "drained", before, ["n1"], timeout=60, poll_interval=30,
                       clock=lambda: t[0], sleep=sleep)
    assert sleeps == [30, 30]


def test_only_the_targets_are_waited_for():
    before = {"n1": node("n1", "IDLE"), "n2": node("n2", "ALLOCATED")}
    r = Replay({"n1": node("n1", "IDLE+DRAIN"), "n2": node("n2", "ALLOCATED")})
    wait_for_nodes(r.read, "drained", before, ["n1"], timeout=60, poll_interval=1, clock=r.clock, sleep=r.sleep)
    assert r.reads == 1 and r.sleeps == []


def test_a_reading_already_made_is_used_first():
    before = {"n1": node("n1", "IDLE")}
    r = Replay({"n1": node("n1", "IDLE+DRAIN")})
    wait_for_nodes(r.read, "drained", before, ["n1"], timeout=60, poll_interval=1, first=r.readings[0],
                   clock=r.clock, sleep=r.sleep)
    assert r.reads == 0


def test_timeout_names_the_late_nodes_and_keeps_the_last_reading():
    before = {"n1": node("n1", "IDLE"), "n2": node("n2", "MIXED")}
    stuck = {"n1": node("n1", "IDLE+DRAIN"), "n2": node("n2", "MIXED+DRAIN")}
    r = Replay(stuck)
    with pytest.raises(WaitTimeout) as err:
        wait_for_nodes(r.read, "drained", before, ["n1", "n2"], timeout=3, poll_interval=1, clock=r.clock,
                       sleep=r.sleep)
    assert err.value.pending == ["n2"] and err.value.nodes is stuck and err.value.waited == 3.0
    assert str(err.value) == "timed out after 3s waiting for drained: n2 is draining"
    assert r.reads == 4  # the first reading and one per second until the deadline


@pytest.mark.parametrize("timeout, poll", [(-1, 1), (10, 0), (10, -0.5)])
def test_bad_timing_values_are_refused(timeout, poll):
    with pytest.raises(ValueError, match="timeout must be >= 0 and poll_interval > 0"):
        wait_for_nodes(dict, "drained", {}, [], timeout=timeout, poll_interval=poll)
