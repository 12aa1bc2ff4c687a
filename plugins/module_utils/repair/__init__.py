# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Repair policy (the brain's second half): pure Python, stdlib only, no I/O.

    from .repair import plan, RepairConfig, FleetSummary, NodeState
    decisions = plan(fleet_summary, [node_state, ...], RepairConfig.from_dict(cfg), now)

See state.py for the typed inputs (the older dicts are accepted too), rules.py for the rules, limits.py for the
limits, policy.py for plan(), history.py for the compact history stored in Slurm, docs/repair.md for
the reasoning and the defaults' sources.
"""

from __future__ import annotations

from .classify import classify
from .config import DEFAULT_LADDERS, Limit, RepairConfig, parse_duration
from .history import History, HistoryError, Incident, Step, dumps, is_ours, loads, record_outcome, record_ran
from .limits import breaker_threshold
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
from .policy import blind, followups, plan, retention
from .rules import proof, record_verification
from .state import Counts, FleetSummary, NodeState

__all__ = [
    "ACTIONS",
    "CHANGING_ACTIONS",
    "DEFAULT_LADDERS",
    "FAILURE_CLASSES",
    "REPAIR_STEPS",
    "BreakerState",
    "Counts",
    "Decision",
    "FleetSummary",
    "History",
    "HistoryError",
    "HookCall",
    "Incident",
    "Limit",
    "NodeState",
    "Plan",
    "RepairConfig",
    "RepairError",
    "SpareMove",
    "Step",
    "blind",
    "breaker_threshold",
    "classify",
    "dumps",
    "followups",
    "is_ours",
    "loads",
    "parse_duration",
    "plan",
    "proof",
    "record_outcome",
    "record_ran",
    "record_verification",
    "retention",
]
