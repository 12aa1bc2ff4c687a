"""tests/support/procs.py: a lab test kills what its own run left, never the same module run by the other Slurm
lane at the same moment (a kill by the module's name alone once ended another lane's eviction mid-run)."""
import os
import signal
import subprocess
import sys
import time

import pytest

from support.procs import processes_with

SLEEP = "import time; time.sleep(60)"


def _alive(proc):
    return proc.poll() is None


def _started(*procs, timeout=30.0):
    """Wait until each child's command line shows: Popen returns once the child's exec has begun (CPython
    vforks), a moment before the kernel sets up the new command line that /proc/PID/cmdline reads, and on a busy
    machine that moment can come after the parent's first look."""
    def shown(pid):  # the child's own line, read directly: processes_with() itself stays what the test checks
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return SLEEP.encode() in fh.read()

    deadline = time.monotonic() + timeout
    while not all(shown(p.pid) for p in procs):
        assert time.monotonic() < deadline, f"children not started within {timeout} s"
        time.sleep(0.01)


def test_only_the_runs_own_module_matches(tmp_path):
    mine = tmp_path / "remote-tmp"
    own = subprocess.Popen([sys.executable, "-c", SLEEP, str(mine / "ansible-tmp-1" / "AnsiballZ_job_evict.py")])
    other = subprocess.Popen([sys.executable, "-c", SLEEP, "/root/.ansible/tmp/ansible-tmp-2/AnsiballZ_job_evict.py"])
    try:
        _started(own, other)
        both = processes_with(b"AnsiballZ_job_evict")
        assert own.pid in both and other.pid in both  # the name alone: the other lane's run too
        got = processes_with(b"AnsiballZ_job_evict", str(mine).encode())
        assert got == [own.pid]
        for pid in got:  # what the lab test does with them
            os.kill(pid, signal.SIGKILL)
        own.wait(timeout=10)
        assert _alive(other)
    finally:
        for p in (own, other):
            if _alive(p):
                p.kill()
            p.wait(timeout=10)


def test_nothing_to_match_is_an_error():
    with pytest.raises(ValueError, match="at least one"):
        processes_with()
