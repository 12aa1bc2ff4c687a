# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Turn a list of Slurm nodes (+ the latest health reports) into the policy's inputs.

``build_inputs`` is the one pass over the whole fleet (O(nodes)); it keeps counts per partition and
failure domain and a record only for the nodes that need attention, which is what ``plan`` takes.

A node is duck-typed: any object (or dict) with name, state (``idle``/``mixed``/``allocated``/``down``/...),
flags (iterable), reason, reason_user, reason_time, partitions, features, comment, extra - the fields of
``module_utils.slurm.Node``.

Hot spares are nodes of a partition kept drained with a reason that starts with ``spare_reason``
(``gpufleet: spare``); bringing one in is a resume. Spares are left out of the counts.
Failure domains come from node features: ``rack_r12`` or ``rack=r12`` means rack r12 (the prefixes are
configurable).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Dict, Iterable, List, Optional, Tuple

from ..slurmfacts import SPARE_REASON
from ..slurmfacts import busy as _busy
from ..slurmfacts import out_of_service as _out_of_service
from .history import HistoryError, is_ours, loads
from .state import Counts, FleetSummary

#: Node feature prefixes that name a failure domain (``rack_r12`` or ``rack=r12``: rack r12).
DOMAIN_PREFIXES: Mapping[str, str] = {"rack": "rack", "switch": "switch"}


def _get(node: Any, key: str, default: Any = None) -> Any:
    if node.__class__ is dict or isinstance(node, Mapping):  # a dict first: an ABC check is slow
        return node.get(key, default)
    return getattr(node, key, default)


def _flags(node: Any) -> Tuple[str, ...]:
    return tuple(sorted(str(f).upper() for f in (_get(node, "flags") or ())))


def out_of_service(node: Any) -> bool:
    return _out_of_service(str(_get(node, "state") or ""), _flags(node))


def domains_of(features: Iterable[str], prefixes: Mapping[str, str]) -> Dict[str, str]:
    out: Dict[str, str] = {}
    for f in features or ():
        f = str(f)
        for kind, prefix in prefixes.items():
            for sep in ("_", "="):
                if f.startswith(prefix + sep) and len(f) > len(prefix) + 1:
                    out.setdefault(kind, f[len(prefix) + 1 :])
    return out


def _history_text(node: Any, field: str) -> str:
    return str(_get(node, field) or "")


def _needs_attention(node: Any, report: Optional[Mapping[str, Any]], history_text: str) -> bool:
    if out_of_service(node):
        return True
    if report is not None and report.get("verdict") not in (None, "healthy"):
        return True
    if history_text and is_ours(history_text):
        try:
            return loads(history_text).incident is not None
        except HistoryError:
            return False
    return False


def build_inputs(
    nodes: Iterable[Any],
    reports: Optional[Mapping[str, Mapping[str, Any]]] = None,
    report_times: Optional[Mapping[str, float]] = None,
    *,
    history_field: str = "extra",
    spare_reason: str = SPARE_REASON,
    partitions: Optional[Iterable[str]] = None,
    domain_prefixes: Optional[Mapping[str, str]] = None,
    report_errors: Optional[Mapping[str, str]] = None,
) -> Tuple[FleetSummary, List[Dict[str, Any]], List[str]]:
    """Returns (the fleet summary, typed; attention records; spare names).

    ``report_errors``: node name -> why its report could not be read (a truncated file); such a node needs
    attention and its record carries ``report_error`` (the policy holds it, naming the problem)."""
    reports = reports or {}
    report_errors = report_errors or {}
    report_times = report_times or {}
    domain_prefixes = dict(DOMAIN_PREFIXES if domain_prefixes is None else domain_prefixes)
    wanted = set(partitions) if partitions else None
    parts: Dict[str, Dict[str, Any]] = {}
    doms: Dict[str, Dict[str, Dict[str, int]]] = {}
    attention: List[Dict[str, Any]] = []
    spares: List[str] = []
    total = 0
    for node in nodes:
        name = str(_get(node, "name"))
        node_parts = [p for p in (_get(node, "partitions") or ()) if wanted is None or p in wanted]
        if not node_parts:
            continue
        reason = str(_get(node, "reason") or "")
        flags = _flags(node)
        state = str(_get(node, "state") or "unknown").lower()
        busy = _busy(state, flags)
        if spare_reason and reason.startswith(spare_reason) and "DRAIN" in flags:
            spares.append(name)
            for p in node_parts:
                entry = parts.setdefault(p, {"total": 0, "available": 0, "unavailable": 0, "spares_idle": []})
                if not busy and state != "down":
                    entry["spares_idle"].append(name)
            continue
        total += 1
        available = not out_of_service(node)
        for p in node_parts:
            entry = parts.setdefault(p, {"total": 0, "available": 0, "unavailable": 0, "spares_idle": []})
            entry["total"] += 1
            entry["available" if available else "unavailable"] += 1
        node_domains = domains_of(_get(node, "features") or (), domain_prefixes)
        for kind, dom in node_domains.items():
            entry = doms.setdefault(kind, {}).setdefault(dom, {"total": 0, "available": 0, "unavailable": 0})
            entry["total"] += 1
            entry["available" if available else "unavailable"] += 1
        report = reports.get(name)
        history_text = _history_text(node, history_field)
        if name in report_errors or _needs_attention(node, report, history_text):
            attention.append(
                {
                    "name": name,
                    "partitions": sorted(node_parts),
                    "domains": node_domains,
                    "report": report,
                    "report_time": report_times.get(name),
                    "state": state.upper(),
                    "flags": list(flags),
                    "reason": reason,
                    "reason_user": str(_get(node, "reason_user") or ""),
                    "reason_time": _get(node, "reason_time"),
                    "history": history_text,
                    "boot_time": _get(node, "boot_time"),
                }
            )
            if name in report_errors:
                attention[-1]["report_error"] = str(report_errors[name])
    fleet = FleetSummary(
        total,
        {p: Counts(e["total"], e["available"], e["unavailable"], sorted(e["spares_idle"])) for p, e in parts.items()},
        {kind: {d: Counts(e["total"], e["available"], e["unavailable"]) for d, e in members.items()}
         for kind, members in doms.items()})
    return fleet, attention, spares
