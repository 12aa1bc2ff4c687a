# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filter merge_flags: a site's comma-list flags (PrologFlags) with ours added (slurmconf.merge_flags)."""
from __future__ import annotations

DOCUMENTATION = r"""
name: merge_flags
short_description: A site's Slurm flag list with ours added, the site's kept
description:
  - Keeps every flag of the input in its order and adds each flag of O(wanted) it lacks, compared case-blind as
    Slurm reads them - the rule the C(gpufleet.reliability.slurm_conf) module applies for
    O(gpufleet.reliability.slurm_conf#module:merge_keys).
  - Used for C(PrologFlags), where a site's C(Contain) (for C(pam_slurm_adopt)) and C(X11) must stay.
author:
  - gpufleet.reliability contributors (@gpufleet)
positional: wanted
options:
  _input:
    description: The site's flags, as a comma string (C(Contain,X11)) or a list; null for none.
    type: raw
    required: true
  wanted:
    description: The flags to add, as a list or a comma string.
    type: raw
    required: true
"""

EXAMPLES = r"""
- name: Keep the site's PrologFlags and add ours
  ansible.builtin.debug:
    msg: "{{ 'Contain,X11' | gpufleet.reliability.merge_flags(['Alloc', 'contain']) }}"  # [Contain, X11, Alloc]
"""

RETURN = r"""
_value:
  description: The merged flags, the site's first.
  type: list
  elements: str
"""

from ansible_collections.gpufleet.reliability.plugins.module_utils.slurmconf import merge_flags


class FilterModule:
    def filters(self):
        return {"merge_flags": merge_flags}
