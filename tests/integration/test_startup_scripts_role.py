# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# The startup_scripts role applied for real (ansible-runner, local connection) into a temp root: twice, the
# second run unchanged; the units it writes pass `systemd-analyze verify`; the runner it installs runs from
# the copied files with the node's own python.
import json
import os
import shutil
import subprocess
import sys

import ansible_runner
import pytest
import yaml
from startup_role_helpers import NODE_PYTHON, REPO, apply_role, role_vars

from ansible_collections.gpufleet.reliability.plugins.filter.node_files import node_files


def test_role_twice_is_unchanged_and_units_verify(tmp_path, monkeypatch):
    root = tmp_path / "root"
    extravars = role_vars(root)
    r1, changed1 = apply_role(tmp_path, monkeypatch, extravars)
    assert r1.stats["changed"].get("node", 0) > 0
    r2, changed2 = apply_role(tmp_path, monkeypatch, extravars)
    assert changed2 == [], changed2
    assert r2.stats["changed"].get("node", 0) == 0

    systemd = root / "etc/systemd/system"
    unit = (systemd / "gpufleet-startup.service").read_text()
    assert "Before=slurmd.service" in unit and "Type=oneshot" in unit
    assert '--node "node3"' in unit and '--role worker' in unit
    assert f'Environment="SLURM_CONF={root}/etc/slurm/slurm.conf"' in unit
    dropin = (systemd / "slurmd.service.d/gpufleet-startup.conf").read_text()
    assert "After=gpufleet-startup.service" in dropin and "Wants=gpufleet-startup.service" in dropin
    assert os.readlink(systemd / "multi-user.target.wants/gpufleet-startup.service") == str(
        systemd / "gpufleet-startup.service")
    # copied, not linked, and identical to the collection's files
    lib = root / "opt/gpufleet/lib/ansible_collections/gpufleet/reliability/plugins/module_utils"
    shipped = node_files(["cli/startup.py"], REPO / "plugins/module_utils")  # everything the runner imports
    assert {"cli/startup.py", "startup/runner.py", "startup/scripts.py", "startup/__init__.py"} <= set(shipped)
    for rel in shipped:
        assert not (lib / rel).is_symlink()
        assert (lib / rel).read_bytes() == (REPO / "plugins/module_utils" / rel).read_bytes()

    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is missing (Debian package systemd)"
    env = dict(os.environ, SYSTEMD_UNIT_PATH=f"{systemd}:", SYSTEMD_LOG_LEVEL="notice")
    for target in (str(systemd / "gpufleet-startup.service"), "slurmd.service"):
        proc = subprocess.run([analyze, "verify", target], env=env, capture_output=True, text=True, timeout=60,
                              check=False)
        assert proc.returncode == 0 and proc.stderr.strip() == "", f"{target}: {proc.stdout}{proc.stderr}"


def test_installed_runner_runs_from_the_copy(tmp_path, monkeypatch):
    assert os.access(NODE_PYTHON, os.X_OK), f"{NODE_PYTHON} is needed as the node's python"
    root = tmp_path / "root"
    extravars = role_vars(root)
    apply_role(tmp_path, monkeypatch, extravars)
    cmd = [extravars["startup_scripts_bin_path"], "run", "--scripts-dir", extravars["startup_scripts_dir"],
           "--state-dir", extravars["startup_scripts_state_dir"], "--role", "worker", "--json", "-"]
    clean_env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONPATH": str(REPO / "collections")}
    for _unused in range(2):
        proc = subprocess.run(cmd, env=clean_env, capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["runner"] == str(
        root / "opt/gpufleet/lib/ansible_collections/gpufleet/reliability/plugins/module_utils/startup/runner.py")
    status = {s["name"]: s["status"] for s in report["scripts"]}
    assert status == {"10-once.sh": "skipped", "20-worker.sh": "ok", "30-login.sh": "skipped"}
    assert (root / "var/lib/gpufleet/once.txt").read_text() == "once\n"
    worker = next(s for s in report["scripts"] if s["name"] == "20-worker.sh")
    assert worker["output_tail"] == ["worker lab"]
    gate = subprocess.run([extravars["startup_scripts_bin_path"], "gate", "--state-dir",
                           extravars["startup_scripts_state_dir"]], env=clean_env, capture_output=True, text=True,
                          timeout=60, check=False)
    assert gate.returncode == 0, gate.stderr


@pytest.mark.parametrize("bad", ["compute"])
def test_bad_node_role_fails_clearly(tmp_path, monkeypatch, bad):
    pdd = tmp_path / "runner"
    (pdd / "project").mkdir(parents=True)
    (pdd / "project" / "site.yml").write_text(yaml.safe_dump(
        [{"hosts": "node", "gather_facts": False, "roles": ["gpufleet.reliability.startup_scripts"]}]))
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    r = ansible_runner.run(
        private_data_dir=str(pdd), playbook="site.yml", quiet=True,
        extravars=role_vars(tmp_path / "root", startup_scripts_node_role=bad),
        inventory={"all": {"hosts": {"node": {"ansible_connection": "local",
                                              "ansible_python_interpreter": sys.executable}}}},
        envvars={"ANSIBLE_COLLECTIONS_PATH": str(REPO / "collections")},
    )
    assert r.status == "failed"
    msgs = [str(e["event_data"]["res"].get("msg")) for e in r.events if e["event"] == "runner_on_failed"]
    assert any("startup_scripts_node_role" in m for m in msgs), msgs
