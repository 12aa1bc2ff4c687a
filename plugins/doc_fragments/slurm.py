# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations


class ModuleDocFragment:
    # How the Slurm modules reach Slurm (module_utils/slurm.py).
    DOCUMENTATION = r"""
options:
  backend:
    description:
      - How Slurm is driven.
      - V(cli) runs C(scontrol), C(sinfo) and C(squeue) (JSON output where the Slurm release has it,
        C(sinfo --json) on 22.05, C(scontrol show node --json) on 23.02 and later; plain text otherwise).
      - V(pyslurm) uses pyslurm's C(Node) API and fails when pyslurm is missing or built for another Slurm
        release.
      - V(auto) picks V(pyslurm) only when it imports and its major.minor version equals that of
        C(scontrol --version), else V(cli). Reboots, jobs and hostlist expansion always use the CLI.
    type: str
    choices: [auto, cli, pyslurm]
    default: auto
  slurm_conf:
    description:
      - Path of the C(slurm.conf) the Slurm commands use (sets E(SLURM_CONF) for them).
      - When not given, the environment's E(SLURM_CONF) or Slurm's default applies.
      - A path that is not a file fails the task at once, naming this option.
    type: path
notes:
  - The Slurm client commands must be on E(PATH) of the target (the node where the task runs, often the Slurm
    controller through C(delegate_to)) and able to authenticate to slurmctld (munge).
  - Changes to several nodes are one C(scontrol update NodeName=<hostlist>) call; every node name is checked
    first, so an unknown name changes nothing.
"""
