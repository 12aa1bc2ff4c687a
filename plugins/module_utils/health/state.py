# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The small state file carried between runs (counters for rates, remembered severe events).

Written atomically (temp file in the same directory, fsync, os.replace). A missing, unreadable or corrupt
file is treated as "no previous run": rates start again, nothing fails.
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, Union

from ..fileutil import atomic_write as _atomic_write

STATE_VERSION = 1


def load_state(path: Union[str, os.PathLike[str]]) -> Dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
        return {}
    return data


def atomic_write(path: Union[str, os.PathLike[str]], text: str, mode: int = 0o644) -> None:
    """fileutil.atomic_write, creating the state directory on first use."""
    _atomic_write(path, text, mode, makedirs=True)


def save_state(path: Union[str, os.PathLike[str]], state: Dict[str, Any]) -> None:
    data = dict(state)
    data["version"] = STATE_VERSION
    atomic_write(path, json.dumps(data, sort_keys=True, separators=(",", ":")), mode=0o600)
