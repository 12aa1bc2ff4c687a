# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Fail instead of hanging: ``with deadline(30): parse(hostile)``."""
from __future__ import annotations

import signal
from contextlib import contextmanager
from typing import Iterator


class DeadlineExceeded(Exception):
    """Raised in the main thread when a ``deadline`` block runs out of time.

    Not a TimeoutError: that is an OSError, which code under test may catch and swallow."""


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise DeadlineExceeded if the block takes longer than ``seconds`` (wall clock, SIGALRM: main thread only,
    and not nested: the block owns the process's real-time timer)."""
    def fire(_signum, _frame):
        raise DeadlineExceeded(f"no answer within {seconds} s")
    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
