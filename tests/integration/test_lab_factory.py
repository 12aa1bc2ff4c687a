# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab factory's owner check, against real labs: a test never attaches to, resets or stops a lab it did not
start (a person's ``make lab``, another run's lab), and a lab left by a test process that died is reclaimed.

A "person's lab" here is the lab script started without SLURM_LAB_OWNER, as ``make lab`` starts it, on a block this
module reserved first (so that no other test process can be handed it meanwhile).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from support.labs import LAB_SCRIPT, ROOT, LabError, parse_env, process_token, read_owner, reclaim, reserve

pytestmark = pytest.mark.lab
RELEASE = os.environ.get("SLURM_LAB_RELEASE", "22.05")


def _script(env: dict, cmd: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(LAB_SCRIPT), cmd], env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)


def _pid(lab_dir, name: str) -> int:
    return int((lab_dir / "run" / f"{name}.pid").read_text().strip())


@pytest.fixture
def person_lab():
    """A running one-node lab owned by a person (no SLURM_LAB_OWNER), stopped at the end by its owner."""
    res = reserve("the owner-check test's stand-in for make lab", nodes=1)
    env = res.script_env(1, RELEASE, SLURM_LAB_HEALTHCHECK_INTERVAL="0")
    for key in ("SLURM_LAB_OWNER", "SLURM_LAB_OWNER_NOTE"):
        env.pop(key)
    r = _script(env, "start")
    try:
        assert r.returncode == 0, r.stdout + r.stderr
        yield res, env
    finally:
        _script(env, "stop")
        res.release()


def test_a_running_lab_of_another_owner_is_never_attached_to(person_lab):
    res, env = person_lab
    holder, _note = read_owner(res.dir)
    assert holder.startswith("person:"), holder
    conf = (res.dir / "etc" / "slurm.conf").read_bytes()
    ctld = _pid(res.dir, "slurmctld")

    # the lab script itself refuses a test's token on that lab, by the holder's name, and changes nothing
    r = _script(dict(env, SLURM_LAB_OWNER=res.token, SLURM_LAB_NODES="2"), "start")
    assert r.returncode != 0
    assert f"held by '{holder}'" in r.stderr and f"not by '{res.token}'" in r.stderr, r.stderr
    assert (res.dir / "etc" / "slurm.conf").read_bytes() == conf
    assert _pid(res.dir, "slurmctld") == ctld and os.path.isdir(f"/proc/{ctld}")

    # the factory: the block is held (by this process's reservation) -> refused by name
    with pytest.raises(LabError, match="reserved by another test process"):
        reserve("a second reservation", nodes=1, base=res.base)
    # ... and once the lock is gone, the person's running lab still keeps the block: refused, naming the owner
    res.release()
    with pytest.raises(LabError, match=f"in use by a lab held by '{holder}'"):
        reserve("a reservation on a person's lab", nodes=1, base=res.base)
    other = reserve("any free block", nodes=1)
    try:
        assert other.base != res.base
    finally:
        other.release()
    assert _pid(res.dir, "slurmctld") == ctld and os.path.isdir(f"/proc/{ctld}")
    # the owner itself may come back to its lab
    r = _script(env, "start")
    assert r.returncode == 0, r.stderr
    assert _pid(res.dir, "slurmctld") == ctld


def test_a_lab_left_by_a_dead_test_process_is_reclaimed():
    """``reclaim`` is the step ``reserve`` takes on every block it locks. The test calls it with the block's lock
    held all along: releasing the lock to call ``reserve`` again would hand the block (and the lab in it) to any
    other test process for that moment, and this test's cleanup would then stop that process's new lab."""
    res = reserve("the orphan-lab test", nodes=1)
    dead = "test:999999999:0:deadbeef"  # no such PID: the owner is gone
    env = dict(res.script_env(1, RELEASE, SLURM_LAB_HEALTHCHECK_INTERVAL="0"), SLURM_LAB_OWNER=dead)
    try:
        r = _script(env, "start")
        assert r.returncode == 0, r.stdout + r.stderr
        ctld = _pid(res.dir, "slurmctld")
        assert reclaim(res.dir, 1) is True
        assert not os.path.isdir(f"/proc/{ctld}"), "the orphaned lab was not stopped"
        assert not (res.dir / "owner").exists(), "a stopped lab's directory still names an owner"
        # a lab whose owner lives is never reclaimed
        live = dict(env, SLURM_LAB_OWNER=res.token)
        r = _script(live, "start")
        assert r.returncode == 0, r.stdout + r.stderr
        ctld = _pid(res.dir, "slurmctld")
        assert reclaim(res.dir, 1) is False
        assert os.path.isdir(f"/proc/{ctld}")
    finally:
        _script(env, "stop")
        res.release()


