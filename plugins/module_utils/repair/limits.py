# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The repair policy's limits, in one place: blast radius, concurrency, hot spares, retry budget, circuit breaker.

``Limits`` holds the fleet-wide counters that the decisions of one plan consume, oldest incident first; the
functions below are the budget and breaker arithmetic. The rules (rules.py) ask here and never count themselves.

- ``min_healthy``: a partition keeps at least this share of its nodes available (medik8s minHealthy).
- ``max_unavailable`` per partition and ``domains`` limits per rack/switch: nodes out of service after a drain,
  and nodes under repair at once (EKS auto-repair: no repair above 20 % unhealthy).
- ``max_parallel``: repair steps started in one run.
- The last available node of a partition is never drained by automation.
- Retry budget: attempts per window on one node, any incident (ADR-056 retry budget).
- Circuit breaker: this many distinct nodes failing within the window hold everything (NVSentinel).
- Evictions: at most ``jobs.max_evictions`` nodes' jobs evicted within ``jobs.eviction_window``, fleet-wide (the
  evictions on record in the histories of the nodes that need attention, and those this plan starts).
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Set, Tuple

from .config import Limit, RepairConfig
from .history import History
from .model import SpareMove
from .state import Counts, FleetSummary, NodeState

GroupKey = Tuple[str, str]


def breaker_threshold(config: RepairConfig, total: int) -> int:
    """How many distinct nodes failing within the breaker window trip the circuit breaker in a fleet of ``total``."""
    return max(config.breaker_min_nodes, int(math.ceil(config.breaker_fraction * total - 1e-9)))


def breaker_trips(config: RepairConfig, total: int, count: int, what: str) -> Optional[str]:
    """The circuit breaker, counted in one place: None while ``count`` nodes within the breaker window stay below
    the threshold for a fleet of ``total``, else why it trips (``what`` names what was counted, e.g. "nodes
    failed"). The repair plan counts nodes whose failure was first seen in the window, the node agent nodes
    drained by us in it (plus its own); both ask here."""
    if not config.breaker_enabled:
        return None
    threshold = breaker_threshold(config, total)
    if count < threshold:
        return None
    return f"{count} {what} within {config.breaker_window_s:g}s (threshold {threshold} of {total})"


def budget_free_at(history: History, config: RepairConfig, now: float) -> Optional[float]:
    """When the node's retry budget has a free slot again; None when it has one now.

    ``budget``: at most ``attempts`` repair steps (any incident) within ``window`` seconds."""
    if len(history.repairs) < config.budget_attempts:
        return None  # fewer attempts than that, whatever their times
    window = history.repairs_since(now - config.budget_window_s)
    if len(window) < config.budget_attempts:
        return None
    return sorted(t for t, _a in window)[len(window) - config.budget_attempts] + config.budget_window_s


def limit_of(counts: Counts, limit: Limit) -> int:
    """A limit as a node count for a group of ``counts.total`` nodes; a share never rounds below one node."""
    n = limit.of(counts.total)
    if limit.share is not None:
        n = max(1, n)
    return n


