# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node agent's drain rule: ``drain_decision(report, node, nodes, config, now) -> DrainDecision``.

One rule, used by every body that drains a node for a health report (the agent on the node; the simulator):

* A node that **cannot run jobs now** - the live probe finds a GPU lost or missing, a GPU that needs a reset
  before it works again, or no working driver (:func:`cannot_run_jobs`) - is drained at once. It counts against
  the limits (it is unavailable) but no limit stops it: keeping it in service only fails the next job. The
  decision says when the limits are already reached, and when the circuit breaker would trip (``breaker``).
* Any other report that asks for a drain (``unhealthy``, or ``drain: true``) is a **warning**: the node still runs
  jobs, so the agent does not drain it. The decision is ``defer``: the repair run drains it (``plan()``'s
  ``drain`` and ``drain_requested`` rules), one writer that sees the whole fleet, with the limits
  (``blast_radius``) and the circuit breaker. Agents on many nodes decide at the same moment, each from its own
  reading of Slurm; had each drained its own warning and taken it back when the limits said no, a storm would take
  most of the fleet out of service for seconds at every check. A warning never causes a transient drain.

Pure, stdlib only: ``nodes`` are duck-typed like ``fleet.build_inputs``'s (name, state, flags, reason,
reason_time, partitions, features), the report is the health report's dict (``Report.to_dict()``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Dict, Iterable, List, Optional

from ..slurmfacts import IN_MAINTENANCE, SPARE_REASON, in_maintenance
from .config import RepairConfig
from .fleet import _get, build_inputs, domains_of, out_of_service
from .limits import Limits, breaker_trips
from .model import RepairError
from .state import FleetSummary, NodeState

#: Finding codes of the live probe that mean the node cannot run GPU jobs now (when critical): a GPU lost or
#: missing, a GPU that needs a reset before it works again, no usable driver or NVML, NVML hanging run after run.
#: A kernel-log event (an Xid, even 79) whose GPU still answers the probe is a warning, not one of these.
CANNOT_RUN_CODES = (
    "gpu_lost",
    "gpu_missing",
    "gpu_reset_required",
    "reset_required",
    "driver_mismatch",
    "driver_not_loaded",
    "nvml_missing",
    "probe_timeout",
)
#: Decision actions.
DRAIN_ACTIONS = ("none", "drain", "defer", "already_drained", "left_alone")
#: What a deferred warning's decision says.
DEFERRED = ("a warning: the node still runs jobs, so its drain is the repair run's to decide (one writer, with "
            "the whole fleet, the limits and the circuit breaker in view)")


@dataclass(frozen=True)
class DrainDecision:
    """What to do with our own node.

    ``action``: ``none`` (the report does not ask for a drain), ``drain`` (drain it now: it cannot run jobs),
    ``defer`` (a warning: the repair run decides its drain), ``already_drained`` (drained by us before),
    ``left_alone`` (out of service by someone else).
    ``forced`` is True when the node cannot run jobs now. ``reason`` is the Slurm reason to drain with,
    ``detail`` says why in words, ``breaker`` carries the circuit breaker's message when it is tripped (to be
    shown loudly), ``rule`` names the rule that decided.
    """

    action: str
    forced: bool = False
    reason: Optional[str] = None
    detail: str = ""
    breaker: Optional[str] = None
    rule: str = "none"

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


def _findings(report: Mapping[str, Any]) -> List[Mapping[str, Any]]:
    raw = report.get("findings") or []
    if not isinstance(raw, list):
        raise RepairError(f"report.findings: expected a list of findings, got {type(raw).__name__}")
    out = []
    for i, f in enumerate(raw):
        if not isinstance(f, Mapping):
            raise RepairError(f"report.findings[{i}]: expected a mapping (check, severity, ...), got {f!r}")
        out.append(f)
    return out


def cannot_run_jobs(report: Any) -> bool:
    """True when the live probe says the node cannot run GPU jobs now (a critical finding in CANNOT_RUN_CODES)."""
    if hasattr(report, "to_dict"):
        report = report.to_dict()
    return any(f.get("severity") == "critical" and f.get("code") in CANNOT_RUN_CODES for f in _findings(report))


def wants_drain(report: Mapping[str, Any]) -> bool:
    """The report asks for the node out of service: verdict unhealthy, or a finding asks for a drain."""
    return report.get("verdict") == "unhealthy" or bool(report.get("drain"))


def _recent(node: Any, since: float) -> bool:
    """The node's reason was set at or after ``since`` (a node out of service without a time is not recent)."""
    t = _get(node, "reason_time")
    return not isinstance(t, bool) and isinstance(t, (int, float)) and bool(t) and t >= since


