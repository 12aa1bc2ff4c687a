# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every module that talks to Slurm honours ``backend`` and ``slurm_conf`` the same way (one client helper,
module_utils/slurm_module.py), against the real lab: run through ``ansible`` with SLURM_CONF taken out of the
environment, so that only the option can lead the Slurm commands to the lab."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]


def run_module(module, args):
    argv = [str(Path(sys.executable).parent / "ansible"), "localhost", "-m", f"gpufleet.reliability.{module}",
            "-a", json.dumps(args), "-o"]
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    env.update(ANSIBLE_COLLECTIONS_PATH=str(REPO / "collections"), ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
               ANSIBLE_PYTHON_INTERPRETER=sys.executable, ANSIBLE_LOCALHOST_WARNING="False",
               ANSIBLE_INVENTORY_UNPARSED_WARNING="False")
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO, timeout=120, check=False)
    line = proc.stdout.strip().splitlines()[-1]
    status, _sep, payload = line.partition(" => ")
    return "FAILED" not in status, json.loads(payload)


def cases(lab):
    n = lab.nodes[0]
    return {
        "slurm_node": {"name": n, "state": "resumed"},
        "slurm_stuck": {"name": n},
        "repair_step": {"node": n, "op": "status"},
        "repair_plan": {"now": 1796232000},
    }


@pytest.mark.parametrize("module", ["slurm_node", "slurm_stuck", "repair_step", "repair_plan"])
def test_slurm_conf_and_backend_are_honoured(lab, module):
    conf = lab.env.get("SLURM_CONF") or str(lab.conf)
    args = cases(lab)[module]

    ok, res = run_module(module, dict(args, slurm_conf=conf, backend="cli"))
    assert ok and not res.get("changed"), res

    ok, res = run_module(module, dict(args, slurm_conf=str(lab.dir / "no-such" / "slurm.conf"), backend="cli"))
    assert not ok, res  # the option, not the environment, leads the commands: a missing file is an error

    ok, res = run_module(module, dict(args, slurm_conf=conf, backend="pyslurm"))
    assert not ok and "pyslurm" in res["msg"], res  # pyslurm is not installed here: backend reaches the client
