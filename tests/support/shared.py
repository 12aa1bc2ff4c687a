# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Machine-wide things that several test processes use at once: the test users, sshd's /run/sshd.

With the lanes side by side (and pytest-xdist workers in a lane), one process must not remove what another still
uses: a process that made the test users and removed them at its end broke a lane that was still logging in as
them. ``shared(name, exists, make, remove)`` keeps a registry of live holders under an exclusive lock: the first
holder makes the thing if it is missing, and the last holder removes it, only if a holder made it (something that
was there before any test is never removed). A holder that died is dropped from the registry (its PID and start
time no longer match), so a killed run does not keep the thing alive forever.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path
from typing import Callable, Iterator

from .labs import ROOT, start_time


def _me() -> list:
    return [os.getpid(), start_time(os.getpid())]


def _alive(holder: list) -> bool:
    return start_time(int(holder[0])) == holder[1]


@contextlib.contextmanager
def _registry(name: str) -> Iterator[dict]:
    ROOT.mkdir(mode=0o755, parents=True, exist_ok=True)
    path = ROOT / f"shared-{name}.json"
    fd = os.open(ROOT / f"shared-{name}.lock", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            state = {}
        state = {"holders": [h for h in state.get("holders", []) if _alive(h)], "made": bool(state.get("made"))}
        yield state
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, path)
    finally:
        os.close(fd)


@contextlib.contextmanager
def shared(name: str, exists: Callable[[], bool], make: Callable[[], None], remove: Callable[[], None]):
    with _registry(name) as state:
        if not exists():  # missing (for the first holder, or removed by hand under live ones): ours to remove
            make()
            state["made"] = True
        state["holders"].append(_me())
    try:
        yield
    finally:
        with _registry(name) as state:
            me = _me()
            if me in state["holders"]:
                state["holders"].remove(me)
            if not state["holders"] and state["made"]:
                remove()
                state["made"] = False


def run_sshd_dir() -> contextlib.AbstractContextManager:
    """sshd (even ``sshd -t``) needs its privilege-separation directory /run/sshd."""
    d = Path("/run/sshd")

    def make() -> None:
        d.mkdir(mode=0o755, exist_ok=True)

    def remove() -> None:
        with contextlib.suppress(OSError):
            d.rmdir()

    return shared("run-sshd", d.is_dir, make, remove)
