"""The seam between the simulator and the collection's brain.

Nothing here models a health rule or a repair rule. Symptoms (synthetic kernel-log lines of a fault class) go
through ``plugins/module_utils/health.judge`` and the node's virtual Slurm record goes through
``plugins/module_utils/repair.plan`` — the very functions the Ansible modules and the node agent run. The adapter
only translates: simulated time <-> epoch seconds, the engine's node record <-> the Slurm-shaped ``attention``
record (state, reason, report, compact history text), the fleet's counts <-> ``fleet``.

judge() results are cached per symptom pattern: a fault class always emits the same lines, so the verdict is the
same, and the cache keeps 100,000-GPU runs fast.
"""

from __future__ import annotations

from typing import Any

from ansible_collections.gpufleet.reliability.plugins.module_utils import health as _health
from ansible_collections.gpufleet.reliability.plugins.module_utils import repair as _repair

EPOCH0 = 1_767_571_200.0  # Monday 2026-01-05 00:00 UTC: simulated hour 0
PARTITION = "gpu"


class CollectionBrain:
    def __init__(self, health_config: dict | None = None, repair_config: dict | None = None,
                 mode: str = "automatic"):
        self.health_config = dict(health_config or {})
        cfg = dict(repair_config or {})
        if mode == "approval":
            modes = dict(cfg.get("modes") or {})
            modes["default"] = "approval"
            cfg["modes"] = modes
        self.repair_config = _repair.RepairConfig.from_dict(cfg)
        self._judged: dict[tuple, dict] = {}
        self.calls = {"judge": 0, "judge_cached": 0, "plan": 0}
        self._healthy = None

    # --- health rules --------------------------------------------------------------------------------------------
    def judge(self, lines: tuple) -> dict:
        """The real rules' verdict on a node showing these kernel-log lines (cached per pattern)."""
        hit = self._judged.get(lines)
        if hit is not None:
            self.calls["judge_cached"] += 1
            return hit
        self.calls["judge"] += 1
        rep = _health.judge(snapshot=None, kmsg_lines=list(lines), config=self.health_config or None, state=None,
                            now=EPOCH0).to_dict()
        out = {"verdict": rep.get("verdict"), "action": rep.get("action"), "code": rep.get("code"),
               "gpu": rep.get("gpu"), "report": rep}
        self._judged[lines] = out
        return out

    def healthy_report(self) -> dict:
        if self._healthy is None:
            self._healthy = self.judge(())
        return self._healthy

    # --- repair policy -------------------------------------------------------------------------------------------
    def plan_node(self, record: dict, fleet: dict, now_h: float, approvals=(), breaker=None) -> Any:
        """One Decision for one node (the fleet comes in as counts, as in a real repair run)."""
        self.calls["plan"] += 1
        p = _repair.plan(fleet, [record], self.repair_config, to_epoch(now_h), approvals=approvals,
                         breaker=breaker)
        return p[0]


def to_epoch(h: float) -> float:
    return EPOCH0 + h * 3600.0


def to_hours(epoch: float) -> float:
    return (epoch - EPOCH0) / 3600.0


def default_brain(sc: dict, mode: str = "automatic") -> CollectionBrain:
    return CollectionBrain(sc.get("health_config"), sc.get("repair_config"), mode=mode)
