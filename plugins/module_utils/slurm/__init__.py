# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Slurm adapter: read and change node state through one small interface.

Standard library only, Python 3.9+, no Ansible import; nothing runs at import time. The parts:

``node``             the ``Node`` model (state, flags, out of service / drained by us through slurmfacts.py)
``parse``            Slurm's JSON and text output -> ``Node`` objects and job records
``hostlist``         hostlist expressions: checked splitting and a local expansion
``cli``              ``SlurmClient``: scontrol / sinfo / squeue, or pyslurm for node reads and changes
``pyslurm_backend``  the pyslurm client and the rule that picks it (``backend='auto'``)
``waiters``          poll until nodes are drained, resumed or rebooted, with a deadline
``errors``           ``SlurmError`` and how a failed command is classified

Backends: ``cli`` (default) reads nodes as JSON where the release has it (Slurm 22.05 ``sinfo --json``, >= 23.02
``scontrol show node --json``) and as ``scontrol -o -d show node`` text otherwise; ``pyslurm`` uses pyslurm's
``Node.load`` / ``Nodes.load`` / ``Node.modify``. ``backend='auto'`` picks pyslurm only when ``import pyslurm``
works AND its major.minor equals ``scontrol --version``'s. Reboots, jobs, requeue and hostlist expansion always go
through the CLI.
"""
from __future__ import annotations

from .cli import Runner, SlurmClient, subprocess_runner
from .errors import ERROR_KINDS, SlurmError
from .hostlist import expand_hostlist_local, split_hostlist_expr
from .node import BASE_STATES, NEXT_STATES, Node, split_state
from .parse import parse_jobs_text, parse_node_text_line, parse_nodes_json, parse_nodes_text, parse_version
from .pyslurm_backend import BACKENDS, pyslurm_version, select_backend
from .waiters import WAIT_STATES, WaitTimeout, reached, wait_for_nodes

__all__ = [
    "BACKENDS",
    "BASE_STATES",
    "ERROR_KINDS",
    "NEXT_STATES",
    "WAIT_STATES",
    "Node",
    "Runner",
    "SlurmClient",
    "SlurmError",
    "WaitTimeout",
    "expand_hostlist_local",
    "parse_jobs_text",
    "parse_node_text_line",
    "parse_nodes_json",
    "parse_nodes_text",
    "parse_version",
    "pyslurm_version",
    "reached",
    "select_backend",
    "split_hostlist_expr",
    "split_state",
    "subprocess_runner",
    "wait_for_nodes",
]
