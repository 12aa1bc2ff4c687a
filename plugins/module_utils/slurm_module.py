# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Glue between AnsibleModule and the Slurm adapter (no Ansible import: the module object is passed in)."""
from __future__ import annotations

from .slurm import SlurmClient, SlurmError

SLURM_COMMON_ARGS = dict(
    backend=dict(type="str", choices=["auto", "cli", "pyslurm"], default="auto"),
    slurm_conf=dict(type="path"),
)


def module_runner(module, env=None):
    """argv -> (rc, stdout, stderr) through module.run_command, LC_ALL=C, no shell."""
    update = {"LC_ALL": "C"}
    update.update(env or {})

    def run(argv):
        return module.run_command(argv, environ_update=update)

    return run


def client_from_module(module):
    env = {}
    if module.params.get("slurm_conf"):
        env["SLURM_CONF"] = module.params["slurm_conf"]
    try:
        return SlurmClient(runner=module_runner(module, env), backend=module.params.get("backend") or "auto")
    except ValueError as exc:
        module.fail_json(msg=str(exc))


def fail_slurm(module, exc, **extra):
    """fail_json for a SlurmError with its details; kind says what went wrong."""
    if isinstance(exc, SlurmError):
        module.fail_json(msg=exc.msg, error_kind=exc.kind, rc=exc.rc, stdout=exc.stdout, stderr=exc.stderr,
                         **extra)
    module.fail_json(msg=str(exc), **extra)
