# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The small state file carried between runs (counters for rates, remembered severe events).

Written atomically (temp file in the same directory, fsync, os.replace). A missing, unreadable or corrupt
file is treated as "no previous run": rates start again, nothing fails.
"""
from __future__ import annotations

import json
import os
import time
from typing import Any, Dict

STATE_VERSION = 1


def load_state(path) -> Dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
        return {}
    return data


def atomic_write(path, text: str, mode: int = 0o644) -> None:
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def save_state(path, state: Dict[str, Any]) -> None:
    data = dict(state)
    data["version"] = STATE_VERSION
    atomic_write(path, json.dumps(data, sort_keys=True, separators=(",", ":")), mode=0o600)
