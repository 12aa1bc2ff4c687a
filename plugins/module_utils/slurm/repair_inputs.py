# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Slurm nodes -> the repair policy's typed inputs (``repair.state``): the adapter alone does this translation.

Which nodes need attention, which are hot spares and how partitions and failure domains count are the brain's rules
(``repair.fleet.build_inputs``); this module only turns what Slurm said about each node into a ``NodeState``, with
the repair history read once, at this edge, from the node's ``Extra`` or ``Comment`` field.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence

from ..repair.fleet import DOMAIN_PREFIXES, build_inputs, domains_of
from ..repair.state import FleetSummary, JobInfo, NodeState, history_fields
from ..slurmfacts import SPARE_REASON
from .errors import SlurmError
from .node import Node

HISTORY_FIELDS = ("extra", "comment")


def _time(v: Optional[float]) -> Optional[float]:
    return float(v) if v else None


def node_state(node: Node, *, history_field: str = "extra", partitions: Optional[Sequence[str]] = None,
               domains: Optional[Mapping[str, str]] = None, report: Optional[Mapping[str, Any]] = None,
               report_time: Optional[float] = None, report_error: Optional[str] = None) -> NodeState:
    """One node as the policy reads it. ``partitions`` defaults to the node's own; the history is parsed here."""
    if history_field not in HISTORY_FIELDS:
        raise ValueError(f"history_field must be extra or comment; got {history_field!r}")
    history, foreign, error = history_fields(getattr(node, history_field) or "")
    return NodeState(
        name=node.name,
        partitions=tuple(sorted(node.partitions if partitions is None else partitions)),
        domains={str(k): str(v) for k, v in (domains or {}).items()},
        state=node.state,
        flags=frozenset(node.flags),
        reason=node.reason or "",
        reason_user=node.reason_user or "",
        reason_time=_time(node.reason_time),
        report=report,
        report_time=_time(report_time),
        history=history,
        history_foreign=foreign,
        history_error=error,
        boot_time=_time(node.boot_time),
        report_error=str(report_error)[:300] if report_error else None,
    )


@dataclass
class RepairInputs:
    """What ``repair.plan()`` takes, and what a body reports: ``counts`` is the fleet summary as plain data."""

    fleet: FleetSummary
    nodes: List[NodeState]
    spares: List[str]
    counts: Dict[str, Any] = field(default_factory=dict)


def repair_inputs(nodes: Iterable[Node], reports: Optional[Mapping[str, Mapping[str, Any]]] = None,
                  report_times: Optional[Mapping[str, float]] = None, *, history_field: str = "extra",
                  spare_reason: str = SPARE_REASON, partitions: Optional[Iterable[str]] = None,
                  domain_prefixes: Optional[Mapping[str, str]] = None,
                  report_errors: Optional[Mapping[str, str]] = None) -> RepairInputs:
    """The policy's typed inputs for a fleet read from Slurm (one pass, through ``build_inputs``)."""
    by_name = {n.name: n for n in nodes}
    fleet, attention, spares = build_inputs(
        by_name.values(), reports, report_times, history_field=history_field, spare_reason=spare_reason,
        partitions=partitions, domain_prefixes=domain_prefixes, report_errors=report_errors)
    states = [node_state(by_name[rec["name"]], history_field=history_field, partitions=rec["partitions"],
                         domains=rec["domains"], report=rec["report"], report_time=rec["report_time"],
                         report_error=rec.get("report_error"))
              for rec in attention]
    return RepairInputs(fleet, states, spares, fleet.to_dict())


@dataclass
class DrainInputs:
    """What ``repair.drain.drain_decision`` takes besides the report: our node, the fleet as read, and the other
    nodes out of service (``before``, for the breaker)."""

    me: NodeState
    fleet: FleetSummary
    before: List[NodeState]


def drain_inputs(nodes: Iterable[Node], name: str, *, spare_reason: str = SPARE_REASON,
                 domain_prefixes: Optional[Mapping[str, str]] = None) -> DrainInputs:
    """The drain rule's typed inputs for node ``name`` from the Slurm nodes read just now (ours among them; the
    whole fleet when the limits matter, ours alone for a warning)."""
    by_name = {n.name: n for n in nodes}
    if name not in by_name:
        raise SlurmError(f"node {name!r} is not among the Slurm nodes read")
    fleet, _attention, _spares = build_inputs(by_name.values(), spare_reason=spare_reason,
                                              domain_prefixes=domain_prefixes)
    prefixes = DOMAIN_PREFIXES if domain_prefixes is None else domain_prefixes
    mine = by_name[name]
    me = node_state(mine, domains=domains_of(mine.features, prefixes))
    before = [node_state(n) for n in by_name.values() if n.name != name and n.out_of_service]
    return DrainInputs(me, fleet, before)


def read_jobs(states: Iterable[NodeState], node_jobs: Callable[[str, Sequence[str]], List[Dict[str, Any]]],
              prefix: str) -> Dict[str, str]:
    """Fill ``jobs`` of each node the job action may concern: drained by us (``prefix``) and busy, or with an
    eviction under way (its jobs are followed wherever they are). ``node_jobs`` is the client's
    ``node_jobs(node, job_ids)``. A node whose jobs cannot be read keeps ``jobs`` None (the policy then evicts
    nothing there); the returned mapping says why, per node."""
    errors: Dict[str, str] = {}
    for st in states:
        inc = st.history.incident if st.history is not None else None
        ev = inc.eviction if inc is not None and inc.eviction is not None and inc.eviction.done is None else None
        if not st.drained_by(prefix) or not (st.busy or ev is not None):
            continue
        try:
            rows = node_jobs(st.name, ev.jobs if ev is not None else ())
        except (SlurmError, ValueError) as exc:
            errors[st.name] = str(exc)[:300]
            continue
        st.jobs = tuple(JobInfo(r["job_id"], r["state"], r["requeue"], r["comment"], r["qos"], r["on_node"])
                        for r in rows)
    return errors
