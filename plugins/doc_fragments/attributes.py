# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

# The standard attributes every module of the collection states, with the descriptions of ansible-core's
# ansible.builtin.action_common_attributes, so that a module lists this one fragment and nothing else:
#   extends_documentation_fragment:
#     - gpufleet.reliability.attributes          # check mode, diff mode, POSIX: all full
#     - gpufleet.reliability.attributes.no_diff  # instead, for a module that reports no diff
# Do not also list ansible.builtin.action_common_attributes before it: where fragments set the same key the one
# listed first wins, and that one says platform support N/A.
# A module may still add its own `attributes:` (for example `check_mode: details: ...`); Ansible merges it over
# the fragment's, attribute by attribute.
# Two literal strings, not one template: ansible-test's yamllint reads only string literals.


class ModuleDocFragment:
    # Check mode and diff mode fully supported, on POSIX targets.
    DOCUMENTATION = r"""
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target, if not
      supported the action will be skipped.
    support: full
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff
      mode
    support: full
  platform:
    description: Target OS/families that can be operated against
    support: full
    platforms: posix
"""

    # Check mode fully supported, no diff, on POSIX targets.
    NO_DIFF = r"""
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target, if not
      supported the action will be skipped.
    support: full
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff
      mode
    support: none
  platform:
    description: Target OS/families that can be operated against
    support: full
    platforms: posix
"""
