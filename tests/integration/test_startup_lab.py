# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# gpufleet-startup against the real Slurm lab: a failing startup drains the node and keeps it drained, a passing
# one resumes it, and only when the drain was ours. Run with, e.g.,
#   SLURM_LAB_PORT_BASE=17400 SLURM_LAB_DIR=/tmp/gpufleet-lab-17400 .venv/bin/python -m pytest \
#       tests/integration/test_startup_lab.py -m lab
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from startup_role_helpers import apply_role, role_vars

RUNNER = os.path.join(os.path.dirname(sys.executable), "gpufleet-startup")


class Node:
    """A fake node's startup: its scripts dir and state dir, and the runner run as on that node."""

    def __init__(self, root: Path, name: str):
        self.name = name
        self.scripts = root / "startup.d"
        self.state = root / "state"
        self.scripts.mkdir(parents=True)

    def script(self, name, body, **meta):
        path = self.scripts / name
        path.write_text("#!/usr/bin/env bash\n" + body + "\n")
        path.chmod(0o755)
        (self.scripts / (name + ".json")).write_text(json.dumps(dict(meta, name=name)))

    def run(self, *extra, by_env=True):
        env = dict(os.environ)  # the slurm_lab fixture exported SLURM_CONF
        argv = [RUNNER, "run", "--scripts-dir", str(self.scripts), "--state-dir", str(self.state), "--json", "-"]
        if by_env:
            env["SLURMD_NODENAME"] = self.name  # as under slurmd / on the node itself
            argv.append("--slurm")
        else:
            argv += ["--node", self.name]
        proc = subprocess.run(argv + list(extra), env=env, capture_output=True, text=True, timeout=120, check=False)
        return proc.returncode, json.loads(proc.stdout)

    def gate(self):
        return subprocess.run([RUNNER, "gate", "--state-dir", str(self.state)], capture_output=True, text=True,
                              timeout=60, check=False).returncode


def drained(state_reason):
    return state_reason[0].startswith("drain")


@pytest.mark.lab
def test_failing_startup_keeps_node_drained_and_passing_resumes(lab, tmp_path):
    node = Node(tmp_path, lab.nodes[1])
    flag = tmp_path / "nvme-ready"
    node.script("10-base", "echo base")
    node.script("20-nvme", f'[ -e "{flag}" ] || {{ echo "nvme not ready"; exit 1; }}', order=20)
    node.script("30-after", "echo after", order=30)

    code, report = node.run()
    assert code == 1 and report["failed"] == "20-nvme"
    assert report["slurm"]["action"] == "drain" and report["slurm"]["error"] is None
    state, reason = lab.wait_for(node.name, drained)
    assert reason == "gpufleet: startup 20-nvme"
    assert node.gate() == 0  # drained: slurmd may register, the node takes no jobs
    # other nodes untouched
    assert all(not drained(lab.node_states()[n]) for n in lab.nodes if n != node.name)

    code, report = node.run()  # still failing on the next boot: stays drained
    assert code == 1 and report["slurm"]["action"] == "kept"
    assert lab.wait_for(node.name, drained)[1] == "gpufleet: startup 20-nvme"

    flag.touch()
    code, report = node.run(by_env=False)
    assert code == 0 and report["ok"] is True
    assert report["slurm"]["action"] == "resume"
    lab.wait_for(node.name, "idle")

    code, report = node.run()
    assert code == 0 and report["slurm"]["action"] == "none"
    assert lab.node_states()[node.name][0] == "idle"


@pytest.mark.lab
def test_a_drain_by_someone_else_is_left_alone(lab, tmp_path):
    node = Node(tmp_path, lab.nodes[2])
    lab.run("scontrol", "update", f"NodeName={node.name}", "State=DRAIN", "Reason=ops: replace psu")
    lab.wait_for(node.name, drained)
    node.script("10-ok", "true")
    code, report = node.run()
    assert code == 0 and report["slurm"]["action"] == "kept"
    assert lab.wait_for(node.name, drained)[1] == "ops: replace psu"  # not resumed
    node.script("20-bad", "exit 3", order=20)
    code, report = node.run()
    assert code == 1 and report["slurm"]["action"] == "kept"
    assert lab.node_states()[node.name][1] == "ops: replace psu"  # their reason is kept
    assert node.gate() == 0


