# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node agent's drain rule: ``drain_decision(report, node, nodes, config, now) -> DrainDecision``.

One rule, used by every body that drains a node for a health report (the agent on the node; the simulator):

* A node that **cannot run jobs now** - the live probe finds a GPU lost or missing, a GPU that needs a reset
  before it works again, or no working driver (:func:`cannot_run_jobs`) - is drained at once. It counts against
  the limits (it is unavailable) but no limit stops it: keeping it in service only fails the next job.
* Any other report that asks for a drain (``unhealthy``, or ``drain: true``) is a **warning**: the node still runs
  jobs, so its drain goes through the repair policy's limits, the same ones ``plan()`` applies to its drains
  (``blast_radius``: max_unavailable, min_healthy, failure domains, never the last available node of a
  partition) and the circuit breaker (``breaker``: a warning is not drained when it would make ``threshold``
  nodes drained by us within the window; the decision says so in ``breaker``).

Agents on many nodes decide at the same moment, each from its own reading of Slurm, so the rule is written as if
they acted one at a time in a fixed order: by the time Slurm gives the drain (``reason_time``), then by node
name. A node is judged against the nodes out of service *before* it in that order only (``drained_at``); the
nodes after it are taken as in service. The agent drains first, waits until every drain that could come before
its own is visible (the second after its ``reason_time`` has passed), then decides again with ``drained_at``: a
warning drain that the rule refuses is taken back (only ours, only while the reason is still ours). So the
drains kept are never more than those of the agents acting one at a time in that order, whatever the timing,
and the first warning in that order always decides as it would alone; a warning that gave way to one that gave
way too drains at its next check. A decision without ``drained_at`` (before draining) sees everything that is
out of service as before it. Slurm's ``reason_time`` has whole seconds: waiting until the second after ours has
passed (plus the clock skew between the nodes and slurmctld) is what makes every earlier drain visible.

Pure, stdlib only: ``nodes`` are duck-typed like ``fleet.build_inputs``'s (name, state, flags, reason,
reason_time, partitions, features), the report is the health report's dict (``Report.to_dict()``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Dict, Iterable, List, Optional, Tuple

from .config import RepairConfig
from .fleet import _get, build_inputs, domains_of, out_of_service
from .limits import Limits, breaker_threshold
from .model import RepairError
from .owner import IN_MAINTENANCE, in_maintenance
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
DRAIN_ACTIONS = ("none", "drain", "hold", "already_drained", "left_alone")


