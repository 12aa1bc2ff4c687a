"""The seam between the simulator and the collection's brain.

Nothing here models a health rule or a repair rule. Symptoms (synthetic kernel-log lines of a fault class) go
through ``plugins/module_utils/health.judge`` and the node's virtual Slurm record goes through
``plugins/module_utils/repair.plan`` — the very functions the Ansible modules and the node agent run. The engine
keeps each node's record as the repair policy's typed input (``repair.NodeState``: state, reason, report, the
repair history as a ``History`` object) and builds the fleet's counts as a ``repair.FleetSummary``, the way the Slurm
adapter does for the Ansible bodies; this adapter only translates simulated time <-> epoch seconds.

judge() results are cached per symptom pattern: a fault class always emits the same lines, so the verdict is the
same (a health report, not a repair decision). Every repair decision is a real plan() call, and every drain the
node agent would make on a health report is a real ``repair.drain.drain_decision`` call (``drain_rule``): the
agent's one drain rule, with the repair policy's limits and circuit breaker.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, Optional, Sequence, Tuple

from ansible_collections.gpufleet.reliability.plugins.module_utils import health as _health
from ansible_collections.gpufleet.reliability.plugins.module_utils import repair as _repair
from ansible_collections.gpufleet.reliability.plugins.module_utils.repair.drain import DrainDecision, drain_decision

EPOCH0 = 1_767_571_200  # Monday 2026-01-05 00:00 UTC: simulated hour 0
PARTITION = "gpu"
GRID_S = 60  # times reach the brain on a one-minute grid, as a repair run would see them


class CollectionBrain:
    def __init__(self, health_config: Optional[dict] = None, repair_config: Optional[dict] = None,
                 mode: str = "automatic"):
        self.health_config = dict(health_config or {})
        cfg = dict(repair_config or {})
        if mode == "approval":
            modes = dict(cfg.get("modes") or {})
            modes["default"] = "approval"
            cfg["modes"] = modes
        self.repair_config = _repair.RepairConfig.from_dict(cfg)
        self._judged: Dict[Tuple[str, ...], dict] = {}
        self.calls = {"judge": 0, "judge_cached": 0, "plan": 0, "drain_rule": 0}
        self._healthy: Optional[dict] = None

    # --- health rules --------------------------------------------------------------------------------------------
    def judge(self, lines: Tuple[str, ...]) -> dict:
        """The real rules' verdict on a node showing these kernel-log lines (cached per pattern)."""
        hit = self._judged.get(lines)
        if hit is not None:
            self.calls["judge_cached"] += 1
            return hit
        self.calls["judge"] += 1
        obj = _health.judge(snapshot=None, kmsg_lines=list(lines), config=self.health_config or None, state=None,
                            now=EPOCH0)
        rep = obj.to_dict()
        out = {"verdict": rep.get("verdict"), "action": rep.get("action"), "code": rep.get("code"),
               "gpu": rep.get("gpu"), "report": rep, "drain_reason": obj.drain_reason()[:200]}
        self._judged[lines] = out
        return out

    def healthy_report(self) -> dict:
        if self._healthy is None:
            self._healthy = self.judge(())
        return self._healthy

    # --- repair policy -------------------------------------------------------------------------------------------
    def plan_run(self, nodes: Sequence[_repair.NodeState], fleet: _repair.FleetSummary, now_h: float,
                 approvals: Iterable[Tuple[str, str, str]] = (), breaker: Any = None) -> _repair.Plan:
        """One repair run: the real plan() on every node that needs attention at ``now_h``, together (so the
        circuit breaker and the blast-radius limits see them all, as in a run of the repair playbook)."""
        self.calls["plan"] += 1
        return _repair.plan(fleet, nodes, self.repair_config, to_epoch(now_h), approvals=approvals, breaker=breaker)

    # --- the node agent's drain rule ----------------------------------------------------------------------------
    def drain_rule(self, verdict: dict, me: _repair.NodeState, fleet: _repair.FleetSummary,
                   before: Iterable[_repair.NodeState], now_h: float) -> DrainDecision:
        """What the node agent does with its own node ``me`` on this judge() result: the shipped rule
        (``repair.drain.drain_decision``, as ``gpufleet-health check --repair-config`` calls it) on the inputs the
        Slurm adapter would build: the fleet as read (``fleet``, counts) and the nodes out of service (``before``:
        their Slurm records), so a 100,000-GPU fleet is not read node by node."""
        self.calls["drain_rule"] += 1
        return drain_decision(verdict["report"], me, fleet, before, self.repair_config, to_epoch(now_h),
                              reason=verdict["drain_reason"])


def to_epoch(h: float) -> int:
    """Simulated hours -> epoch seconds on the brain's one-minute grid."""
    return EPOCH0 + round(h * 60.0) * GRID_S  # round() of a float is an int


def to_hours(epoch: float) -> float:
    return (epoch - EPOCH0) / 3600.0


def default_brain(sc: dict, mode: str = "automatic", cls: type = CollectionBrain,
                  jobs_action: Optional[str] = None) -> CollectionBrain:
    """The brain of scenario ``sc``; ``cls`` a subclass for a harness that watches or replaces its repair runs
    (tests, benchmarks); ``jobs_action`` the policy's ``jobs.action`` (over the scenario's repair_config)."""
    cfg = dict(sc.get("repair_config") or {})
    if jobs_action is not None:
        cfg["jobs"] = dict(cfg.get("jobs") or {}, action=jobs_action)
    return cls(sc.get("health_config"), cfg, mode=mode)
