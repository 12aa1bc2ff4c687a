# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Kernel-log adapter: /dev/kmsg (non-blocking) or a captured file, with a cursor keyed on (boot_id, seq).

The kernel log is read in the agent's own process: it never blocks on a wedged GPU (unlike NVML), and it
carries the Xids that matter most when the GPU is gone (79, 119, 120) and every NVSwitch SXid.
"""
from __future__ import annotations

import errno
import os
from typing import Any, Dict, List, Optional, Tuple

from .health.kmsg_parse import parse_kmsg
from .health.model import KernelEvent

DEV_KMSG = "/dev/kmsg"
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
STAT_PATH = "/proc/stat"


def boot_id(path: str = BOOT_ID_PATH) -> Optional[str]:
    try:
        with open(path, encoding="ascii") as fh:
            return fh.read().strip() or None
    except OSError:
        return None


def boot_time(path: str = STAT_PATH) -> Optional[float]:
    """Epoch seconds of the boot (``btime`` in /proc/stat), to date records that carry seconds since boot."""
    try:
        with open(path, encoding="ascii") as fh:
            for line in fh:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def read_dev_kmsg(path: str = DEV_KMSG, cursor: Optional[Dict[str, Any]] = None, max_records: int = 200000
                  ) -> Tuple[List[str], Dict[str, Any]]:
    """Read every record after ``cursor`` from /dev/kmsg without blocking.

    Returns (records as ``pri,seq,usec,flags;message`` lines, new cursor ``{"boot_id", "seq"}``). The cursor
    only applies within the same boot; after a reboot the whole buffer is read again. Raises OSError if the
    device cannot be opened (needs root or CAP_SYSLOG when kernel.dmesg_restrict=1).
    """
    bid = boot_id()
    last = None
    if cursor and cursor.get("boot_id") == bid and isinstance(cursor.get("seq"), int):
        last = cursor["seq"]
    records: List[str] = []
    seq = last
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        for _unused in range(max_records):
            try:
                chunk = os.read(fd, 16384)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # records overwritten while we read: continue with the next one
                    continue
                if exc.errno == errno.EAGAIN:
                    break
                raise
            if not chunk:
                break
            line = chunk.decode("utf-8", "replace").split("\n", 1)[0]
            head = line.split(";", 1)[0].split(",")
            try:
                rec_seq = int(head[1])
            except (IndexError, ValueError):
                continue
            if last is not None and rec_seq <= last:
                continue
            seq = rec_seq
            records.append(line)
    finally:
        os.close(fd)
    return records, {"boot_id": bid, "seq": seq}


def read_kmsg_file(path: str, max_bytes: int = 64 * 1024 * 1024) -> str:
    """A captured kernel log (dmesg, journalctl -k, /dev/kmsg dump). Raises OSError / ValueError naming the path."""
    size = os.path.getsize(path)
    if size > max_bytes:
        raise ValueError(f"kmsg file {path}: {size} bytes, more than the {max_bytes} byte limit")
    with open(path, "rb") as fh:
        return fh.read().decode("utf-8", "replace")


def live_events(cursor: Optional[Dict[str, Any]] = None, path: str = DEV_KMSG
                ) -> Tuple[List[KernelEvent], Dict[str, Any]]:
    """Parsed GPU events from /dev/kmsg after the cursor, dated with the boot time."""
    records, new_cursor = read_dev_kmsg(path, cursor)
    return parse_kmsg(records, boot_id=new_cursor.get("boot_id"), boot_time=boot_time()), new_cursor
