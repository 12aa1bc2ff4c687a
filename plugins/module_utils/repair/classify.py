# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Failure class of a health report (the health brain's dict), by table.

The report looks like ``{"verdict", "action", "code", "gpu", "findings": [{"check", "severity", "gpu",
"detail", "evidence", "action", "code"}], "summary"}``. The class comes from the report's top code,
else from the most severe finding's code and check. Lookup is by exact code, then by the longest
matching prefix, first in the config's ``class_map`` and then in the table below.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Dict, Optional, Tuple

from .model import REPAIR_STEPS, VERDICTS, RepairError

# Xid numbers by class (NVIDIA Xid catalog r590 and the research notes, gpu-health.md section 3);
# any other Xid is the generic class "gpu" (reset, reboot, replace).
_XID_CLASS = {
    48: "gpu_memory",
    63: "gpu_memory",
    64: "gpu_memory",
    92: "gpu_memory",
    94: "gpu_memory",
    95: "gpu_memory",
    140: "gpu_memory",
    156: "gpu_memory",
    168: "gpu_memory",
    79: "gpu_lost",
    74: "nvlink",
    136: "nvlink",
    137: "nvlink",
    144: "nvlink",
    145: "nvlink",
    146: "nvlink",
    147: "nvlink",
    148: "nvlink",
    149: "nvlink",
    150: "nvlink",
    155: "nvlink",
    54: "thermal",
    13: "software",
    31: "software",
    43: "software",
    45: "software",
    69: "software",
    151: "software",
}

# Code / check prefixes (lower case) by class. Longest prefix wins.
PREFIX_CLASS: Dict[str, str] = {
    "ecc": "gpu_memory",
    "dbe": "gpu_memory",
    "sbe": "gpu_memory",
    "row_remap": "gpu_memory",
    "remap": "gpu_memory",
    "retired_page": "gpu_memory",
    "page_retire": "gpu_memory",
    "sram": "gpu_memory",
    "gpu_lost": "gpu_lost",
    "fallen_off": "gpu_lost",
    "off_bus": "gpu_lost",
    "gpu_count": "gpu_lost",
    "gpu_missing": "gpu_lost",
    "pci": "gpu_lost",
    "pcie": "nvlink",
    "nvlink": "nvlink",
    "fabric": "nvlink",
    "nvswitch": "nvlink",
    "sxid": "nvlink",
    "imex": "nvlink",
    "thermal": "thermal",
    "temp": "thermal",
    "power": "thermal",
    "clock": "thermal",
    "throttl": "thermal",
    "hw_slowdown": "thermal",
    "driver": "software",
    "version": "software",
    "persistence": "software",
    "software": "software",
    "cuda": "software",
    "config": "software",
    "lib_rm": "software",
    "nvml_missing": "software",
    "inforom": "gpu",
    "ib": "other",
    "mount": "other",
    "disk": "other",
    "probe": "probe",
    "timeout": "probe",
    "hang": "probe",
    "nvml": "probe",
    "unknown": "probe",
    "recovery": "gpu",
    "gsp": "gpu",
    "reset_required": "gpu",
    "xid": "gpu",
}

_XID_RE = re.compile(r"^xid[_-]?(\d+)", re.ASCII)
_SEVERITY_RANK = {
    "critical": 4,
    "fatal": 4,
    "fail": 3,
    "failed": 3,
    "error": 3,
    "unhealthy": 3,
    "warn": 2,
    "warning": 2,
    "degraded": 2,
    "unknown": 2,
    "info": 1,
    "ok": 0,
    "pass": 0,
}


def _longest_first(table: Mapping[str, str]) -> Tuple[str, ...]:
    return tuple(sorted(table, key=len, reverse=True))


_PREFIXES_LONGEST_FIRST = _longest_first(PREFIX_CLASS)
#: _XID_CLASS by the key a report gives (``xid79``): what _XID_RE's match of that key looks up
_XID_KEYS = {f"xid{n}": c for n, c in _XID_CLASS.items()}


def _lookup(key: str, class_map: Mapping[str, str]) -> Optional[str]:
    key = key.lower().strip()
    if not key:
        return None
    if key in class_map:
        return class_map[key]
    if key in PREFIX_CLASS:
        return PREFIX_CLASS[key]
    # config prefixes first (longest first), then xid numbers, then the built-in prefixes
    if class_map:
        for k in _longest_first(class_map):
            if key.startswith(k):
                return class_map[k]
    found = _XID_KEYS.get(key)  # the catalog's Xids as reports spell them (xid79), before the general pattern
    if found is not None:
        return found
    m = _XID_RE.match(key)
    if m:
        return _XID_CLASS.get(int(m.group(1)), "gpu")
    for k in _PREFIXES_LONGEST_FIRST:
        if key.startswith(k):
            return PREFIX_CLASS[k]
    return None


def top_finding(report: Mapping[str, Any]) -> Optional[Mapping[str, Any]]:
    findings = report.get("findings") or []
    best = None
    best_rank = -1
    for f in findings:
        if not isinstance(f, Mapping):
            continue
        rank = _SEVERITY_RANK.get(str(f.get("severity", "")).lower(), 1)
        if rank > best_rank:
            best, best_rank = f, rank
    return best


def classify(report: Optional[Mapping[str, Any]], class_map: Optional[Mapping[str, str]] = None) -> str:
    """Failure class of a report: one of FAILURE_CLASSES."""
    if not report:
        return "probe"
    class_map = class_map or _NO_MAP
    found = _lookup(str(report.get("code") or ""), class_map)
    if found:
        return found
    f = top_finding(report)
    if f is not None:
        found = _lookup(str(f.get("code") or ""), class_map) or _lookup(str(f.get("check") or ""), class_map)
        if found:
            return found
    if report.get("verdict") == "unknown":
        return "probe"
    return "other"


_NO_MAP: Mapping[str, str] = {}
#: The finding code of a node that has no health report.
NO_REPORT = "no_report"
_ACTIONS_OF_REPORTS = ("none", "monitor") + REPAIR_STEPS  # a tuple: an unhashable action must fail as a RepairError


def check_report(report: Any, where: str) -> Tuple[str, str, str, Optional[int]]:
    """Validate a report dict; returns (verdict, action, code, gpu). ``where`` names the report in errors."""
    if report is None:
        return "unknown", "none", NO_REPORT, None
    if report.__class__ is not dict and not isinstance(report, Mapping):  # a dict skips the ABC check
        raise RepairError(
            f"{where}: expected a health report mapping (verdict, action, code, ...), got {type(report).__name__}"
        )
    verdict = report.get("verdict")
    if verdict not in VERDICTS:
        raise RepairError("{}.verdict: expected one of {}, got {!r}".format(where, ", ".join(VERDICTS), verdict))
    action = report.get("action") or "none"
    if action not in _ACTIONS_OF_REPORTS:
        raise RepairError(
            "{}.action: expected one of none, monitor, {}, got {!r}".format(where, ", ".join(REPAIR_STEPS), action)
        )
    code = report.get("code")
    if not code:
        f = top_finding(report)
        code = (f.get("code") or f.get("check")) if f is not None else None
    code = str(code or verdict)
    gpu = report.get("gpu")
    if gpu is not None and (isinstance(gpu, bool) or not isinstance(gpu, int)):
        gpu = None
    return verdict, action, code, gpu
