# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Repair policy (the brain's second half): pure Python, stdlib only, no I/O.

    from .repair import plan, RepairConfig
    decisions = plan(fleet, attention, RepairConfig.from_dict(cfg), now)

See policy.py for the rules, history.py for the compact history stored in Slurm, docs/repair.md for
the reasoning and the defaults' sources.
"""

from __future__ import annotations

from .classify import classify
from .config import DEFAULT_LADDERS, Limit, RepairConfig, parse_duration
from .history import History, HistoryError, Incident, Step, dumps, is_ours, loads, record_outcome
from .model import (
    ACTIONS,
    CHANGING_ACTIONS,
    FAILURE_CLASSES,
    REPAIR_STEPS,
    BreakerState,
    Decision,
    HookCall,
    Plan,
    RepairError,
    SpareMove,
)
from .policy import breaker_threshold, fleet_view, plan, retention, time_horizon

__all__ = [
    "ACTIONS",
    "CHANGING_ACTIONS",
    "DEFAULT_LADDERS",
    "FAILURE_CLASSES",
    "REPAIR_STEPS",
    "BreakerState",
    "Decision",
    "History",
    "HistoryError",
    "HookCall",
    "Incident",
    "Limit",
    "Plan",
    "RepairConfig",
    "RepairError",
    "SpareMove",
    "Step",
    "breaker_threshold",
    "classify",
    "dumps",
    "fleet_view",
    "is_ours",
    "loads",
    "parse_duration",
    "plan",
    "record_outcome",
    "retention",
    "time_horizon",
]
