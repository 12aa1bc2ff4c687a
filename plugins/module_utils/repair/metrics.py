# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Prometheus text for one repair run (``gpufleet_repair.prom``), for node_exporter's textfile collector: the
plan's decisions by action, steps waiting for approval, escalations, the breaker, the steps run and their outcome.
Pure: the bodies (``repair_publish``, the ``repair_prometheus`` filter) write the file."""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple

from ..promtext import Writer

REPAIR_PROM_FILE = "gpufleet_repair.prom"


def _rows(value: Any) -> List[Mapping[str, Any]]:
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, (list, tuple)) else []


def repair_text(plan: Any, breaker: Any = None, results: Any = None, now: Optional[float] = None) -> str:
    """Prometheus text for one repair run (``gpufleet_repair.prom``): the plan ``repair_plan`` returned (its
    ``decisions``), the breaker state, and the step results (``node``, ``action``, ``failed``).

    Anything that is not the expected shape counts as absent: a broken plan gives a file with the run's time only.
    """
    plan = plan if isinstance(plan, Mapping) else {}
    decisions = _rows(plan.get("decisions"))
    results = _rows(results)
    w = Writer()
    if now is not None:
        w.metric("gpufleet_repair_last_run_timestamp_seconds", "When the repair run planned (Unix time).", "gauge",
                 [({}, float(now))])
    if isinstance(breaker, Mapping):
        w.metric("gpufleet_repair_breaker_open", "1 while the repair circuit breaker is tripped (automatic repair "
                 "holds fleet-wide until a person resets it).", "gauge", [({}, int(bool(breaker.get("tripped"))))])
    by_action: Dict[str, int] = {}
    for d in decisions:
        by_action[str(d.get("action"))] = by_action.get(str(d.get("action")), 0) + 1
    w.metric("gpufleet_repair_decisions", "Decisions of the last repair plan by action.", "gauge",
             [({"action": a}, c) for a, c in sorted(by_action.items())], always=True)
    w.metric("gpufleet_repair_pending_approval", "1 for a step that waits for a person's approval.", "gauge",
             [({"node": d.get("node"), "action": d.get("action")}, 1) for d in decisions
              if d.get("needs_approval") and not d.get("approved")], always=True)
    w.metric("gpufleet_repair_escalated", "1 for a node whose repair is escalated to a person.", "gauge",
             [({"node": d.get("node")}, 1) for d in decisions
              if d.get("action") == "escalate" or d.get("rule") == "escalated"], always=True)
    steps: Dict[Tuple[str, str], int] = {}
    for r in results:
        key = (str(r.get("action")), "failed" if r.get("failed") else "ok")
        steps[key] = steps.get(key, 0) + 1
    w.metric("gpufleet_repair_steps", "Steps the last repair run executed, by action and outcome.", "gauge",
             [({"action": a, "outcome": o}, c) for (a, o), c in sorted(steps.items())], always=True)
    w.metric("gpufleet_repair_step_failed", "1 for a step that failed in the last repair run.", "gauge",
             [({"node": r.get("node"), "action": r.get("action")}, 1) for r in results if r.get("failed")],
             always=True)
    return w.text()