def drain_decision(
    report: Any,
    node: str,
    nodes: Iterable[Any],
    config: Any,
    now: float,
    *,
    reason: Optional[str] = None,
    spare_reason: str = SPARE_REASON,
) -> DrainDecision:
    """Decide whether the agent drains its own ``node`` for ``report`` (see the module docstring for the rule).

    ``nodes``: the Slurm nodes read just now, ours among them (the whole fleet when the node cannot run jobs, for
    the limits and the breaker the decision reports; ours alone is enough for a warning). ``config``: a
    RepairConfig or its dict. ``report``: the health Report, or its dict with ``reason`` (the Slurm reason to
    drain with; a Report gives its own ``drain_reason()``).
    """
    if hasattr(report, "drain_reason") and hasattr(report, "to_dict"):  # the health brain's Report
        reason = reason or report.drain_reason()[:200]
        report = report.to_dict()
    if not isinstance(report, Mapping):
        raise RepairError(f"report: expected the health report (Report or its dict), got {type(report).__name__}")
    if not isinstance(config, RepairConfig):
        config = RepairConfig.from_dict(config)
    if isinstance(now, bool) or not isinstance(now, (int, float)):
        raise RepairError(f"now: expected epoch seconds, got {now!r}")
    if not wants_drain(report):
        return DrainDecision("none", detail="the report does not ask for a drain")
    if not isinstance(reason, str) or not reason.startswith(config.reason_prefix):
        raise RepairError(f"reason: expected the drain reason, starting with {config.reason_prefix!r}, got {reason!r}")
    forced = cannot_run_jobs(report)
    nodes = list(nodes)
    me = next((n for n in nodes if str(_get(n, "name")) == node), None)
    if me is None:
        raise RepairError(f"node: {node!r} is not among the Slurm nodes given")
    current = str(_get(me, "reason") or "").strip()
    if in_maintenance(str(_get(me, "state") or ""), _get(me, "flags") or ()):
        return DrainDecision("left_alone", forced, None, IN_MAINTENANCE, rule="not_ours")
    if out_of_service(me):
        if current.startswith(config.reason_prefix):
            return DrainDecision("already_drained", forced, current, f"already drained by us: {current}",
                                 rule="already_drained")
        state = str(_get(me, "state") or "")
        return DrainDecision("left_alone", forced, None, f"out of service by someone else: {current or state}",
                             rule="not_ours")
    if not forced:
        return DrainDecision("defer", False, reason, DEFERRED, rule="one_writer")
    # The fleet as the limits see it: ours in service, every other node as it is.
    view: List[Any] = []
    before: List[Any] = []
    for n in nodes:
        if str(_get(n, "name")) == node:
            continue
        view.append(n)
        if out_of_service(n) and not (spare_reason and str(_get(n, "reason") or "").startswith(spare_reason)):
            before.append(n)
    parts = list(_get(me, "partitions") or ())
    view.append({"name": node, "state": "idle", "flags": (), "reason": "", "partitions": parts,
                 "features": list(_get(me, "features") or ())})
    fleet, _attention, _spares = build_inputs(view, spare_reason=spare_reason)
    rec = {"name": node, "partitions": parts, "state": "IDLE",
           "domains": domains_of(_get(me, "features") or (), {"rack": "rack", "switch": "switch"})}
    return drain_verdict(NodeState.from_dict(rec, 0), FleetSummary.from_dict(fleet), before, config, now,
                         forced=forced, reason=reason)


def drain_verdict(me: NodeState, fl: FleetSummary, before: Iterable[Any], config: RepairConfig, now: float, *,
                  forced: bool, reason: str) -> DrainDecision:
    """The last part of :func:`drain_decision`, for a caller that already has the fleet as the limits see it
    (``fl``: ours in service) and the nodes out of service (``before``, duck-typed: name, reason, reason_time),
    such as the simulator, which keeps its fleet as counts. ``forced``: the node cannot run jobs now
    (:func:`cannot_run_jobs`); ``reason``: the Slurm reason to drain with."""
    if not forced:
        return DrainDecision("defer", False, reason, DEFERRED, rule="one_writer")
    block = Limits(fl, config).drain_block(me)
    brk = None
    if config.breaker_enabled:
        since = now - config.breaker_window_s
        prefix = config.reason_prefix
        recent = [n for n in before if str(_get(n, "reason") or "").startswith(prefix) and _recent(n, since)]
        why = breaker_trips(config, fl.total, len(recent) + 1, "nodes drained by gpufleet")
        if why is not None:
            brk = (f"circuit breaker tripped: {why}; warning drains stop, nodes that cannot run jobs are still "
                   "drained; a person must look")
    detail = "cannot run jobs now: drained at once"
    if block:
        detail += f" (counts against the limits: {block})"
    return DrainDecision("drain", True, reason, detail, brk, rule="cannot_run_jobs")
