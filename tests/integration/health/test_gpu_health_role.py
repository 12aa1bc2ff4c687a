# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# The gpu_health role applied for real (ansible-runner, local connection) into a temp root: twice, the second run
# unchanged; the units verify with systemd-analyze; the installed agent runs from the copied files with the venv the
# role made (real nvidia-ml-py, from a wheelhouse that `make wheelhouse` builds from PyPI, on a node whose package
# index cannot be reached), and its textfile passes the real promtool. The online path (pip asks the index) is
# the fresh-root adoption test's.
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import ansible_runner
import pytest
import yaml

from ansible_collections.gpufleet.reliability.plugins.filter.node_files import node_files

REPO = Path(__file__).resolve().parents[3]
NODE_PYTHON = "/usr/bin/python3"


def role_vars(root: Path, **extra):
    v = {
        "gpu_health_lib_dir": str(root / "opt/gpufleet/lib"),
        "gpu_health_python": NODE_PYTHON,
        "gpu_health_venv": str(root / "opt/gpufleet/venv"),
        "gpu_health_agent_path": str(root / "usr/local/bin/gpufleet-health"),
        "gpu_health_healthcheck_path": str(root / "usr/local/sbin/gpufleet-healthcheck"),
        "gpu_health_config_dir": str(root / "etc/gpufleet"),
        "gpu_health_state_dir": str(root / "var/lib/gpufleet/health"),
        "gpu_health_textfile_dir": str(root / "var/lib/prometheus/node-exporter"),
        "gpu_health_systemd_dir": str(root / "etc/systemd/system"),
        "gpu_health_daemon_reload": False,
        "gpu_health_start_timer": False,
        "gpu_health_slurm": False,
        "gpu_health_expected_gpus": 8,
        "gpu_health_config": {"thresholds": {"sticky_window_s": 7200}, "skip_checks": ["persistence"]},
        "gpu_health_extra_args": ["--kmsg", "-"],
    }
    v.update(extra)
    return v


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory) -> Path:
    """The wheels `make wheelhouse` builds, for the node's Python here (pip downloads them from the index)."""
    ver = subprocess.run([NODE_PYTHON, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    dest = tmp_path_factory.mktemp("wheels") / "wheelhouse"
    proc = subprocess.run([sys.executable, str(REPO / "scripts/wheelhouse.py"), "--python-version", ver,
                           "--dest", str(dest)], capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return dest


# A node that cannot reach a package index: pip is told of one on a closed loopback port, and no pip
# configuration file of this machine (which may name local mirrors) is read.
OFFLINE = {"PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_CONFIG_FILE": os.devnull}


def apply_role(tmp_path: Path, monkeypatch, extravars: dict):
    pdd = tmp_path / "runner"
    (pdd / "project").mkdir(parents=True, exist_ok=True)
    play = [{"name": "gpu health", "hosts": "node", "gather_facts": False,
             "roles": ["gpufleet.reliability.gpu_health"],
             "post_tasks": [{"name": "The slurm_reliability role gets the agent",
                             "ansible.builtin.copy": {"content": "{{ gpufleet_slurm_healthcheck_program }}\n",
                                                      "dest": str(tmp_path / "hc-program.txt"), "mode": "0644"}}]}]
    (pdd / "project" / "site.yml").write_text(yaml.safe_dump(play))
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    r = ansible_runner.run(
        private_data_dir=str(pdd), playbook="site.yml", quiet=True, extravars=extravars,
        inventory={"all": {"hosts": {"node": {"ansible_connection": "local", "ansible_host": "localhost",
                                              "ansible_python_interpreter": sys.executable}}}},
        envvars={"ANSIBLE_COLLECTIONS_PATH": str(REPO / "collections"), **OFFLINE},
    )
    failures = [e["event_data"].get("res") for e in r.events if e["event"] == "runner_on_failed"]
    assert r.status == "successful" and r.rc == 0, failures or r.stdout.read()
    changed = [f'{e["event_data"]["task"]}: {e["event_data"]["res"].get("_ansible_item_label", "")}'
               for e in r.events
               if e["event"] in ("runner_on_ok", "runner_item_on_ok") and e["event_data"]["res"].get("changed")]
    return r, changed


def test_role_twice_unchanged_and_agent_runs(tmp_path, monkeypatch, wheelhouse):
    assert os.access(NODE_PYTHON, os.X_OK), f"{NODE_PYTHON} is needed as the node's python"
    root = tmp_path / "root"
    extravars = role_vars(root, gpu_health_wheelhouse=str(wheelhouse))
    r1, _changed1 = apply_role(tmp_path, monkeypatch, extravars)
    assert r1.stats["changed"].get("node", 0) > 0
    r2, changed2 = apply_role(tmp_path, monkeypatch, extravars)
    assert changed2 == [], changed2

    hc = root / "usr/local/sbin/gpufleet-healthcheck"
    assert (tmp_path / "hc-program.txt").read_text().strip() == str(hc)
    lib = root / "opt/gpufleet/lib/ansible_collections/gpufleet/reliability/plugins/module_utils"
    src = REPO / "plugins/module_utils"
    shipped = node_files(["cli/health_agent.py"], src)  # everything the agent imports (lazily too)
    assert {"cli/health_agent.py", "health/engine.py", "health/xid_catalog_data.py", "nvml.py", "kmsg.py",
            "repair/drain.py"} <= set(shipped)
    for rel in shipped:
        assert (lib / rel).read_bytes() == (src / rel).read_bytes(), rel
    assert json.loads((root / "etc/gpufleet/health.json").read_text())["skip_checks"] == ["persistence"]
    node_req = (REPO / "requirements/node.txt").read_text()
    pin = next(line for line in node_req.splitlines() if line.startswith("nvidia-ml-py=="))
    venv_py = root / "opt/gpufleet/venv/bin/python"
    ver = subprocess.run([str(venv_py), "-c", "import importlib.metadata as m; print(m.version('nvidia-ml-py'))"],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert pin == f"nvidia-ml-py=={ver}"  # installed with the index unreachable: from the wheelhouse alone
    assert (root / "opt/gpufleet/venv-wheels/SHA256SUMS").read_text() == (wheelhouse / "SHA256SUMS").read_text()

    for script in (hc, root / "usr/local/bin/gpufleet-health"):
        p = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True, check=False)
        assert p.returncode == 0, p.stdout

    # The installed wrapper, with an empty environment as slurmd gives it, on a fake node with a lost GPU.
    fake = tmp_path / "fake.json"
    fake.write_text(json.dumps({"devices": [{"index": 2, "fail": {"mode": "lost", "after_calls": 5}}]}))
    p = subprocess.run([str(hc), "--fake-nvml", str(fake), "--json"], env={}, capture_output=True, text=True,
                       timeout=120, check=False)
    assert p.returncode == 2, p.stdout + p.stderr
    d = json.loads(p.stdout)
    assert (d["code"], d["gpu"]) == ("gpu_lost", 2) and "slurm" not in d
    prom = root / "var/lib/prometheus/node-exporter/gpufleet_health.prom"
    check = subprocess.run(["promtool", "check", "metrics"], stdin=prom.open("rb"), capture_output=True, text=True,
                           check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    assert json.loads((root / "var/lib/gpufleet/health/state.json").read_text())["version"] == 1
    assert json.loads((root / "var/lib/gpufleet/health/report.json").read_text())["code"] == "gpu_lost"
    # a healthy fake node: exit 0
    fake.write_text("{}")
    assert subprocess.run([str(hc), "--fake-nvml", str(fake)], env={}, capture_output=True, timeout=120, check=False
                          ).returncode == 0

    systemd = root / "etc/systemd/system"
    assert (systemd / "timers.target.wants/gpufleet-health.timer").resolve() == systemd / "gpufleet-health.timer"
    service = (systemd / "gpufleet-health.service").read_text()
    assert f"ExecStart={hc}" in service and "SuccessExitStatus=1 2 3" in service
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is missing (Debian package systemd)"
    env = dict(os.environ, SYSTEMD_UNIT_PATH=f"{systemd}:", SYSTEMD_LOG_LEVEL="notice")
    for unit in ("gpufleet-health.service", "gpufleet-health.timer"):
        proc = subprocess.run([analyze, "verify", str(systemd / unit)], env=env, capture_output=True, text=True,
                              timeout=60, check=False)
        assert proc.returncode == 0 and proc.stderr.strip() == "", f"{unit}: {proc.stdout}{proc.stderr}"
