# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filter drain_reason: the Slurm reason of a drain for a finding, in the one format (slurmfacts.drain_reason)."""
from __future__ import annotations

DOCUMENTATION = r"""
name: drain_reason
short_description: The Slurm reason gpufleet drains a node with, for a finding code and GPU
description:
  - Gives C(<prefix> <code>), then C( gpu<N>) when O(gpu) is set - the format the node agent, the repair run and
    the simulator all write, from one function (C(plugins/module_utils/slurmfacts.py)).
author:
  - gpufleet.reliability contributors (@gpufleet)
positional: gpu, prefix
options:
  _input:
    description: The finding code (C(xid79), C(gpu_lost), ...).
    type: str
    required: true
  gpu:
    description: The GPU index, or null when the finding is about the whole node.
    type: raw
  prefix:
    description: The reason prefix (the repair policy's C(reason_prefix)).
    type: str
    default: "gpufleet:"
"""

EXAMPLES = r"""
- name: Drain a node for its finding
  ansible.builtin.debug:
    msg: "{{ 'xid79' | gpufleet.reliability.drain_reason(3) }}"  # gpufleet: xid79 gpu3
"""

RETURN = r"""
_value:
  description: The reason text.
  type: str
"""

from ansible_collections.gpufleet.reliability.plugins.module_utils.slurmfacts import REASON_PREFIX, drain_reason


def _drain_reason(code, gpu=None, prefix=REASON_PREFIX):
    return drain_reason(str(code), gpu, prefix=str(prefix))


class FilterModule:
    def filters(self):
        return {"drain_reason": _drain_reason}
