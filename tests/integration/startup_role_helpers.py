# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# Shared by the startup_scripts role tests: the role's variables mapped into a temp root, and the role applied
# for real through ansible-runner (local connection).
import os
import sys
from pathlib import Path

import ansible_runner
import yaml

REPO = Path(__file__).resolve().parents[2]
NODE_PYTHON = "/usr/bin/python3"


def role_vars(root: Path, **extra):
    v = {
        "startup_scripts_lib_dir": str(root / "opt/gpufleet/lib"),
        "startup_scripts_bin_path": str(root / "usr/local/sbin/gpufleet-startup"),
        "startup_scripts_python": NODE_PYTHON,
        "startup_scripts_dir": str(root / "etc/gpufleet/startup.d"),
        "startup_scripts_state_dir": str(root / "var/lib/gpufleet/startup"),
        "startup_scripts_log_file": str(root / "var/log/gpufleet/startup.log"),
        "startup_scripts_systemd_dir": str(root / "etc/systemd/system"),
        "startup_scripts_daemon_reload": False,
        "startup_scripts_slurm_node": "node3",
        "startup_scripts_slurm_conf": str(root / "etc/slurm/slurm.conf"),
        "startup_scripts_health_cmd": "/bin/sh -c 'exit 0'",
        "startup_scripts_scripts": [
            {"name": "10-once.sh", "phase": "once", "order": 10,
             "content": "#!/usr/bin/env bash\necho once >> \"$GPUFLEET_STARTUP_STATE_DIR/../once.txt\"\n"},
            {"name": "20-worker.sh", "order": 20, "roles": ["worker"], "timeout": 30, "retries": 1,
             "environment": {"SITE": "lab"}, "content": "#!/usr/bin/env bash\necho \"worker $SITE\"\n"},
            {"name": "30-login.sh", "order": 30, "roles": ["login"], "content": "#!/bin/sh\necho login\n"},
        ],
    }
    v.update(extra)
    return v


def apply_role(tmp_path: Path, monkeypatch, extravars: dict):
    pdd = tmp_path / "runner"
    (pdd / "project").mkdir(parents=True, exist_ok=True)
    play = [{"name": "startup scripts", "hosts": "node", "gather_facts": False,
             "roles": ["gpufleet.reliability.startup_scripts"]}]
    (pdd / "project" / "site.yml").write_text(yaml.safe_dump(play))
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    r = ansible_runner.run(
        private_data_dir=str(pdd), playbook="site.yml", quiet=True, extravars=extravars,
        inventory={"all": {"hosts": {"node": {"ansible_connection": "local", "ansible_host": "localhost",
                                              "ansible_python_interpreter": sys.executable}}}},
        envvars={"ANSIBLE_COLLECTIONS_PATH": str(REPO / "collections")},
    )
    failures = [e["event_data"].get("res") for e in r.events if e["event"] == "runner_on_failed"]
    assert r.status == "successful" and r.rc == 0, failures or r.stdout.read()
    changed_tasks = [
        f'{e["event_data"]["task"]}: {e["event_data"]["res"].get("_ansible_item_label", "")}'
        for e in r.events
        if e["event"] in ("runner_on_ok", "runner_item_on_ok") and e["event_data"]["res"].get("changed")
    ]
    return r, changed_tasks
