# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Glue between AnsibleModule and the Slurm adapter (no Ansible import: the module object is passed in).

Every module that talks to Slurm takes ``SLURM_COMMON_ARGS`` (documented by the ``gpufleet.reliability.slurm`` doc
fragment) and builds its client with ``client_from_module``: one way to honour ``backend`` and ``slurm_conf``.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, NoReturn, Optional, Tuple

from .slurm import Runner, SlurmClient, SlurmError

SLURM_COMMON_ARGS: Dict[str, Dict[str, Any]] = dict(
    backend=dict(type="str", choices=["auto", "cli", "pyslurm"], default="auto"),
    slurm_conf=dict(type="path"),
)


def module_runner(module: Any, env: Optional[Dict[str, str]] = None) -> Runner:
    """argv -> (rc, stdout, stderr) through module.run_command, LC_ALL=C, no shell."""
    update = {"LC_ALL": "C"}
    update.update(env or {})

    def run(argv: List[str]) -> Tuple[int, str, str]:
        rc, out, err = module.run_command(argv, environ_update=update)
        return rc, out, err

    return run


def client_from_module(module: Any) -> SlurmClient:
    """The Slurm client for a module's params: ``backend``, ``slurm_conf`` (E(SLURM_CONF) for the commands) and, where
    the module has them, ``scontrol`` / ``sinfo`` (the commands' paths). A bad value fails the module."""
    p = module.params
    env = {}
    if p.get("slurm_conf"):
        if not os.path.isfile(p["slurm_conf"]):
            # Slurm's commands retry a slurm.conf they cannot read for about a minute before they fail: say so now
            module.fail_json(msg=f"slurm_conf: no such file {p['slurm_conf']!r} (expected the path of the cluster's "
                             "slurm.conf)")
        env["SLURM_CONF"] = p["slurm_conf"]
    commands = {k: p[k] for k in ("scontrol", "sinfo", "squeue") if p.get(k)}
    try:
        return SlurmClient(runner=module_runner(module, env), backend=p.get("backend") or "auto", **commands)
    except ValueError as exc:
        module.fail_json(msg=str(exc))
        raise  # fail_json exits; this only tells readers and type checkers so


def fail_slurm(module: Any, exc: BaseException, **extra: Any) -> NoReturn:
    """fail_json for a SlurmError with its details; kind says what went wrong."""
    if isinstance(exc, SlurmError):
        module.fail_json(msg=exc.msg, error_kind=exc.kind, rc=exc.rc, stdout=exc.stdout, stderr=exc.stderr,
                         **extra)
    module.fail_json(msg=str(exc), **extra)
    raise exc  # fail_json exits; this only tells readers and type checkers so
