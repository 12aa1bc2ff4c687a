# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node agent's drain rule: ``drain_decision(report, me, fleet, before, config, now) -> DrainDecision``.

The one entry point for every body that drains a node for a health report (the agent on the node, the simulator);
each only translates what it read into these typed inputs and carries out the decision:

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
* With no limits configured (``config`` None: the agent without ``--repair-config``) every report that asks for a
  drain drains, under the same ownership rule.

Ownership is the rule of ``slurmfacts`` (through ``NodeState.foreign`` / ``drained_by``): a node out of service
for someone else, or in a maintenance reservation, is left alone; a node we drained stays drained.

Pure, stdlib only. Inputs are typed: ``me`` and ``before`` are ``NodeState`` (``before``: the other nodes out of
service, hot spares among them or not), ``fleet`` the ``FleetSummary`` as read (the Slurm adapter's
``slurm.repair_inputs.drain_inputs`` builds all three); the report is the health ``Report`` or its dict.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Dict, Iterable, List, Optional, Tuple

from ..slurmfacts import IN_MAINTENANCE, REASON_PREFIX, SPARE_REASON
from .config import RepairConfig
from .limits import Limits, breaker_threshold, breaker_trips
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
    shown loudly), ``rule`` names the rule that decided. ``check_at`` (epoch seconds) is when the same inputs
    could read otherwise with time alone (the tripped breaker's oldest counted drain leaves its window); None
    when only a new report or a change in Slurm changes the answer (the agent checks again at its next run).
    """

    action: str
    forced: bool = False
    reason: Optional[str] = None
    detail: str = ""
    breaker: Optional[str] = None
    rule: str = "none"
    check_at: Optional[float] = None

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


def drain_decision(report: Any, me: NodeState, fleet: FleetSummary, before: Iterable[NodeState],
                   config: Optional[RepairConfig], now: float, *, reason: Optional[str] = None) -> DrainDecision:
    """Decide whether the agent drains its own node ``me`` for ``report`` (see the module docstring).

    ``fleet``: the fleet as read now (the limits' view; a warning needs only ours). ``before``: the other nodes out
    of service, read once and only for a node that cannot run jobs (the breaker counts those we drained within its
    window; hot spares never count). ``config``: the repair policy's RepairConfig, or None for no limits.
    ``reason``: the Slurm reason to drain with (a Report gives its own ``drain_reason()``); the decision's
    ``reason`` is the exact text to give Slurm.
    """
    if hasattr(report, "drain_reason") and hasattr(report, "to_dict"):  # the health brain's Report
        reason = reason or report.drain_reason()[:200]
        report = report.to_dict()
    if not isinstance(report, Mapping):
        raise RepairError(f"report: expected the health report (Report or its dict), got {type(report).__name__}")
    if config is not None and not isinstance(config, RepairConfig):
        raise RepairError(f"config: expected a RepairConfig or None (no limits), got {type(config).__name__}")
    if not isinstance(me, NodeState) or not isinstance(fleet, FleetSummary):
        raise RepairError("me, fleet: expected a NodeState and a FleetSummary (slurm.repair_inputs.drain_inputs)")
    if isinstance(now, bool) or not isinstance(now, (int, float)):
        raise RepairError(f"now: expected epoch seconds, got {now!r}")
    if not wants_drain(report):
        return DrainDecision("none", detail="the report does not ask for a drain")
    prefix = REASON_PREFIX if config is None else config.reason_prefix
    if not isinstance(reason, str) or not reason.startswith(prefix):
        raise RepairError(f"reason: expected the drain reason, starting with {prefix!r}, got {reason!r}")
    forced = cannot_run_jobs(report)
    why = me.foreign(prefix)
    if why is not None:
        detail = why if why == IN_MAINTENANCE else f"out of service by someone else: {me.reason or me.state}"
        return DrainDecision("left_alone", forced, None, detail, rule="not_ours")
    if me.out_of_service:
        return DrainDecision("already_drained", forced, me.reason, f"already drained by us: {me.reason}",
                             rule="already_drained")
    if config is None:
        return DrainDecision("drain", forced, reason, "no limits configured: drained whenever the report asks",
                             rule="no_limits")
    if not forced:
        return DrainDecision("defer", False, reason, DEFERRED, rule="one_writer")
    block = Limits(fleet, config).drain_block(me)
    brk, check_at = _breaker(before, fleet.total, config, now, me.name)
    detail = "cannot run jobs now: drained at once"
    if block:
        detail += f" (counts against the limits: {block})"
    return DrainDecision("drain", True, reason, detail, brk, rule="cannot_run_jobs", check_at=check_at)


def _breaker(before: Iterable[NodeState], total: int, config: RepairConfig, now: float,
             me: str) -> Tuple[Optional[str], Optional[float]]:
    """The breaker as the agent counts it (``limits.breaker_trips``): nodes drained by us within the window, ours
    included; (its message when tripped, when enough of those drains leave the window for it to clear)."""
    if not config.breaker_enabled:
        return None, None
    since = now - config.breaker_window_s
    times: List[float] = sorted(
        n.reason_time for n in before
        if n.name != me and n.reason_time is not None and n.reason_time >= since and n.drained_by(config.reason_prefix)
        and not n.reason.startswith(SPARE_REASON))
    why = breaker_trips(config, total, len(times) + 1, "nodes drained by gpufleet")
    if why is None:
        return None, None
    # count = k - j + 1 once the j oldest have left: below the threshold from the (k + 2 - threshold)-th on
    j = len(times) + 1 - breaker_threshold(config, total)
    check_at = times[j] + config.breaker_window_s if 0 <= j < len(times) else None
    return (f"circuit breaker tripped: {why}; warning drains stop, nodes that cannot run jobs are still drained; "
            "a person must look"), check_at