def test_a_stopped_lab_of_a_live_test_process_is_not_taken():
    """The lab script's own guard, whatever the factory did: a lab directory whose owner file names a test process
    that still runs (its lab stopped only for the moment) is refused to any other owner, naming the holder; a
    token whose process is gone, or a person's, does not hold it. The block's lock is held all along."""
    res = reserve("the live-owner guard test", nodes=1)
    try:
        env = res.script_env(1, RELEASE, SLURM_LAB_HEALTHCHECK_INTERVAL="0")
        res.dir.mkdir(parents=True, exist_ok=True)
        live = process_token(1)  # init: a process that lives as long as the machine
        (res.dir / "owner").write_text(f"{live}\nanother test's lab, stopped for a moment\n")
        r = _script(env, "start")
        assert r.returncode != 0, r.stdout + r.stderr
        assert f"belongs to a test process that still runs: '{live}'" in r.stderr, r.stderr
        assert not (res.dir / "run" / "slurmctld.pid").exists() or not os.path.isdir(
            f"/proc/{_pid(res.dir, 'slurmctld')}"), "a lab was started in a directory another test process holds"
        assert read_owner(res.dir)[0] == live
        # the same token with another start time names a process that is gone: the directory is free
        (res.dir / "owner").write_text(f"{live.rsplit(':', 2)[0]}:0:deadbeef\n")
        r = _script(env, "start")
        assert r.returncode == 0, r.stdout + r.stderr
        assert read_owner(res.dir)[0] == res.token
    finally:
        r = _script(res.script_env(1, RELEASE), "stop")
        res.release()
    assert r.returncode == 0 and not (res.dir / "owner").exists(), r.stderr


def test_the_blocks_log_names_each_reservation_and_its_release():
    res = reserve("the blocks-log test", nodes=1)
    assert res.lost() == ""
    res.release()
    assert res.lost() == "released"
    mine = [line for line in (ROOT / "blocks.log").read_text().splitlines()
            if f"pid={os.getpid()} block={res.base} " in line and "the blocks-log test" in line]
    assert [line.split()[4] for line in mine[-2:]] == ["reserve:", "release:"], mine[-2:]


def test_a_lab_started_by_a_process_without_standard_input_runs_jobs():
    """A test process that has closed its fd 0 starts a lab: its daemons still get one (/dev/null) and a job runs.
    Before, slurmd started slurmstepd on a pipe it did not feed and no job of such a lab could start ("Failed to
    read conf from slurmd"): the accounting round trip failed in the lanes, after a test had closed stdin."""
    res = reserve("the closed-stdin test", nodes=1)
    env = res.script_env(1, RELEASE, SLURM_LAB_HEALTHCHECK_INTERVAL="0")
    starter = ("import os, subprocess, sys; os.close(0); "
               "sys.exit(subprocess.run(['bash', sys.argv[1], 'start'], capture_output=True).returncode)")
    try:
        r = subprocess.run([sys.executable, "-c", starter, str(LAB_SCRIPT)], env=env, capture_output=True,
                           text=True, timeout=300, check=False, stdin=subprocess.DEVNULL)
        assert r.returncode == 0, r.stdout + r.stderr
        client = dict(env, **parse_env(_script(env, "env").stdout))
        ran = res.dir / "ran"  # written by the job itself (the lab directory is seen at the same path in a chroot)
        ran.unlink(missing_ok=True)
        job = subprocess.run(["sbatch", "--wait", "--no-requeue", "-N1", "-o", "/dev/null", "--wrap", f"touch {ran}"],
                             env=client, capture_output=True, text=True, timeout=120, check=False)
        stepd = (res.dir / "log" / "slurmstepd.log").read_text(errors="replace")[-1000:]
        assert ran.exists(), job.stdout + job.stderr + stepd
    finally:
        _script(env, "stop")
        res.release()


@pytest.mark.accounting
def test_an_accounting_lab_starts_where_another_lab_left_a_new_cluster_id():
    """An accounting lab, then a lab without accounting whose state began anew (a new ClusterID), then an accounting
    lab again in the same directory: slurmctld refused to start ("CLUSTER ID MISMATCH": its state said one ID,
    slurmdbd another; Slurm 24.11). A fresh lab now takes the ID slurmdbd has."""
    res = reserve("the cluster-id test", nodes=1)
    env = res.script_env(1, RELEASE, SLURM_LAB_HEALTHCHECK_INTERVAL="0")
    try:
        for accounting in ("1", "0", "1"):
            if accounting == "0":
                shutil.rmtree(res.dir / "state", ignore_errors=True)  # the state lost: a new ClusterID follows
            r = _script(dict(env, SLURM_LAB_ACCOUNTING=accounting), "start")
            assert r.returncode == 0, f"accounting={accounting}: {r.stdout}{r.stderr}"
            assert _script(env, "stop").returncode == 0
    finally:
        _script(env, "stop")
        res.release()
