# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Node-level telemetry for the health snapshot: IB/RoCE ports (sysfs), mounts, disk space, host memory.

Cheap reads only (no command runs, nothing that can hang on a wedged GPU). Every path is a parameter so tests
can point it at a captured tree.
"""
from __future__ import annotations

import os
from typing import Dict, Iterable, List, Optional, Tuple

from .health.model import Disk, IbPort, Mount, Snapshot


def _read(path: str) -> Optional[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read().strip()
    except OSError:
        return None


def ib_ports(root: str = "/sys/class/infiniband") -> Optional[List[IbPort]]:
    """Ports of every HCA (``mlx5_0/1``): state (``4: ACTIVE`` -> ``ACTIVE``), physical state, rate, link layer.

    None when the node has no InfiniBand/RoCE devices (the check is then skipped)."""
    try:
        hcas = sorted(os.listdir(root))
    except OSError:
        return None
    ports: List[IbPort] = []
    for hca in hcas:
        pdir = os.path.join(root, hca, "ports")
        try:
            names = sorted(os.listdir(pdir), key=lambda n: (len(n), n))
        except OSError:
            continue
        for port in names:
            base = os.path.join(pdir, port)
            state = _read(os.path.join(base, "state"))
            phys = _read(os.path.join(base, "phys_state"))
            rate = _read(os.path.join(base, "rate"))  # "400 Gb/sec (4X NDR)"
            rate_gbps = None
            if rate:
                try:
                    rate_gbps = float(rate.split()[0])
                except (ValueError, IndexError):
                    rate_gbps = None
            ports.append(IbPort(name=f"{hca}/{port}", state=state.split(":", 1)[-1].strip() if state else None,
                                phys_state=phys.split(":", 1)[-1].strip() if phys else None, rate_gbps=rate_gbps,
                                link_layer=_read(os.path.join(base, "link_layer"))))
    return ports


def mounts(proc_mounts: str = "/proc/mounts") -> Optional[List[Mount]]:
    text = _read(proc_mounts)
    if text is None:
        return None
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 4:
            path = parts[1].replace("\\040", " ")
            out.append(Mount(path=path, present=True, fstype=parts[2], read_only="ro" in parts[3].split(",")))
    return out


def disks(paths: Iterable[str]) -> List[Disk]:
    out = []
    for p in paths:
        try:
            st = os.statvfs(p)
        except OSError:
            continue
        out.append(Disk(path=p, total_bytes=st.f_blocks * st.f_frsize, free_bytes=st.f_bavail * st.f_frsize))
    return out


def memory(meminfo: str = "/proc/meminfo") -> Tuple[Optional[int], Optional[int]]:
    """(total, available) bytes from /proc/meminfo, or (None, None)."""
    text = _read(meminfo)
    vals: Dict[str, int] = {}
    for line in (text or "").splitlines():
        key, _sep, rest = line.partition(":")
        try:
            vals[key] = int(rest.split()[0]) * 1024
        except (ValueError, IndexError):
            continue
    return vals.get("MemTotal"), vals.get("MemAvailable")


def fill(snap: Snapshot, disk_paths: Iterable[str] = ("/", "/tmp"), ib_root: str = "/sys/class/infiniband",
         proc_mounts: str = "/proc/mounts", meminfo: str = "/proc/meminfo") -> Snapshot:
    """Add the node-level fields to a snapshot (those already set are kept)."""
    if snap.ib_ports is None:
        snap.ib_ports = ib_ports(ib_root)
    if snap.mounts is None:
        snap.mounts = mounts(proc_mounts)
    if snap.disks is None:
        snap.disks = disks(disk_paths)
    if snap.memory_total_bytes is None:
        snap.memory_total_bytes, snap.memory_available_bytes = memory(meminfo)
    if snap.boot_id is None:
        snap.boot_id = _read("/proc/sys/kernel/random/boot_id")
    return snap
