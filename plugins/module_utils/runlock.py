# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""One repair run at a time: a lock in the controller's state directory (stdlib only, Python 3.9+, Linux).

The lock names the run that holds it: the ``ansible-playbook`` (or ``ansible``) process the module runs under, by
PID and start time (so a reused PID is not taken for the holder), and its host. It is held for the life of that
process: a run that ends, fails or is killed frees it with nothing to clean up, and a later run takes it over.
A holder on another host (a state directory shared between controllers) cannot be checked, so its lock counts
until ``lease_s`` after it was taken; the publish step removes the lock when the run ends normally.

Reading and writing the lock happens under an exclusive ``flock`` of ``<lock>.guard``, so two runs never both see
the lock free; the record itself is written atomically.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from typing import Callable, Dict, Optional, Tuple

from .fileutil import atomic_write

#: The processes that are "a run": the first of them above the module is the lock's owner.
RUN_COMMANDS = ("ansible-playbook", "ansible")


class RunLockBusy(Exception):
    """Another live run holds the lock. ``holder`` is its record."""

    def __init__(self, msg: str, holder: Dict) -> None:
        super().__init__(msg)
        self.holder = holder


def proc_stat(pid: int) -> Optional[Tuple[int, int, str]]:
    """(parent PID, start time in clock ticks since boot, state letter) of process ``pid``, or None when it is
    gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            raw = handle.read().decode("ascii", "replace")
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: the fields after it start after the last ")"
    fields = raw[raw.rfind(")") + 2:].split()
    try:
        return int(fields[1]), int(fields[19]), fields[0]
    except (IndexError, ValueError):
        return None


def _argv(pid: int) -> list:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return [a.decode("utf-8", "replace") for a in handle.read().split(b"\0") if a]
    except OSError:
        return []


def run_process(pid: Optional[int] = None) -> Tuple[int, int]:
    """(PID, start time) of the run this process belongs to: the topmost of the nearest chain of ancestors that are
    ``ansible-playbook`` or ``ansible`` (as their program or as the script their Python runs) - Ansible's workers
    are forks of the run's process, with its command line, and end with their task - else this process's parent."""
    first = os.getppid() if pid is None else pid
    cur, found = first, None
    for _depth in range(64):
        st = proc_stat(cur)
        if st is None:
            break
        if any(os.path.basename(a) in RUN_COMMANDS for a in _argv(cur)[:2]):
            found = (cur, st[1])
        elif found is not None:
            break
        if st[0] <= 1:
            break
        cur = st[0]
    if found is not None:
        return found
    st = proc_stat(first)
    return first, st[1] if st is not None else 0


def alive(holder: Dict, host: str, now: float, lease_s: float) -> bool:
    """Whether the run that wrote ``holder`` still holds the lock."""
    if holder.get("host") != host:
        return now < float(holder.get("since", 0)) + lease_s
    st = proc_stat(int(holder.get("pid", 0)))
    return st is not None and st[1] == holder.get("start") and st[2] not in ("Z", "X")  # a zombie has ended


def describe(holder: Dict) -> str:
    since = holder.get("since")
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(since))) if since else "an unknown time"
    return "pid {} on {}, since {}".format(holder.get("pid"), holder.get("host"), when)


def acquire(path: str, wait_s: float = 0.0, lease_s: float = 4 * 3600.0, me: Optional[Tuple[int, int]] = None,
            clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep) -> Dict:
    """Take the lock at ``path`` for this run (``me``: its (PID, start time); default :func:`run_process`), waiting
    up to ``wait_s`` seconds for another run to end. Returns our record; raises RunLockBusy naming the holder.
    Taking it again in the same run returns the same record."""
    pid, start = me if me is not None else run_process()
    host = socket.gethostname()
    deadline = clock() + max(0.0, wait_s)
    while True:
        now = clock()
        with open(path + ".guard", "a", encoding="utf-8") as guard:
            fcntl.flock(guard.fileno(), fcntl.LOCK_EX)
            holder = _read(path)
            if holder is not None and (holder.get("pid"), holder.get("start"), holder.get("host")) == (
                    pid, start, host):
                return holder
            if holder is None or not alive(holder, host, now, lease_s):
                mine = {"pid": pid, "start": start, "host": host, "since": int(now)}
                atomic_write(path, json.dumps(mine, sort_keys=True) + "\n", 0o640)
                return mine
        if now >= deadline:
            raise RunLockBusy(f"another repair run holds {path} ({describe(holder)}); this run changed nothing "
                              "(it waited {:g} s)".format(max(0.0, wait_s)), holder)
        sleep(min(1.0, max(0.05, deadline - now)))


def release(path: str, me: Optional[Tuple[int, int]] = None) -> bool:
    """Free the lock at ``path`` when this run (``me``, as for :func:`acquire`) holds it; a lock another run took
    is left alone. Returns whether it was ours and is now free."""
    pid, start = me if me is not None else run_process()
    host = socket.gethostname()
    with open(path + ".guard", "a", encoding="utf-8") as guard:
        fcntl.flock(guard.fileno(), fcntl.LOCK_EX)
        holder = _read(path)
        if holder is None or (holder.get("pid"), holder.get("start"), holder.get("host")) != (pid, start, host):
            return False
        os.unlink(path)
        return True


def _read(path: str) -> Optional[Dict]:
    """The lock's record, or None when there is none; a damaged record is no lock (it is replaced)."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):  # none, or unreadable
        return None
    return data if isinstance(data, dict) else None
