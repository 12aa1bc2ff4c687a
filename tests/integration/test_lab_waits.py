# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab script's waits end on time and say why.

A lab of this module's own (1 node, a block of its own from the lab factory, the lane's release) is started; then its
munged is frozen (SIGSTOP) and its slurmctld killed, and `slurm-lab.sh start` runs again with
SLURM_LAB_CTLD_TIMEOUT=5: the new slurmctld cannot get a credential, so it never answers `scontrol ping`. The start
must fail, name its bound, and show the last ping answer and the tails of slurmctld's and munged's logs. (It used
to count 300 attempts, which under load took 10 minutes to report "within 30 s", with no diagnosis.)
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from support.labs import LAB_SCRIPT, reserve

pytestmark = [pytest.mark.lab]
RELEASE = os.environ.get("SLURM_LAB_RELEASE", "22.05")


@pytest.fixture(scope="module")
def block():
    res = reserve("the lab-waits lab (slurmctld that never answers)", nodes=1)
    yield res
    res.release()


def _lab(block, cmd: str, timeout: float = 300, **extra) -> subprocess.CompletedProcess:
    env = block.script_env(1, RELEASE, SLURM_LAB_HEALTHCHECK_INTERVAL="0", **extra)
    return subprocess.run(["bash", str(LAB_SCRIPT), cmd], env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)


def _pid(block, name: str) -> int:
    return int((block.dir / "run" / f"{name}.pid").read_text().strip())


def _gone(pid: int, timeout: float = 15) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not Path(f"/proc/{pid}").exists():
            return True
        time.sleep(0.1)
    return False


def _lab_munged(lab_dir: Path) -> list[str]:
    """`PID command line` of every munged whose socket is this lab's (for a failure's message)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "munged" in cmd and f"--socket={lab_dir}/munge/" in cmd:
            found.append(f"{proc.name} {cmd}")
    return found


def test_slurmctld_that_never_answers_fails_within_its_bound_with_a_diagnosis(block):
    lab_dir = block.dir
    r = _lab(block, "start")
    if r.returncode != 0:
        _lab(block, "stop", timeout=120)  # a failed start leaves nothing running
    assert r.returncode == 0, r.stdout + r.stderr
    munged = _pid(block, "munged")
    try:
        ctld = _pid(block, "slurmctld")
        os.kill(munged, signal.SIGSTOP)
        os.kill(ctld, signal.SIGKILL)
        assert _gone(ctld)
        seen = f"froze munged {munged}; munged of this lab before the start: {_lab_munged(lab_dir)}"
        r = _lab(block, "start", timeout=120, SLURM_LAB_CTLD_TIMEOUT="5")
        assert r.returncode != 0, f"{seen}\n{r.stdout}{r.stderr}"
        assert Path(f"/proc/{munged}").exists(), f"{seen}; the start replaced it:\n{r.stderr}"
        assert "slurmctld did not answer 'scontrol ping' within 5 s" in r.stderr, r.stderr
        assert "--- last 'scontrol ping'" in r.stderr
        assert f"--- {lab_dir}/log/slurmctld.log (tail)" in r.stderr
        assert f"--- {lab_dir}/log/munged.log (tail)" in r.stderr
    finally:
        os.kill(munged, signal.SIGCONT)
        stop = _lab(block, "stop", timeout=120)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert _gone(munged)


def test_bad_timeout_setting_is_refused_by_name(block):
    r = _lab(block, "status", SLURM_LAB_CTLD_TIMEOUT="soon")
    assert r.returncode != 0
    assert "SLURM_LAB_CTLD_TIMEOUT must be a positive number of seconds, got 'soon'" in r.stderr


def test_a_munged_its_pid_file_does_not_name_is_adopted_not_replaced(block):
    """A start that finds this lab's own munged (this release) alive while its PID file names nothing alive keeps it:
    it is the munged start_munged would adopt, not a stray to kill and replace."""
    r = _lab(block, "start")
    try:
        assert r.returncode == 0, r.stdout + r.stderr
        munged, ctld = _pid(block, "munged"), _pid(block, "slurmctld")
        os.kill(ctld, signal.SIGKILL)
        assert _gone(ctld)
        (block.dir / "run" / "munged.pid").write_text("999999999\n")  # names no process
        r = _lab(block, "start", timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"munged pid {munged} runs for this lab but" in r.stderr and "adopting it" in r.stderr, r.stderr
        assert "stopping stray /usr/sbin/munged" not in r.stderr, r.stderr
        assert _pid(block, "munged") == munged and Path(f"/proc/{munged}").exists()
    finally:
        stop = _lab(block, "stop", timeout=120)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert _gone(munged)
