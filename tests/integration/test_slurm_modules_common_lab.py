# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every module that talks to Slurm honours ``backend`` and ``slurm_conf`` the same way (one client helper,
module_utils/slurm_module.py), against the real lab: run through ``ansible`` with SLURM_CONF taken out of the
environment, so that only the option can lead the Slurm commands to the lab."""
from __future__ import annotations

import pytest

from support.ansible_cli import run_module as _run_module

pytestmark = pytest.mark.lab


def run_module(module, args):
    """The module through ``ansible``, SLURM_CONF taken out of the environment."""
    return _run_module(module, args, drop_env=("SLURM_CONF",))


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
    # a missing file is refused at once, by the option's name (Slurm's commands would retry it for a minute)
    assert not ok and res["msg"].startswith("slurm_conf: no such file"), res

    ok, res = run_module(module, dict(args, slurm_conf=conf, backend="pyslurm"))
    assert not ok and "pyslurm" in res["msg"], res  # pyslurm is not installed here: backend reaches the client
