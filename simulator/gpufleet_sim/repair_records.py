"""The repair history kept on the nodes, read back for ``gpufleet-sim calibrate --nodes``: what each repair step did.

The collection keeps each node's repair history in its Slurm ``Extra`` (or ``Comment``) field
(plugins/module_utils/repair/history.py): the open incident with its steps (action, when started, outcome, when
proven to have run), the repair steps started lately (``r``) and the past incidents' classes (``p``). A site reads
it as ``repair_plan`` does, from Slurm's node records: ``scontrol show node --json`` (Slurm 23.02 on), ``sinfo
--json`` (22.05) or ``scontrol -o show node``. One dump shows the present; dumps taken over time (a cron job that
appends ``scontrol show node --json | jq -c .`` to a file every few minutes) show every step, because an incident's
steps stay in the history until the incident closes and ``r``/``p`` keep the recent ones after.

Read through the collection's own parsers (the Slurm adapter's node parsers, the history's ``history_fields``),
never a copy of them. From the dumps, per node: the incidents (first seen, class, closed or still open) and the steps
(action, started, proven run time). A step **cured** its incident when it was the incident's last and the incident
closed; it **failed** when another step of the same incident followed it, or its outcome says failed or timed out;
otherwise it is still **pending** (or was never proven to have run: not a step). An incident an operator closed by
hand looks cured by its last step: the history keeps no more than a note on the latest one.

Which steps can cure which class is read from the records too: a class's **need** is the lowest step that ever cured
one of its incidents. A step's success probability (the scenario's ``repair.actions.<step>.success``: the chance a
step that can cure the fault does) is its cures over its attempts in the incidents of classes it can cure; a step
below a class's need fails whatever its success, so those attempts are left out. Durations are the proven ones:
from a step's start to the proof that it ran (a reset's own record right after it returned, a reboot's new boot time).
"""

from __future__ import annotations

import bisect
import json
import math
import statistics
import time
from dataclasses import dataclass
from typing import IO, Dict, Iterable, List, Optional, Tuple

from ansible_collections.gpufleet.reliability.plugins.module_utils.repair.model import REPAIR_STEPS
from ansible_collections.gpufleet.reliability.plugins.module_utils.repair.state import history_fields
from ansible_collections.gpufleet.reliability.plugins.module_utils.slurm.errors import SlurmError
from ansible_collections.gpufleet.reliability.plugins.module_utils.slurm.parse import (
    parse_nodes_json,
    parse_nodes_text,
)

from .calibrate import CalibrationError, add_sources
from .scenario import LEVEL

#: a dump longer than this (one JSON document, or a text dump) is not one of Slurm's for a cluster we model
MAX_DUMP = 1 << 30
#: proven durations needed before the scenario's duration of a step is replaced by the site's
MIN_DURATIONS = 5


class RecordsError(CalibrationError):
    """A node dump that cannot be read (named by file and line)."""


@dataclass
class StepSeen:
    """One repair step as the records show it."""

    node: str
    action: str
    started: int
    incident: Optional[int] = None  # the incident's first-seen time (None: before any incident on record)
    incident_class: Optional[str] = None
    outcome: str = "pending"  # cured, failed, pending
    ran: Optional[int] = None


class _Node:
    """What the dumps showed of one node's history, merged (a later dump's word on a step wins)."""

    __slots__ = ("steps", "incidents")

    def __init__(self) -> None:
        #: (action, started) -> [explicit outcome or None, ran or None]
        self.steps: Dict[Tuple[str, int], list] = {}
        #: first seen -> [class, closed]
        self.incidents: Dict[int, list] = {}

    def add(self, h) -> None:
        for first, cls in h.past:
            self.incidents[int(first)] = [cls, True]
        inc = h.incident
        if inc is not None:
            seen = self.incidents.setdefault(int(inc.first_seen), [inc.failure_class, False])
            seen[0] = inc.failure_class
            for s in inc.steps:
                if s.action not in LEVEL:
                    continue
                rec = self.steps.setdefault((s.action, int(s.started)), [None, None])
                if s.outcome is not None:
                    rec[0] = s.outcome
                if s.ran is not None:
                    rec[1] = int(s.ran)
        for t, action in h.repairs:
            if action in LEVEL:
                self.steps.setdefault((action, int(t)), [None, None])

    def seen(self, name: str) -> List[StepSeen]:
        firsts = sorted(self.incidents)
        groups: Dict[Optional[int], List[Tuple[int, str, list]]] = {}
        for (action, started), rec in self.steps.items():
            i = bisect.bisect_right(firsts, started) - 1
            groups.setdefault(firsts[i] if i >= 0 else None, []).append((started, action, rec))
        out = []
        for first, steps in groups.items():
            steps.sort()
            cls, closed = self.incidents[first] if first is not None else (None, False)
            for n, (started, action, (explicit, ran)) in enumerate(steps):
                if explicit == "unproven":
                    continue  # its intent was written, nothing shows it ran: not a step
                if explicit in ("failed", "timeout") or n < len(steps) - 1:
                    outcome = "failed"
                elif closed:
                    outcome = "cured"
                else:
                    outcome = "pending"
                out.append(StepSeen(name, action, started, first, cls, outcome, ran))
        return out


