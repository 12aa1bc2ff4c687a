# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The health check's state file, carried between runs (counters for rates, remembered severe events, the agent's
kernel-log cursor and metrics counters). An adapter: the health brain is given the state as a mapping and returns
the next one (``Report.state``); the bodies (the node agent, the gpu_health module) read and write the file here.

Written atomically (temp file in the same directory, fsync, os.replace), its directory made on first use. A
missing, unreadable or corrupt file is treated as "no previous run": rates start again, nothing fails.
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, Union

from .fileutil import atomic_write as _atomic_write

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
    """fileutil.atomic_write, creating the directory on first use (state, report and textfile of the agent)."""
    _atomic_write(path, text, mode, makedirs=True)


def save_state(path: Union[str, os.PathLike[str]], state: Dict[str, Any]) -> None:
    data = dict(state)
    data["version"] = STATE_VERSION
    atomic_write(path, json.dumps(data, sort_keys=True, separators=(",", ":")), mode=0o600)
