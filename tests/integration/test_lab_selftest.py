# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Slurm lab itself: drain/resume, reboot, health check and hook, PID safety of the lab script."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

LAB_SCRIPT = Path(__file__).resolve().parents[2] / "tests" / "lab" / "slurm-lab.sh"

pytestmark = pytest.mark.lab


def test_lab_has_all_nodes_idle_with_fake_gpus(lab):
    states = lab.node_states()
    assert sorted(states) == sorted(lab.nodes)
    assert all(s == "idle" for s, _reason in states.values()), states  # 24.11 keeps old reasons
    gres = lab.run("sinfo", "-h", "-N", "-o", "%N %G").stdout.split()
    assert "gpu:h100:8" in gres
    assert os.environ["SLURM_CONF"] == str(lab.conf)
    version = lab.run("scontrol", "--version").stdout
    assert f" {lab.release}." in version, version


def test_drain_and_resume_through_scontrol(lab):
    node = lab.nodes[1]
    lab.run("scontrol", "update", f"NodeName={node}", "State=DRAIN", "Reason=xid 79 (test)")
    assert lab.wait_for(node, "drained", timeout=10) == ("drained", "xid 79 (test)")
    lab.run("scontrol", "update", f"NodeName={node}", "State=RESUME")
    lab.wait_for(node, "idle", timeout=15)


def test_reset_undoes_drain_and_down(lab):
    lab.run("scontrol", "update", f"NodeName={lab.nodes[0]}", "State=DRAIN", "Reason=left over")
    lab.run("scontrol", "update", f"NodeName={lab.nodes[1]}", "State=DOWN", "Reason=left over")
    assert lab.node_states()[lab.nodes[1]][0].startswith("down")
    lab.reset()
    assert all(s == "idle" for s, _reason in lab.node_states().values())


def test_reboot_restarts_that_slurmd(lab):
    node = lab.nodes[2]
    log = lab.dir / "log" / "reboot-calls.log"
    before = log.read_text().count(f"node={node} ") if log.exists() else 0
    lab.run("scontrol", "reboot", "ASAP", "nextstate=RESUME", "reason=test reboot", node)
    lab.wait_for(node, lambda sr: sr[0] != "idle", timeout=10)
    # the RebootProgram restarts that slurmd; on a loaded 2-core machine 24.11's restarted slurmd took two minutes
    # to register (past the lab's old 60 s ResumeTimeout: "reboot timed out"); the lab now allows 180 s
    lab.wait_for(node, "idle", timeout=200)
    assert log.read_text().count(f"node={node} ") == before + 1


def test_health_flag_drains_node(lab):
    node = lab.nodes[1]
    lab.flag(node, "xid 79\ngpu3")
    state = lab.wait_for(node, "drained", timeout=30)
    assert state == ("drained", "healthcheck: xid 79gpu3")


def test_health_hook_is_run_with_path_and_slurm_conf(lab, tmp_path):
    out = lab.dir / "log" / "hook-env.txt"
    out.unlink(missing_ok=True)
    lab.hook.write_text(
        "#!/bin/sh\n"
        f'echo "$SLURMD_NODENAME|$SLURM_CONF|$PATH|$(scontrol --version)" >> {out}\n'
        'if [ "$SLURMD_NODENAME" = node4 ]; then scontrol update NodeName=node4 State=DRAIN Reason="hook: bad"; fi\n'
    )
    lab.hook.chmod(0o755)
    lab.wait_for("node4", "drained", timeout=30)
    lines = out.read_text().splitlines()
    node, conf, path, version = lines[0].split("|")
    assert node in lab.nodes and conf == str(lab.conf)
    assert "/usr/bin" in path
    assert f" {lab.release}." in version
    assert lab.node_states()["node4"] == ("drained", "hook: bad")


def test_env_prints_slurm_conf(lab):
    out = lab.script_run("env").stdout
    assert f"export SLURM_CONF={lab.conf}" in out.splitlines()


def test_stop_never_signals_unverified_pids(tmp_path):
    """Stale PID files pointing at PID 1 and at an unrelated process are removed, nothing is signalled."""
    lab_dir = tmp_path / "lab"
    (lab_dir / "run").mkdir(parents=True)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (lab_dir / "run" / "slurmctld.pid").write_text("1\n")
        (lab_dir / "run" / "munged.pid").write_text(f"{sleeper.pid}\n")
        (lab_dir / "run" / "slurmd-node1.pid").write_text(f"{sleeper.pid}\n")
        env = dict(os.environ, SLURM_LAB_DIR=str(lab_dir), SLURM_LAB_PORT_BASE="16870", SLURM_LAB_NODES="1")
        proc = subprocess.run(["bash", str(LAB_SCRIPT), "stop"], env=env, capture_output=True, text=True,
                              timeout=60, check=False)
        assert proc.returncode == 0, proc.stderr
        assert sleeper.poll() is None, "an unrelated process was signalled"
        assert os.path.isdir("/proc/1")
        assert not list((lab_dir / "run").iterdir())
    finally:
        sleeper.kill()
        sleeper.wait()


def test_bad_settings_are_refused(tmp_path):
    env = dict(os.environ, SLURM_LAB_DIR=str(tmp_path), SLURM_LAB_RELEASE="21.08")
    proc = subprocess.run(["bash", str(LAB_SCRIPT), "status"], env=env, capture_output=True, text=True, check=False)
    assert proc.returncode != 0 and "SLURM_LAB_RELEASE must be 22.05 or 24.11" in proc.stderr
    env = dict(os.environ, SLURM_LAB_DIR=str(tmp_path), SLURM_LAB_NODES="zero")
    proc = subprocess.run(["bash", str(LAB_SCRIPT), "status"], env=env, capture_output=True, text=True, check=False)
    assert proc.returncode != 0 and "SLURM_LAB_NODES" in proc.stderr