class Limits:
    """Fleet-wide counters that the decisions of one plan consume, oldest incident first."""

    def __init__(self, fleet: FleetSummary, config: RepairConfig):
        self.fleet = fleet
        self.config = config
        self.new_unavailable: Dict[GroupKey, int] = {}  # drains planned this run
        self.active: Dict[GroupKey, int] = {}  # nodes acted on (in progress + started now)
        self.parallel = 0
        # partition -> where the next idle spare is looked for in the fleet's list (the list is never copied: a
        # plan that takes one spare of thousands costs one step)
        self.spare_next: Dict[str, int] = {}
        self.spares_taken: Set[str] = set()
        self._node_groups: Dict[str, List[Tuple[GroupKey, Counts, int]]] = {}
        self.evictions = 0  # evictions begun within the window (plan() counts those on record first)

    def _groups(self, node: NodeState) -> List[Tuple[GroupKey, Counts, int]]:
        """The node's partitions and failure domains that have a limit: (key, counts, limit as a node count)."""
        got = self._node_groups.get(node.name)
        if got is None:
            got = self._node_groups[node.name] = self._find_groups(node)
        return got

    def _find_groups(self, node: NodeState) -> List[Tuple[GroupKey, Counts, int]]:
        out: List[Tuple[GroupKey, Counts, int]] = []
        fleet, config = self.fleet, self.config
        for p in node.partitions:
            c = fleet.partitions.get(p)
            if c is not None:
                out.append((("partition", p), c, limit_of(c, config.max_unavailable)))
        if node.domains:
            limits = config.domain_limits
            for kind, dom in node.domains.items():
                limit = limits.get(kind)
                if limit is not None:
                    c = fleet.domain(kind, dom)
                    if c is not None:
                        out.append(((kind, dom), c, limit_of(c, limit)))
        return out

    def min_healthy_block(self, node: NodeState) -> Optional[str]:
        """``min_healthy``: why the node's partition has too few nodes available for automation to act, or None."""
        for p in node.partitions:
            c = self.fleet.partitions.get(p)
            if c is None or c.total == 0:
                continue
            need = math.ceil(self.config.min_healthy * c.total - 1e-9)
            avail = c.available - self.new_unavailable.get(("partition", p), 0)
            if avail < need:
                return (
                    f"partition {p} has {avail} of {c.total} nodes available, "
                    f"below min_healthy {self.config.min_healthy * 100:g}% ({need}): automation waits"
                )
        return None

    def drain_block(self, node: NodeState) -> Optional[str]:
        """Why draining the node now would break a limit (min_healthy, max_unavailable, a domain limit, the last
        available node of a partition), or None."""
        msg = self.min_healthy_block(node)
        if msg:
            return msg
        for key, c, n in self._groups(node):
            after = c.unavailable + self.new_unavailable.get(key, 0) + 1
            if after > n:
                return f"draining would make {after} nodes unavailable in {key[0]} {key[1]} (limit {n})"
        # the last available node of a partition is never drained by automation
        for p in node.partitions:
            pc = self.fleet.partitions.get(p)
            if pc is not None and pc.available - self.new_unavailable.get(("partition", p), 0) <= 1 and pc.total > 1:
                return f"partition {p} would have no available node left"
        return None

    def repair_block(self, node: NodeState) -> Optional[str]:
        """Why starting a repair step on the node now would break a limit (min_healthy, nodes under repair per
        partition and domain, max_parallel), or None."""
        return self.min_healthy_block(node) or self.concurrency_block(node)

    def concurrency_block(self, node: NodeState) -> Optional[str]:
        """repair_block() without min_healthy: nodes under repair per partition and domain, max_parallel."""
        active = self.active
        for key, _c, n in self._groups(node):
            if active.get(key, 0) + 1 > n:
                return f"{active.get(key, 0)} nodes already under repair in {key[0]} {key[1]} (limit {n})"
        max_parallel = self.config.max_parallel
        if max_parallel is not None and self.parallel + 1 > max_parallel:
            return f"max_parallel {max_parallel} repairs already started in this run"
        return None

    def eviction_block(self) -> Optional[str]:
        """Why evicting one more node's jobs now would break ``jobs.max_evictions`` per ``jobs.eviction_window``."""
        cfg = self.config
        if self.evictions + 1 > cfg.max_evictions:
            return (f"{self.evictions} evictions within {cfg.eviction_window_s / 60:g} min already (jobs.max_evictions "
                    f"{cfg.max_evictions}): an eviction storm; a person looks at the fleet")
        return None

    def take_eviction(self) -> None:
        self.evictions += 1

    def take_drain(self, node: NodeState) -> None:
        for key, _c, _n in self._groups(node):
            self.new_unavailable[key] = self.new_unavailable.get(key, 0) + 1

    def take_active(self, node: NodeState, started_now: bool) -> None:
        active = self.active
        for key, _c, _n in self._groups(node):
            active[key] = active.get(key, 0) + 1
        if started_now:
            self.parallel += 1

    def release(self, node: NodeState) -> None:
        for key, _c, _n in self._groups(node):
            self.active[key] = max(0, self.active.get(key, 0) - 1)

    def take_spare(self, node: NodeState) -> Optional[SpareMove]:
        for p in node.partitions:
            counts = self.fleet.partitions.get(p)
            if counts is None:
                continue
            pool = counts.spares
            i = self.spare_next.get(p, 0)
            while i < len(pool):
                s = pool[i]
                i += 1
                if s is None or s not in self.spares_taken:
                    self.spare_next[p] = i
                    if s is not None:
                        self.spares_taken.add(s)
                    return SpareMove(spare=s, partition=p, for_node=node.name)
            self.spare_next[p] = i
        return None
