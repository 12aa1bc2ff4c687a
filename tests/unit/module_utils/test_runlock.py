# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The repair run lock with real processes: held for the life of its run, freed by the run's end, never shared."""
import json
import os
import socket
import subprocess
import sys

import pytest

from ansible_collections.gpufleet.reliability.plugins.module_utils.runlock import (
    RunLockBusy,
    acquire,
    proc_stat,
    release,
    run_process,
)


@pytest.fixture
def run():
    """A live process standing for a run (an ansible-playbook), stopped by its PID at the end."""
    procs = []

    def start():
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        procs.append(p)
        return p, (p.pid, proc_stat(p.pid)[1])
    yield start
    for p in procs:
        p.kill()
        p.wait()


def test_a_second_run_is_refused_while_the_first_lives_and_takes_over_when_it_ends(tmp_path, run):
    path = str(tmp_path / "repair.lock")
    first, me1 = run()
    _second, me2 = run()
    held = acquire(path, me=me1)
    assert (held["pid"], held["start"], held["host"]) == (me1[0], me1[1], socket.gethostname())
    assert acquire(path, me=me1) == held  # the same run again: the same lock
    with pytest.raises(RunLockBusy, match=rf"another repair run holds .*repair.lock \(pid {me1[0]} on "):
        acquire(path, me=me2)
    assert json.loads((tmp_path / "repair.lock").read_text()) == held  # the refused run wrote nothing
    first.kill()
    first.wait()
    assert acquire(path, me=me2)["pid"] == me2[0]  # the holder is gone: the lock is free


def test_release_frees_only_our_own_lock(tmp_path, run):
    path = str(tmp_path / "repair.lock")
    _first, me1 = run()
    _second, me2 = run()
    assert release(path, me=me1) is False  # no lock: nothing to free
    held = acquire(path, me=me1)
    assert release(path, me=me2) is False  # another run's lock stays
    assert json.loads((tmp_path / "repair.lock").read_text()) == held
    assert release(path, me=me1) is True and not (tmp_path / "repair.lock").exists()
    assert acquire(path, me=me2)["pid"] == me2[0]  # free for the next run at once


def test_a_reused_pid_is_not_the_holder(tmp_path, run):
    path = str(tmp_path / "repair.lock")
    _p, me = run()
    (tmp_path / "repair.lock").write_text(json.dumps({"pid": me[0], "start": me[1] - 1, "host": socket.gethostname(),
                                                      "since": 1}))
    assert acquire(path, me=me)["start"] == me[1]


def test_waiting_for_the_holder_and_a_holder_on_another_host(tmp_path, run):
    path = str(tmp_path / "repair.lock")
    _p, me1 = run()
    _q, me2 = run()
    acquire(path, me=me1)
    clock = iter(range(0, 100, 1))
    slept = []
    with pytest.raises(RunLockBusy, match="it waited 3 s"):
        acquire(path, wait_s=3, me=me2, clock=lambda: float(next(clock)), sleep=slept.append)
    assert slept and all(0 < s <= 1 for s in slept)
    other = {"pid": 1, "start": 1, "host": "controller-2", "since": 1000}
    (tmp_path / "repair.lock").write_text(json.dumps(other))
    with pytest.raises(RunLockBusy, match="on controller-2"):
        acquire(path, lease_s=600, me=me2, clock=lambda: 1500.0)
    assert acquire(path, lease_s=600, me=me2, clock=lambda: 1601.0)["pid"] == me2[0]  # its lease ran out


def test_a_damaged_lock_is_replaced(tmp_path, run):
    path = str(tmp_path / "repair.lock")
    _p, me = run()
    for text in ("", "{not json", "[1, 2]"):
        (tmp_path / "repair.lock").write_text(text)
        assert acquire(path, me=me)["pid"] == me[0]


def test_the_run_is_the_ansible_process_above_its_workers(tmp_path):
    """Found through /proc: here no ansible is above this test, so the run is this process's parent. Under
    ansible-playbook, whose worker (a fork with the same command line) runs the module, the run is the top one,
    not the worker, which ends with its task."""
    pid, start = run_process()
    assert pid == os.getppid() and start == proc_stat(os.getppid())[1]
    (tmp_path / "module.py").write_text(
        f"import sys\nsys.path[:0] = {sys.path!r}\n"
        "from ansible_collections.gpufleet.reliability.plugins.module_utils.runlock import run_process\n"
        "print(run_process()[0])\n")
    (tmp_path / "worker.py").write_text(  # the worker runs the module through a shell, as Ansible does
        f"import subprocess, sys\nsys.exit(subprocess.call(['sh', '-c', {sys.executable!r} + ' ' + "
        f"{str(tmp_path / 'module.py')!r} + '; true']))\n")
    (tmp_path / "main.py").write_text(
        f"import os, subprocess, sys\nprint(os.getpid(), flush=True)\n"
        f"sys.exit(subprocess.call(['ansible-playbook', {str(tmp_path / 'worker.py')!r}], "
        f"executable={sys.executable!r}))\n")
    out = subprocess.run(["ansible-playbook", str(tmp_path / "main.py")], executable=sys.executable,
                         capture_output=True, text=True, timeout=60, check=True).stdout.split()
    assert len(out) == 2 and out[0] == out[1], out
