# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The machine's processes by command line: how a lab test finds what a run it killed left behind, and only that.

Two Slurm lanes (and pytest-xdist workers) run the same lab tests at once on one machine, so a test that kills
"every ``AnsiballZ_job_evict``" kills the other lane's eviction in flight too. Match on the run's own paths as well
(its var file, its Ansible temporary directory)."""
from __future__ import annotations

import os


def processes_with(*args: bytes) -> list:
    """PIDs whose command line holds every one of ``args`` (at least one)."""
    if not args:
        raise ValueError("processes_with: give at least one part of the command line to match")
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/cmdline", "rb") as fh:
                    line = fh.read()
            except OSError:
                continue
            if all(a in line for a in args):
                out.append(int(d))
    return out
