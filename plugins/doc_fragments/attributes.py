# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations


class ModuleDocFragment:
    # The support levels every module of the collection states for the standard attributes; the descriptions
    # come from ansible.builtin.action_common_attributes. A module lists this fragment FIRST: when fragments
    # set the same key of an attribute, the one listed earlier wins (the builtin one says platform support N/A).
    #   extends_documentation_fragment:
    #     - gpufleet.reliability.attributes          # check mode, diff mode, POSIX: all full
    #       (or gpufleet.reliability.attributes.no_diff for a module that reports no diff)
    #     - ansible.builtin.action_common_attributes
    # A module may still add its own `attributes:` (for example `check_mode: details: ...`); Ansible merges it
    # over the fragments', attribute by attribute.

    # Check mode and diff mode fully supported, on POSIX targets.
    DOCUMENTATION = r"""
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
  platform:
    support: full
    platforms: posix
"""

    # Check mode fully supported, no diff, on POSIX targets.
    NO_DIFF = r"""
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    support: full
    platforms: posix
"""