@pytest.mark.lab
def test_failed_health_check_drains(lab, tmp_path):
    node = Node(tmp_path, lab.nodes[3])
    node.script("10-ok", "true")
    code, report = node.run("--health-cmd", "sh -c 'echo gpu3 xid 79; exit 1'")
    assert code == 1 and report["failed"] == "health-check"
    assert lab.wait_for(node.name, drained)[1] == "gpufleet: startup health-check"
    code, report = node.run("--health-cmd", "true")
    assert code == 0 and report["slurm"]["action"] == "resume"
    lab.wait_for(node.name, "idle")


@pytest.mark.lab
def test_unknown_node_is_a_slurm_error_and_the_gate_stays_shut(lab, tmp_path):
    node = Node(tmp_path, "no-such-node")
    node.script("10-bad", "exit 1")
    code, report = node.run()
    assert code == 1 and report["slurm"]["error"]
    assert node.gate() == 1  # failed and not drained: slurmd must not start


def _unit_command(path: Path, key: str):
    """argv of the unit's ExecStart/ExecStartPre line and its Environment= settings, as systemd would split them."""
    argv, env = None, {}
    for line in path.read_text().splitlines():
        if line.startswith(key + "="):
            argv = shlex.split(line[len(key) + 1:])
        elif line.startswith("Environment="):
            for item in shlex.split(line[len("Environment="):]):
                k, _sep, v = item.partition("=")
                env[k] = v
    assert argv, f"no {key}= in {path}"
    return argv, env


@pytest.mark.lab
def test_role_installed_unit_command_drains_then_resumes(lab, tmp_path, monkeypatch):
    """The whole chain: the role's unit command line, the wrapper, the copied runner and slurm adapter, the lab."""
    name = lab.nodes[0]
    root = tmp_path / "root"
    failing = {"name": "20-gpu-firmware.sh", "order": 20,
               "content": "#!/usr/bin/env bash\necho 'firmware mismatch'\nexit 1\n"}
    extravars = role_vars(root, startup_scripts_slurm_node=name, startup_scripts_slurm_conf=str(lab.conf),
                          startup_scripts_scripts=[failing])
    apply_role(tmp_path, monkeypatch, extravars)
    systemd = root / "etc/systemd/system"
    start, env = _unit_command(systemd / "gpufleet-startup.service", "ExecStart")
    gate, _gate_env = _unit_command(systemd / "slurmd.service.d/gpufleet-startup.conf", "ExecStartPre")
    assert env == {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "SLURM_CONF": str(lab.conf)}
    env["PATH"] = lab.env.get("PATH", env["PATH"])  # the 24.11 lane puts its wrappers first

    proc = subprocess.run(start, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 1, proc.stderr
    state, reason = lab.wait_for(name, drained)
    assert reason == "gpufleet: startup 20-gpu-firmware.sh"
    assert subprocess.run(gate, env=env, capture_output=True, text=True, timeout=60, check=False).returncode == 0
    report = json.loads((root / "var/lib/gpufleet/startup/last-run.json").read_text())
    assert report["runner"].startswith(str(root / "opt/gpufleet/lib/"))
    assert report["scripts"][-1]["output_tail"] == ["firmware mismatch"]

    fixed = dict(failing, content="#!/usr/bin/env bash\necho 'firmware ok'\n")
    apply_role(tmp_path, monkeypatch, dict(extravars, startup_scripts_scripts=[fixed]))
    proc = subprocess.run(start, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    lab.wait_for(name, "idle")