def _documents(fh: IO[str], source: str) -> Iterable[Tuple[str, str, bool]]:
    """(where, text, is JSON) of each dump in a file: JSON Lines (one document a line), one JSON document over many
    lines (as ``scontrol show node --json`` prints it), or one text dump (``scontrol -o show node``)."""
    first = fh.readline()
    while first and not first.strip():
        first = fh.readline()
    if not first:
        return
    if not first.lstrip().startswith("{"):  # scontrol -o show node: one dump, a node a line
        if not first.lstrip().startswith("NodeName="):
            raise RecordsError(f"{source}: line 1: not Slurm's node records: expected a JSON document or "
                               f"scontrol -o show node lines (NodeName=...), got {first.strip()[:60]!r}")
        rest = fh.read(MAX_DUMP)
        if fh.read(1):
            raise RecordsError(f"{source}: a text dump longer than {MAX_DUMP} bytes")
        yield source, first + rest, False
        return
    try:
        json.loads(first)
        one_line = True
    except RecursionError:  # a whole document on one line, nested beyond reason: refused as that line
        one_line = True
    except ValueError:
        one_line = False
    if not one_line:
        rest = fh.read(MAX_DUMP)
        if fh.read(1):
            raise RecordsError(f"{source}: a JSON document longer than {MAX_DUMP} bytes")
        yield source, first + rest, True
        return
    yield f"{source}: line 1", first, True
    for n, line in enumerate(fh, start=2):
        if line.strip():
            yield f"{source}: line {n}", line, True


def read_node_dumps(fh: IO[str], source: str = "nodes", field: str = "extra", into: Optional[dict] = None,
                    problems: Optional[List[str]] = None) -> Dict[str, _Node]:
    """Merge the repair histories of every node dump in ``fh`` into ``into`` ({node: merged history}).

    A dump Slurm's parsers refuse is an error naming the file and line; a dump in which Slurm says why it has no nodes
    (taken while slurmctld was down) and a node whose history is ours but unreadable (damaged, a newer format) are
    skipped and named in ``problems``; a field holding someone else's text is not ours.
    """
    if field not in ("extra", "comment"):
        raise RecordsError(f"history field: expected extra or comment, got {field!r}")
    nodes: Dict[str, _Node] = {} if into is None else into
    for where, text, is_json in _documents(fh, source):
        try:
            dump = parse_nodes_json(text) if is_json else parse_nodes_text(text)
        except SlurmError as exc:
            if exc.kind == "command" and problems is not None:  # Slurm said why it had no nodes (slurmctld down)
                problems.append(f"{where}: a dump without nodes: {exc}")
                continue
            raise RecordsError(f"{where}: not Slurm's node records: {exc}") from None
        for name, node in dump.items():
            h, _foreign, error = history_fields(getattr(node, field) or "")
            if error is not None:
                if problems is not None:
                    problems.append(f"{where}: node {name}: {error}")
                continue
            if h is not None:
                nodes.setdefault(name, _Node()).add(h)
    return nodes


def load_node_dumps(paths: Iterable[str], field: str = "extra") -> Tuple[List[StepSeen], List[str]]:
    """The repair steps the node dumps in ``paths`` show, and the nodes whose history could not be read."""
    nodes: Dict[str, _Node] = {}
    problems: List[str] = []
    for path in paths:
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                read_node_dumps(fh, path, field, into=nodes, problems=problems)
        except OSError as exc:
            raise RecordsError(f"{path}: cannot read: {exc.strerror}") from None
    return steps_of(nodes), problems


def steps_of(nodes: Dict[str, _Node]) -> List[StepSeen]:
    out: List[StepSeen] = []
    for name in sorted(nodes):
        out += nodes[name].seen(name)
    return out


def wilson(k: int, n: int, z: float = 1.959964) -> Tuple[float, float]:
    """The Wilson score interval of a share k/n (95 % by default); (0, 1) with no trials."""
    if n <= 0:
        return 0.0, 1.0
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0.0, mid - half), min(1.0, mid + half)


def _need(steps: List[StepSeen]) -> Dict[str, int]:
    """Each class's need: the level of the lowest step that ever cured one of its incidents."""
    need: Dict[str, int] = {}
    for s in steps:
        if s.outcome == "cured" and s.incident_class is not None:
            need[s.incident_class] = min(need.get(s.incident_class, LEVEL[s.action]), LEVEL[s.action])
    return need


def _able(steps: List[StepSeen], action: str, need: Dict[str, int]) -> List[StepSeen]:
    """The ended attempts of ``action`` in incidents of classes it can cure: those its success is counted over."""
    return [s for s in steps if s.action == action and s.outcome != "pending" and s.incident_class in need
            and need[s.incident_class] <= LEVEL[action]]


