# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The ``diff`` a module returns in diff mode, built one way by every module (stdlib only, Python 3.9+).

Ansible's diff mode reads a module's ``diff`` result: one entry or a list of entries, each with ``before`` and
``after`` (text, or a mapping that Ansible prints as sorted JSON) and ``before_header`` / ``after_header`` naming
what they are (a path, or something like ``nodes gpu[01-04]``). Ansible prints a unified diff of each entry, so
text must be text: bytes are decoded here (undecodable bytes shown as U+FFFD; the diff is for reading, the file
keeps its bytes) and an absent file is the empty text.

- :func:`change` - one entry: what one thing was and will be.
- :func:`file_changes` - the entries for one file: its content when that changes, and its mode when that changes
  on a file that exists before and after (a mode-only change is otherwise invisible in a content diff).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Union

# A side of a diff: text, bytes (decoded for display), a mapping (Ansible prints it as JSON), or None (absent).
Side = Union[None, str, bytes, Mapping[str, Any]]
Entry = Dict[str, Any]


def _side(value: Side) -> Union[str, Dict[str, Any]]:
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"diff: a side is text, bytes, a mapping or None, not {type(value).__name__}")


def change(header: str, before: Side, after: Side) -> Entry:
    """One diff entry: ``header`` (a path, or a name for what changes) before and after; None is absent."""
    return {"before_header": header, "after_header": header, "before": _side(before), "after": _side(after)}


def file_changes(
    path: str,
    before: Union[None, str, bytes],
    after: Union[None, str, bytes],
    before_mode: Optional[int] = None,
    after_mode: Optional[int] = None,
    *,
    shown: Optional[Callable[[Union[str, bytes]], Side]] = None,
) -> List[Entry]:
    """The entries for one file, none when nothing changes.

    ``before`` / ``after``: its content now and as the module leaves it (None: absent). ``before_mode`` /
    ``after_mode``: its permission bits now and as left; a change of mode is its own entry, headed ``PATH (mode)``,
    when both are known (a created or removed file shows its content only). ``shown``: what the diff shows of a
    content that may hold secrets (the contents are compared as they are, so a change of a hidden value is still
    an entry).
    """
    entries: List[Entry] = []
    if before != after:  # compared as given: two undecodable contents may display alike yet differ
        if shown is None:
            entries.append(change(path, before, after))
        else:
            entries.append(change(path, None if before is None else shown(before),
                                  None if after is None else shown(after)))
    if before_mode is not None and after_mode is not None and before_mode & 0o7777 != after_mode & 0o7777:
        entries.append(change(f"{path} (mode)", f"{before_mode & 0o7777:04o}\n", f"{after_mode & 0o7777:04o}\n"))
    return entries
