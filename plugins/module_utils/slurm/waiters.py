# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Waiters: poll Slurm until nodes reach the state a change asked for, with a monotonic deadline.

``reached(state, before, now)`` says whether one node is there; ``wait_for_nodes`` polls a reader until every target
is, or raises ``WaitTimeout`` naming the nodes that are not (with the last reading, so a body can report it).
"""
from __future__ import annotations

import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ..slurmfacts import REBOOT_FLAGS
from .node import Node

#: The states a waiter knows (``slurm_node``'s ``state`` values).
WAIT_STATES = ("drained", "resumed", "down", "rebooted")

Nodes = Dict[str, Node]

#: Each poll of a wait comes this many times later than the one before, up to MAX_POLL_S seconds apart.
BACKOFF = 1.5
MAX_POLL_S = 10.0


class WaitTimeout(Exception):
    """The deadline passed before every node got there. ``nodes`` is the last reading, ``pending`` the late ones."""

    def __init__(self, msg: str, nodes: Nodes, pending: List[str], waited: float) -> None:
        super().__init__(msg)
        self.msg = msg
        self.nodes = nodes
        self.pending = pending
        self.waited = waited

    def __str__(self) -> str:
        return self.msg


def reached(state: str, before: Node, now: Node, nextstate: str = "resume") -> bool:
    """Is node ``now`` finished for ``state`` (``before`` = as it was before the change)?

    drained: DRAIN and no job left. resumed: not out of service, responding, state known. down: at once.
    rebooted: no reboot flag, responding, a boot time after the one before, and in ``nextstate``.
    """
    if state not in WAIT_STATES:
        raise ValueError(f"state must be one of {', '.join(WAIT_STATES)}; got {state!r}")
    if state == "drained":
        return now.drained
    if state == "resumed":
        return not now.out_of_service and not now.not_responding and now.state != "unknown"
    if state == "rebooted":
        if now.flags & (REBOOT_FLAGS | {"NOT_RESPONDING"}):
            return False
        if before.boot_time is not None and (now.boot_time or 0) <= before.boot_time:
            return False
        return now.is_down if nextstate == "down" else (not now.is_down and now.state != "unknown")
    return True


def wait_for_nodes(read: Callable[[], Nodes], state: str, before: Nodes, targets: Sequence[str], *,
                   timeout: float, poll_interval: float, nextstate: str = "resume", first: Optional[Nodes] = None,
                   clock: Callable[[], float] = time.monotonic,
                   sleep: Callable[[float], None] = time.sleep) -> Tuple[Nodes, float]:
    """Poll ``read()`` until every node of ``targets`` has ``reached`` ``state``; returns (last reading, seconds).

    The first poll comes ``poll_interval`` seconds after the first reading, and each later one half again as long
    after the one before, up to ``MAX_POLL_S`` (or ``poll_interval`` when that is longer): a reboot that takes ten
    minutes costs about 65 reads, not 600. The last poll is at the deadline. ``first`` is a reading already made
    (saves one read). Raises WaitTimeout after ``timeout`` seconds.
    """
    if timeout < 0 or poll_interval <= 0:
        raise ValueError("timeout must be >= 0 and poll_interval > 0")
    start = clock()
    now = first if first is not None else read()
    interval = poll_interval
    while True:
        pending = [n for n in targets if not reached(state, before[n], now[n], nextstate)]
        waited = round(clock() - start, 2)
        if not pending:
            return now, waited
        left = timeout - (clock() - start)
        if left <= 0:
            raise WaitTimeout(f"timed out after {timeout:g}s waiting for {state}: "
                              + ", ".join(f"{n} is {now[n].sinfo_state}" for n in pending), now, pending, waited)
        sleep(min(interval, left))
        interval = min(interval * BACKOFF, max(poll_interval, MAX_POLL_S))
        now = read()
