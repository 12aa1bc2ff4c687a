"""The simulator's small records: a sick node's record, a failure as a job meets it, and the names the processes
share (the minute, plan()'s job actions)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Optional

from ansible_collections.gpufleet.reliability.plugins.module_utils.repair import NodeState
from ansible_collections.gpufleet.reliability.plugins.module_utils.repair.model import (
    RULE_DRAINING,
    RULE_EVICTION_LIMIT,
    RULE_JOB_KEPT,
)

H = 1.0 / 60.0  # one minute in hours
# plan()'s decisions on a node drained by us with a job still on it (repair.rules: draining, evict, ...)
ACT_EVICT, ACT_WAIT, ACT_HOLD = "evict", "wait", "hold"
JOB_CHECKPOINT_REQUEUE, JOB_REQUEUE = "checkpoint_requeue", "requeue"
KEPT = "kept"  # the job keeps the node (jobs.action wait, a job kept, the eviction limit)
_KEPT_BY = {(ACT_WAIT, RULE_DRAINING), (ACT_WAIT, RULE_JOB_KEPT), (ACT_HOLD, RULE_EVICTION_LIMIT)}


class JobAction(NamedTuple):
    """What the engine did to a job on plan()'s word: the decision's node, action and rule, its job action (the
    JobStep's ``checkpoint_requeue`` / ``requeue``; None for a job that keeps the node), and when (hours). Only
    these fields are kept, not the Decision: a run of a year at a million GPUs carries out about 80,000 of them, and
    each Decision holds two copies of the node's history."""
    t: float
    node: str
    action: str
    rule: str
    job_action: Optional[str]


@dataclass
class NodeRec:
    node: int
    lemon: bool = False
    state: str = "healthy"  # precursor | failed | drained | repair | retired
    fault: dict | None = None
    since: float = 0.0
    attempts: list = field(default_factory=list)  # [(time_h, action, ok, step_ended_h)]
    verdict: dict | None = None
    failures: int = 0
    token: int = 0  # invalidates stale scheduled callbacks
    slurm: NodeState | None = None  # the node's virtual Slurm record, as the repair policy reads it


@dataclass
class Failure:
    node: int | None
    fault: dict
    t: float
    detect_at: float
    needs_human: bool
    remove: bool  # take the node out of the job (False: restart on the same nodes)
    planned: bool = False  # a proactive drain: checkpoint first, no lost work
    rollback_to: float | None = None  # silent corruption: roll back to this work value