def fit_steps(steps: List[StepSeen]) -> dict:
    """Per repair step: attempts and cures, the success probability where the step can cure, proven durations."""
    need = _need(steps)
    actions = {}
    for action in REPAIR_STEPS:
        mine = [s for s in steps if s.action == action]
        if not mine:
            continue
        able = _able(mine, action, need)
        cured = sum(1 for s in able if s.outcome == "cured")
        lo, hi = wilson(cured, len(able))
        minutes = [(s.ran - s.started) / 60.0 for s in mine if s.ran is not None and s.ran >= s.started]
        row = {"steps": len(mine), "cured": sum(1 for s in mine if s.outcome == "cured"),
               "failed": sum(1 for s in mine if s.outcome == "failed"),
               "pending": sum(1 for s in mine if s.outcome == "pending"),
               "able": len(able), "able_cured": cured,
               "success": cured / len(able) if able else None, "ci95": [lo, hi] if able else None,
               "durations": len(minutes)}
        if len(minutes) >= MIN_DURATIONS:
            # the stdlib's inclusive quantiles: linear between order statistics, as numpy's default
            row["duration_min"] = {"median": statistics.median(minutes),
                                   "p90": statistics.quantiles(minutes, n=10, method="inclusive")[8]}
        actions[action] = row
    steps_at = {lv: a for a, lv in LEVEL.items()}
    return {"actions": actions, "need": {c: steps_at[lv] for c, lv in sorted(need.items())},
            "incidents": len({(s.node, s.incident) for s in steps if s.incident is not None})}


def binom_quantile(n: int, p: float, q: float) -> int:
    """The smallest k with P(Binomial(n, p) <= k) >= q (a normal approximation past 2,000 trials)."""
    if n > 2000:
        k = n * p + (1.959964 if q > 0.5 else -1.959964) * math.sqrt(n * p * (1 - p))
        return int(min(n, max(0, round(k))))
    total = 0.0
    for k in range(n + 1):
        total += math.comb(n, k) * p ** k * (1 - p) ** (n - k)
        if total >= q - 1e-12:
            return k
    return n


def holdout_steps(steps: List[StepSeen], cut: float) -> List[dict]:
    """Repairs by outcome after ``cut``, predicted from the steps before it: per step, the later attempts (in the
    incidents of classes the step can cure, by the whole window's records) times the earlier success, with a 95 %
    interval from the earlier success's Wilson interval and the later attempts' binomial spread."""
    need = _need(steps)
    rows = []
    for action in REPAIR_STEPS:
        able = _able(steps, action, need)
        early = [s for s in able if s.started < cut]
        late = [s for s in able if s.started >= cut]
        if not early or not late:
            continue
        k = sum(1 for s in early if s.outcome == "cured")
        lo, hi = wilson(k, len(early))
        rows.append({"what": f"{action} steps that cured ({len(late)} tried)",
                     "observed": sum(1 for s in late if s.outcome == "cured"),
                     "predicted": k / len(early) * len(late),
                     "interval": [binom_quantile(len(late), lo, 0.025), binom_quantile(len(late), hi, 0.975)]})
    return rows


def window_of_steps(steps: List[StepSeen]) -> List[str]:
    times = [s.started for s in steps]
    return [time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t)) for t in (min(times), max(times))] if times else []


def calibrated_repairs(raw: dict, fitted: dict, window: List[str]) -> dict:
    """``raw`` (a scenario's mapping, changed in place and returned) with the repair steps' inputs the records give
    in ``repair.actions`` and a ``sources:`` entry for each; the others are left as they were."""
    actions, sources = scenario_actions(fitted, window)
    if actions:
        rep = raw.setdefault("repair", {})
        if not isinstance(rep, dict):
            raise CalibrationError("the base scenario's repair section is not a mapping")
        acts = rep.setdefault("actions", {})
        for action, fields in actions.items():
            acts[action] = {**(acts.get(action) or {}), **fields}
        add_sources(raw, sources)
    return raw


def scenario_actions(fitted: dict, window: List[str]) -> Tuple[Dict[str, dict], List[dict]]:
    """The repair steps' inputs the records give (``repair.actions``) and their ``sources:`` entries."""
    actions: Dict[str, dict] = {}
    sources: List[dict] = []
    for action, row in fitted["actions"].items():
        if row["success"] is not None and row["able"] > 0:
            actions.setdefault(action, {})["success"] = round(min(max(row["success"], 0.001), 1.0), 4)
            sources.append({"paths": [f"repair.actions.{action}.success"], "source": {
                "kind": "site", "count": row["able"], "cured": row["able_cured"], "window": list(window),
                "ci95": [round(x, 4) for x in row["ci95"]],
                "why": "the nodes' repair histories: cures over attempts in incidents of classes this step cures"}})
        d = row.get("duration_min")
        if d and d["median"] > 0 and d["p90"] > d["median"]:
            actions.setdefault(action, {})["duration_min"] = {"dist": "lognormal", "median": round(d["median"], 3),
                                                              "p90": round(d["p90"], 3)}
            sources.append({"paths": [f"repair.actions.{action}.duration_min"], "source": {
                "kind": "site", "count": row["durations"], "window": list(window),
                "why": "the nodes' repair histories: start to the proof that the step ran"}})
    return actions, sources