@dataclass(frozen=True)
class DrainDecision:
    """What to do with our own node.

    ``action``: ``none`` (the report does not ask for a drain), ``drain`` (drain it, or keep our drain when
    ``drained_at`` was given), ``hold`` (a warning the limits refuse: do not drain, or take our drain back),
    ``already_drained`` (drained by us before), ``left_alone`` (out of service by someone else).
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


def _key(node: Any) -> Tuple[float, str]:
    t = _get(node, "reason_time")
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not t:
        return (float("-inf"), str(_get(node, "name")))  # out of service without a time: before everybody
    return (float(t), str(_get(node, "name")))


def _in_service_view(node: Any) -> Dict[str, Any]:
    """The node as the rule sees one that comes after ours in the order: in service."""
    return {
        "name": str(_get(node, "name")),
        "state": "idle",
        "flags": (),
        "reason": "",
        "partitions": list(_get(node, "partitions") or ()),
        "features": list(_get(node, "features") or ()),
    }


def drain_decision(
    report: Any,
    node: str,
    nodes: Iterable[Any],
    config: Any,
    now: float,
    *,
    drained_at: Optional[float] = None,
    reason: Optional[str] = None,
    spare_reason: str = "gpufleet: spare",
) -> DrainDecision:
    """Decide whether the agent drains its own ``node`` for ``report`` (see the module docstring for the rule).

    ``nodes``: every Slurm node (ours included), read just now. ``config``: a RepairConfig or its dict.
    ``report``: the health Report, or its dict with ``reason`` (the Slurm reason to drain with; a Report gives its
    own ``drain_reason()``). ``drained_at``: our drain's ``reason_time`` when deciding again after draining.
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
    ours_reason = reason
    nodes = list(nodes)
    me = next((n for n in nodes if str(_get(n, "name")) == node), None)
    if me is None:
        raise RepairError(f"node: {node!r} is not among the Slurm nodes given")
    current = str(_get(me, "reason") or "").strip()
    if in_maintenance(str(_get(me, "state") or ""), _get(me, "flags") or ()):
        return DrainDecision("left_alone", forced, None, IN_MAINTENANCE, rule="not_ours")
    if drained_at is None and out_of_service(me):
        if current.startswith(config.reason_prefix):
            return DrainDecision("already_drained", forced, current, f"already drained by us: {current}",
                                 rule="already_drained")
        state = str(_get(me, "state") or "")
        return DrainDecision("left_alone", forced, None, f"out of service by someone else: {current or state}",
                             rule="not_ours")
    if drained_at is not None and current != ours_reason:
        return DrainDecision("left_alone", forced, None,
                             f"our drain was replaced by someone else's: {current or _get(me, 'state')}",
                             rule="not_ours")

    # The fleet as the rule sees it at our turn: nodes out of service before us as they are, ours and every
    # node after us in service.
    mine = (float(drained_at), node) if drained_at is not None else None
    view: List[Any] = []
    before: List[Any] = []
    for n in nodes:
        name = str(_get(n, "name"))
        spare = bool(spare_reason) and str(_get(n, "reason") or "").startswith(spare_reason)
        if name == node or (mine is not None and not spare and out_of_service(n) and _key(n) >= mine):
            view.append(_in_service_view(n))
            continue
        view.append(n)
        if out_of_service(n) and not spare:
            before.append(n)
    fleet, _attention, _spares = build_inputs(view, spare_reason=spare_reason)
    parts = list(_get(me, "partitions") or ())
    rec = {"name": node, "partitions": parts, "state": "IDLE",
           "domains": domains_of(_get(me, "features") or (), {"rack": "rack", "switch": "switch"})}
    return drain_verdict(NodeState.from_dict(rec, 0), FleetSummary.from_dict(fleet), before, config, now,
                         forced=forced, reason=ours_reason)


def drain_verdict(me: NodeState, fl: FleetSummary, before: Iterable[Any], config: RepairConfig, now: float, *,
                  forced: bool, reason: str) -> DrainDecision:
    """The last part of :func:`drain_decision`, for a caller that already has the fleet as the rule sees it at
    our turn (``fl``: ours in service) and the nodes out of service before ours (``before``, duck-typed: name,
    reason, reason_time), such as the simulator, which keeps its fleet as counts. ``forced``: the node cannot run
    jobs now (:func:`cannot_run_jobs`); ``reason``: the Slurm reason to drain with."""
    ours_reason = reason
    block = Limits(fl, config).drain_block(me)

    brk = None
    if config.breaker_enabled:
        since = now - config.breaker_window_s
        prefix = config.reason_prefix
        recent = [n for n in before if str(_get(n, "reason") or "").startswith(prefix) and _key(n)[0] >= since]
        threshold = breaker_threshold(config, fl.total)
        if len(recent) + 1 >= threshold:
            brk = (
                f"circuit breaker tripped: {len(recent) + 1} nodes drained by gpufleet within "
                f"{config.breaker_window_s:g}s (threshold {threshold} of {fl.total}); warning drains stop, "
                "nodes that cannot run jobs are still drained; a person must look"
            )

    if forced:
        detail = "cannot run jobs now: drained at once"
        if block:
            detail += f" (counts against the limits: {block})"
        return DrainDecision("drain", True, ours_reason, detail, brk, rule="cannot_run_jobs")
    if brk:
        return DrainDecision("hold", False, ours_reason, f"warning not drained: {brk}", brk, rule="breaker")
    if block:
        return DrainDecision("hold", False, ours_reason, f"warning not drained: {block}", rule="blast_radius")
    return DrainDecision("drain", False, ours_reason, "warning within the repair policy's limits", rule="limits")
