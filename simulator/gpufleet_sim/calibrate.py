"""``gpufleet-sim calibrate``: a site's own Slurm records become the scenario's failure rates.

Reads, each optional, from its real interface:

* Slurm's node events (``sacctmgr -P show event format=Cluster,NodeName,TimeStart,TimeEnd,State,Reason,User``,
  slurmdbd): when each node went out of service, why, and when it came back;
* Slurm's job accounting (``sacct --json``, Slurm 22.05 or 24.11 shape, or ``sacct -P -X
  --format=JobID,State,NNodes,Start,End``): the jobs' runs, for the exposure (node-days of jobs running: the time a
  fault can strike a job) and for faults of the jobs' own software (runs that ended ``FAILED``).

Which fault class an event belongs to is the collection's own rule, never a table of ours: each node-scope class of
the base scenario is judged by the health rules (``health.judge`` on its kernel-log lines, as the simulator does),
and an event whose reason is our drain reason for that code (``gpufleet: <code> ...``) is that class's. A class the
checks cannot see makes Slurm mark the node DOWN ("Not responding"). Classes that share a code share one fitted rate,
split in the ratio of their base rates (the records cannot tell them apart; the scenario says so).

A passive check's false positive (the scenario's ``false_positives``) is a drain for its finding's code that the
first repair step's verification clears: the records cannot tell it from a real fault with that code, so it is
fitted with the classes that show the code and gets its share of their rate.

Each fitted rate carries its source: ``{kind: site, count, exposure_node_days, window, ci95}`` (an exact Poisson
interval); a class with no event in the records keeps its base rate, tagged with the records' upper bound.
``--holdout F`` fits on the earlier part of the records and predicts the last ``F`` of the window (events per class,
interruptions, node-days out of service; repairs by outcome from the histories), printing observed against predicted
with 95 % intervals: the scenario tested on the site's future.
"""

from __future__ import annotations

import bisect
import calendar
import copy
import io
import json
import math
import os
import time
from array import array
from dataclasses import dataclass
from typing import IO, Any, Callable, Dict, Iterable, List, Optional, Tuple

from ansible_collections.gpufleet.reliability.plugins.module_utils.slurmfacts import out_of_service, reason_code

from .vslurm import NOT_RESPONDING

MAX_LINE = 4096  # a longer line is not sacctmgr's or sacct's: refused by number
MAX_JOB_TEXT = 1 << 20  # one job of sacct --json longer than this is not sacct's
CHUNK = 1 << 20
DAY_S = 86400.0
CRASH_STATES = ("NODE_FAIL", "FAILED")


class CalibrationError(ValueError):
    """Records that cannot be read: names the file, the line or field and what was expected."""


@dataclass(frozen=True)
class Event:
    node: str
    start: float
    end: Optional[float]
    state: str
    reason: str


@dataclass(frozen=True)
class Run:
    job_id: str
    state: str
    nodes: int
    start: float
    end: float


# ---- reading --------------------------------------------------------------------------------------------------------
def _epoch(text: str, where: str) -> float:
    try:
        return float(calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%S")))
    except ValueError:
        raise CalibrationError(f"{where}: expected a time as YYYY-MM-DDTHH:MM:SS, got {text[:40]!r}") from None


def read_events(lines: Iterable[str], source: str = "events") -> List[Event]:
    """``sacctmgr -P show event`` output with its header line (the fields in any order)."""
    it = iter(lines)
    header = next(it, "").rstrip("\n").split("|")
    need = ("NodeName", "TimeStart", "TimeEnd", "State", "Reason")
    missing = [f for f in need if f not in header]
    if missing:
        raise CalibrationError(f"{source}: line 1: expected a header naming {', '.join(need)} (sacctmgr -P show "
                               f"event format=Cluster,NodeName,TimeStart,TimeEnd,State,Reason,User), missing "
                               f"{', '.join(missing)}")
    col = {f: header.index(f) for f in need}
    out = []
    for n, line in enumerate(it, start=2):
        line = line.rstrip("\n")
        if not line.strip():
            continue
        where = f"{source}: line {n}"
        if len(line) > MAX_LINE:
            raise CalibrationError(f"{where}: longer than {MAX_LINE} characters")
        fields = line.split("|")
        if len(fields) != len(header):
            raise CalibrationError(f"{where}: expected {len(header)} fields separated by '|', got {len(fields)}")
        node = fields[col["NodeName"]]
        if not node:  # a cluster event (no node): not a node's
            continue
        end_text = fields[col["TimeEnd"]]
        end = None if end_text in ("", "Unknown", "None") else _epoch(end_text, f"{where}: TimeEnd")
        out.append(Event(node, _epoch(fields[col["TimeStart"]], f"{where}: TimeStart"), end,
                         fields[col["State"]].upper(), fields[col["Reason"]]))
    return out


def _number(v: Any, where: str) -> float:
    """A number as sacct --json gives it: plain (22.05), or {set, infinite, number} (24.11)."""
    if isinstance(v, dict):
        v = v.get("number")
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise CalibrationError(f"{where}: expected a number, got {v!r}")
    return float(v)


class Runs:
    """The jobs' runs, kept as columns (a year of a 10,000-node cluster is about a million runs): start and end
    (epoch seconds), node count, final state. Iterating gives :class:`Run` records."""

    def __init__(self) -> None:
        self.start = array("d")
        self.end = array("d")
        self.nodes = array("l")
        self.states: List[str] = []  # the few distinct states, by index
        self.state = array("B")
        self._index: Dict[str, int] = {}

    def add(self, state: str, nodes: int, start: float, end: float) -> None:
        i = self._index.get(state)
        if i is None:
            if len(self.states) >= 255:
                raise CalibrationError(f"sacct: more than 255 distinct job states (at {state[:40]!r})")
            i = self._index[state] = len(self.states)
            self.states.append(state)
        self.start.append(start)
        self.end.append(end)
        self.nodes.append(nodes)
        self.state.append(i)

    def __len__(self) -> int:
        return len(self.start)

    def __iter__(self):
        for i in range(len(self.start)):
            yield Run("", self.states[self.state[i]], self.nodes[i], self.start[i], self.end[i])

    def ended(self, states: Iterable[str], t0: float, t1: float) -> int:
        """Runs that ended in [t0, t1) in one of ``states``."""
        want = {self._index[s] for s in states if s in self._index}
        if not want:
            return 0
        return sum(1 for st, e in zip(self.state, self.end) if st in want and t0 <= e < t1)

    def sizes(self, t0: float, t1: float) -> dict:
        """The jobs' sizes in [t0, t1): runs, the largest, and the share of node-days by size (nodes) - what a site
        reads before it sets the scenario's ``jobs`` (sacct shows no checkpoint settings: those stay the scenario's)."""
        edges = (1, 8, 32, 128, 512, 2048)
        days = [0.0] * (len(edges) + 1)
        largest = runs = 0
        for a, b, n in zip(self.start, self.end, self.nodes):
            dt = (b if b < t1 else t1) - (a if a > t0 else t0)
            if dt <= 0:
                continue
            runs += 1
            largest = max(largest, n)
            days[bisect.bisect_left(edges, n)] += n * dt / DAY_S  # the edges below n
        total = sum(days)
        names = ["1"] + [f"{lo + 1}-{hi}" for lo, hi in zip(edges, edges[1:])] + [f">{edges[-1]}"]
        return {"runs": runs, "largest_nodes": largest,
                "node_days_share": {k: round(d / total, 4) for k, d in zip(names, days) if d} if total else {}}

    def node_days(self, t0: float, t1: float) -> float:
        """Node-days of jobs running between t0 and t1."""
        total = 0.0
        for a, b, n in zip(self.start, self.end, self.nodes):
            dt = (b if b < t1 else t1) - (a if a > t0 else t0)
            if dt > 0:
                total += n * dt
        return total / DAY_S


def _job(j: Any, where: str, runs: Runs) -> None:
    if not isinstance(j, dict) or not isinstance(j.get("time"), dict):
        raise CalibrationError(f"{where}: expected a job with 'time' (start, end) and 'state'")
    st = j["state"].get("current") if isinstance(j.get("state"), dict) else j.get("state")
    st = st[0] if isinstance(st, list) and st else st
    if not isinstance(st, str) or not st or len(st) > 40:
        raise CalibrationError(f"{where}.state.current: expected a job state, got {str(st)[:40]!r}")
    nodes = _number(j.get("allocation_nodes", j.get("nodes_count")), f"{where}.allocation_nodes")
    end = _number(j["time"].get("end"), f"{where}.time.end")
    if end <= 0:
        return  # still running: its exposure is not known yet
    runs.add(st.upper(), int(nodes), _number(j["time"].get("start"), f"{where}.time.start"), end)


def _json_jobs(fh: IO[str], source: str, runs: Runs) -> None:
    """Stream ``sacct --json``'s ``jobs`` array one job at a time (the other top-level values are small)."""
    dec = json.JSONDecoder()
    buf, pos, eof = "", 0, False

    def fill() -> bool:
        nonlocal buf, pos, eof
        chunk = fh.read(CHUNK)
        if not chunk:
            eof = True
            return False
        buf, pos = buf[pos:] + chunk, 0
        return True

    def skip(chars: str) -> str:
        nonlocal pos
        while True:
            while pos < len(buf) and buf[pos] in chars:
                pos += 1
            if pos < len(buf) or not fill():
                return buf[pos] if pos < len(buf) else ""

    def value() -> Any:
        nonlocal pos
        while True:
            try:
                v, end = dec.raw_decode(buf, pos)
            except ValueError as exc:
                if eof or len(buf) - pos > MAX_JOB_TEXT:
                    raise CalibrationError(f"{source}: not valid sacct --json ({exc})") from None
                fill()
                continue
            if end == len(buf) and not eof and fill():  # a number may go on in the next chunk
                continue
            pos = end
            return v

    fill()
    if skip(" \t\r\n") != "{":
        raise CalibrationError(f"{source}: expected sacct --json output (an object with a 'jobs' list)")
    pos += 1
    seen = False
    while True:
        c = skip(" \t\r\n,")
        if c == "}":
            break
        if c != '"':
            raise CalibrationError(f"{source}: not valid sacct --json (a key expected at offset {pos})")
        key = value()
        if skip(" \t\r\n") != ":":
            raise CalibrationError(f"{source}: not valid sacct --json (':' expected after {str(key)[:40]!r})")
        pos += 1
        if key != "jobs":
            skip(" \t\r\n")
            value()
            continue
        seen = True
        if skip(" \t\r\n") != "[":
            raise CalibrationError(f"{source}: expected sacct --json output (an object with a 'jobs' list)")
        pos += 1
        i = 0
        while True:
            c = skip(" \t\r\n,")
            if c == "]":
                pos += 1
                break
            if not c:
                raise CalibrationError(f"{source}: not valid sacct --json (the jobs list ends early)")
            _job(value(), f"{source}: jobs[{i}]", runs)
            i += 1
    if not seen:
        raise CalibrationError(f"{source}: expected sacct --json output (an object with a 'jobs' list)")


def read_sacct_file(fh: IO[str], source: str = "sacct") -> Runs:
    """``sacct --json`` (a ``jobs`` list, streamed) or ``sacct -P`` with a header naming JobID, State, NNodes,
    Start, End (line by line)."""
    runs = Runs()
    first = fh.read(1)
    while first and first.isspace():
        first = fh.read(1)
    if first == "{":
        _json_jobs(_Prefixed(first, fh), source, runs)
        return runs
    header = (first + fh.readline()).rstrip("\n").split("|")
    need = ("JobID", "State", "NNodes", "Start", "End")
    if any(f not in header for f in need):
        raise CalibrationError(f"{source}: line 1: expected sacct --json, or sacct -P with a header naming "
                               f"{', '.join(need)}")
    col = {f: header.index(f) for f in need}
    for n, line in enumerate(fh, start=2):
        if not line.strip():
            continue
        where = f"{source}: line {n}"
        if len(line) > MAX_LINE:
            raise CalibrationError(f"{where}: longer than {MAX_LINE} characters")
        f = line.rstrip("\n").split("|")
        if len(f) != len(header):
            raise CalibrationError(f"{where}: expected {len(header)} fields separated by '|', got {len(f)}")
        if f[col["End"]] in ("", "Unknown"):
            continue  # still running: its exposure is not known yet
        try:
            nn = int(f[col["NNodes"]])
        except ValueError:
            raise CalibrationError(f"{where}: NNodes: expected a node count, got {f[col['NNodes']][:20]!r}") from None
        st = f[col["State"]].split(" ")[0].upper()
        runs.add(st[:40], nn, _epoch(f[col["Start"]], f"{where}: Start"), _epoch(f[col["End"]], f"{where}: End"))
    return runs


class _Prefixed:
    """A text file with a character already read put back in front."""

    def __init__(self, head: str, fh: IO[str]) -> None:
        self.head, self.fh = head, fh

    def read(self, n: int = -1) -> str:
        head, self.head = self.head, ""
        return head + self.fh.read(n if n < 0 else max(0, n - len(head)))


def read_sacct(text: str, source: str = "sacct") -> Runs:
    """:func:`read_sacct_file` of a string."""
    return read_sacct_file(io.StringIO(text), source)


# ---- which class an event is ----------------------------------------------------------------------------------------
def event_key(reason: str) -> str:
    """The code our drain reason names (``gpufleet: xid79 gpu3`` -> ``xid79``); Slurm's own DOWN reason as it is;
    anything else (a person's, another tool's) as ``other``."""
    code = reason_code(reason)
    if code is not None:
        return code or "other"
    if reason.startswith(NOT_RESPONDING):
        return NOT_RESPONDING
    return "other"


def _node_classes(sc: dict) -> List[dict]:
    """The base scenario's faults and its false positive (a passive check's drain of a healthy node, which the first
    repair step's verification clears: in Slurm's records and the agent's series it is a drain for its finding's
    code, as a real fault with that code is, so it is fitted with the classes that show that code). A scenario whose
    false-positive rate is 0 says its checks never drain a healthy node: none is fitted."""
    fp = sc.get("false_positive")
    return list(sc["faults"]) + ([fp] if fp and fp.get("per_node_h") else [])


def class_keys(sc: dict, brain) -> Dict[str, List[str]]:
    """Event key -> the base scenario's node-scope fault classes whose fault shows as that key, by the health rules."""
    keys: Dict[str, List[str]] = {}
    for f in _node_classes(sc):
        if f["scope"] != "node" or f["effect"] != "crash":
            continue  # a job's own faults are read from sacct; a rack's strike many nodes at once
        v = brain.judge(tuple(f["kmsg"])) if f["kmsg"] else brain.healthy_report()
        key = NOT_RESPONDING if v["verdict"] == "healthy" else event_key(v["drain_reason"])
        keys.setdefault(key, []).append(f["name"])
    return keys


# ---- the fit --------------------------------------------------------------------------------------------------------
def _gammp(a: float, x: float) -> float:
    """The regularized lower incomplete gamma P(a, x) (series below a + 1, continued fraction above)."""
    if x <= 0:
        return 0.0
    lg = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1:
        term = total = 1.0 / a
        ap = a
        for _unused in range(100000):
            ap += 1
            term *= x / ap
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return min(1.0, total * math.exp(lg))
    b, c, d = x + 1 - a, 1e300, 1.0 / (x + 1 - a)
    h = d
    for i in range(1, 100000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = 1e-300 if abs(d) < 1e-300 else d
        c = b + an / c
        c = 1e-300 if abs(c) < 1e-300 else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-15:
            break
    return max(0.0, 1.0 - math.exp(lg) * h)


def poisson_ci(k: int, level: float = 0.95) -> Tuple[float, float]:
    """Exact (Garwood) interval for the mean of a Poisson count ``k``."""
    alpha = 1 - level

    def solve(a: float, target: float) -> float:  # x with P(a, x) = target
        lo, hi = 0.0, max(10.0, 2 * a + 50 * math.sqrt(a + 1))
        for _unused in range(200):
            mid = (lo + hi) / 2
            if _gammp(a, mid) < target:
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2

    lower = 0.0 if k == 0 else solve(k, alpha / 2)
    return lower, solve(k + 1, 1 - alpha / 2)


#: seconds between one event's end and the node's next event's start that still make one episode (slurmdbd writes
#: both times to the second, from one clock reading or two)
EPISODE_GAP_S = 1.0


def episodes(events: List[Event]) -> List[Event]:
    """The times each node was out of service, one record per episode, with the state and reason it went out with.

    slurmdbd ends a node's event and opens another whenever the node's state or reason changes while it is out: a
    drained node that stops responding (a repair's reboot, or a slurmd too slow to answer), a drain whose reason is
    rewritten. Those later events are the same time out of service, not new faults: a fault strikes a node in
    service (the exposure is the time in service), so an event that begins when, or before, the node's previous
    out-of-service event ended continues that episode. Events that are not out of service (the leaf's rule:
    ``DOWN*``, ``IDLE+DRAIN`` and the like are) are left out."""
    out: List[Event] = []
    last: Dict[str, int] = {}  # node -> index in out of its latest episode
    for e in sorted((e for e in events if out_of_service(e.state)), key=lambda e: e.start):
        i = last.get(e.node)
        if i is not None:
            ep = out[i]
            if ep.end is None or e.start <= ep.end + EPISODE_GAP_S:
                if ep.end is not None:
                    out[i] = Event(ep.node, ep.start, None if e.end is None else max(ep.end, e.end), ep.state,
                                   ep.reason)
                continue
        last[e.node] = len(out)
        out.append(e)
    return out


def in_service_node_days(nodes: int, events: List[Event], t0: float, t1: float) -> float:
    """Node-days in service between t0 and t1 of a fleet of ``nodes``: every node's time, less its time out of
    service (an event still open counts to t1)."""
    out = 0.0
    for e in events:
        dt = min(t1 if e.end is None else e.end, t1) - max(e.start, t0)
        if dt > 0:
            out += dt
    return (nodes * (t1 - t0) - out) / DAY_S


def exposure(sc: dict, events: List[Event], runs: Runs, t0: float, t1: float) -> Tuple[float, str]:
    """The node-days in which a fault could strike, and what they are: the whole fleet in service when idle nodes
    fail too (the scenario's ``cluster.idle_nodes_fail``; the fleet's size is the scenario's ``cluster.nodes``), else
    the node-days of jobs running (sacct)."""
    if sc["cluster"].get("idle_nodes_fail", True):
        return in_service_node_days(sc["cluster"]["nodes"], events, t0, t1), "node-days in service (cluster.nodes)"
    if not runs:
        raise CalibrationError("sacct: no job runs in the records, and faults strike only running jobs "
                               "(cluster.idle_nodes_fail: false): the exposure is unknown; give --sacct")
    return runs.node_days(t0, t1), "node-days of jobs running (sacct)"


def fit(sc: dict, brain, events: List[Event], runs: Runs, t0: float, t1: float) -> dict:
    """Rates per event key and per class between t0 and t1 (episodes out of service that began in the window)."""
    events = episodes(events)
    expo, expo_what = exposure(sc, events, runs, t0, t1)
    if expo <= 0:
        raise CalibrationError(f"no exposure between {t0:.0f} and {t1:.0f} ({expo_what})")
    keys = class_keys(sc, brain)
    counts: Dict[str, int] = {}
    out_days: Dict[str, float] = {}
    for e in events:
        if not t0 <= e.start < t1:
            continue
        k = event_key(e.reason)
        counts[k] = counts.get(k, 0) + 1
        if e.end is not None:
            out_days[k] = out_days.get(k, 0.0) + (e.end - e.start) / DAY_S
    base = {f["name"]: f for f in _node_classes(sc)}
    groups = {}
    for key, names in keys.items():
        k = counts.get(key, 0)
        lo, hi = poisson_ci(k)
        groups[key] = {"classes": names, "count": k, "rate": 1000 * k / expo,
                       "ci95": [1000 * lo / expo, 1000 * hi / expo],
                       "mean_out_days": out_days[key] / k if k and key in out_days else None,
                       "base_rate": sum(_per_1000(base[n]) for n in names)}
    job_faults = [f["name"] for f in sc["faults"] if f["scope"] == "job" and f.get("per_node_h")]
    if job_faults and runs:  # a job's own software: per node-day of the job running
        jexpo = runs.node_days(t0, t1)
        failed = runs.ended(("FAILED",), t0, t1)
        lo, hi = poisson_ci(failed)
        groups["job"] = {"classes": job_faults, "count": failed, "rate": 1000 * failed / jexpo if jexpo else 0.0,
                         "ci95": [1000 * lo / jexpo, 1000 * hi / jexpo] if jexpo else [0.0, 0.0],
                         "mean_out_days": None, "exposure_node_days": jexpo,
                         "base_rate": sum(_per_1000(base[n]) for n in job_faults)}
    unknown = {k: n for k, n in counts.items() if k not in keys}
    crashes = runs.ended(CRASH_STATES, t0, t1)
    return {"window": [t0, t1], "exposure_node_days": expo, "exposure": expo_what, "groups": groups,
            "unmatched": unknown, "interruptions": crashes, "job_node_days": runs.node_days(t0, t1),
            "jobs": runs.sizes(t0, t1)}


def _per_1000(fault: dict) -> float:
    """A validated fault's rate per 1,000 node-days."""
    return float(fault.get("per_node_h") or 0.0) * 24000.0


def calibrated_raw(sc: dict, res: dict) -> dict:
    """The base scenario's raw mapping with each class's rate from the site's records and its source."""
    out = copy.deepcopy(sc["raw"])
    by_name = {f.get("name"): f for f in out.get("faults") or []}
    base = {f["name"]: f for f in _node_classes(sc)}
    window = [time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t)) for t in res["window"]]
    for key, g in res["groups"].items():
        share_base = g["base_rate"]
        for name in g["classes"]:
            if name == "false_positive":
                _false_positives(out, g, key, share_base, _per_1000(base[name]), res, window)
                continue
            f = by_name[name]
            prior = _per_1000(base[name])
            share = prior / share_base if share_base > 0 else 1.0 / len(g["classes"])
            expo = g.get("exposure_node_days", res["exposure_node_days"])
            src = {"kind": "site", "count": g["count"], "exposure_node_days": round(expo, 3),
                   "window": window, "ci95": [round(x * share, 6) for x in g["ci95"]], "key": key}
            if len(g["classes"]) > 1:
                src["shared_with"] = [n for n in g["classes"] if n != name]
                src["split"] = "the records cannot tell these classes apart: the group's rate split by base rates"
            if g["count"] == 0:
                src = {"kind": "base", "site_upper95": src["ci95"][1], "window": window,
                       "note": "no event of this class in the records: the base rate is kept"}
            else:
                for k in ("rate_per_gpu_year", "job_mtbf_h"):
                    f.pop(k, None)
                f["rate_per_1000_node_days"] = round(g["rate"] * share, 6)
            f["source"] = src
    return out


FP_PATH = "false_positives.rate_per_1000_node_days"


def _false_positives(out: dict, g: dict, key: str, share_base: float, prior: float, res: dict,
                     window: List[str]) -> None:
    """The false positives' share of their code's fitted rate, written with a ``sources:`` entry (and no longer an
    estimate to vary: the site's records bound it), as the classes that share a code are."""
    if g["count"] == 0:
        return  # no drain with the code: the base rate and its estimate range stay
    share = prior / share_base if share_base > 0 else 1.0 / len(g["classes"])
    fp = out.get("false_positives")
    fp = dict(fp) if isinstance(fp, dict) else {}
    fp["rate_per_1000_node_days"] = round(g["rate"] * share, 6)
    out["false_positives"] = fp
    src = {"kind": "site", "count": g["count"], "key": key, "window": window,
           "exposure_node_days": round(g.get("exposure_node_days", res["exposure_node_days"]), 3),
           "ci95": [round(x * share, 6) for x in g["ci95"]],
           "why": "drains with the code the false positive shows; the records cannot tell a passive check's false "
                  "alarm from a real fault with that code: the code's rate split by base rates"}
    if len(g["classes"]) > 1:
        src["shared_with"] = [n for n in g["classes"] if n != "false_positive"]
    add_sources(out, [{"paths": [FP_PATH], "source": src}])


def add_sources(raw: dict, entries: List[dict]) -> None:
    """``entries`` (``{paths, source}``) added to the scenario's ``sources:``; an estimate of a path they now give is
    no longer a guess to vary, so it leaves ``estimates:``."""
    if not entries:
        return
    raw["sources"] = list(raw.get("sources") or []) + entries
    fitted = {p for e in entries for p in e["paths"]}
    if isinstance(raw.get("estimates"), list):
        raw["estimates"] = [e for e in raw["estimates"]
                            if not (isinstance(e, dict) and str(e.get("path", "")).strip() in fitted)]


# ---- the held-out check ---------------------------------------------------------------------------------------------
def holdout_cut(t0: float, t1: float, share: float) -> float:
    """Where the held-out part begins: the last ``share`` of [t0, t1)."""
    return t1 - share * (t1 - t0)


def holdout(sc: dict, brain, events: List[Event], runs: Runs, t0: float, t1: float, share: float) -> List[dict]:
    """Fit on [t0, cut), predict [cut, t1): per group and for interruptions, observed against a 95 % interval
    (the fitted rate's interval times the later exposure, widened by the later count's own Poisson spread)."""
    cut = holdout_cut(t0, t1, share)
    early = fit(sc, brain, events, runs, t0, cut)
    late = fit(sc, brain, events, runs, cut, t1)
    expo_late = late["exposure_node_days"]
    rows = []
    for key, g in early["groups"].items():
        e_late = late["groups"][key].get("exposure_node_days", expo_late)
        mean = g["rate"] * e_late / 1000
        lo_m, hi_m = g["ci95"][0] * e_late / 1000, g["ci95"][1] * e_late / 1000
        lo = poisson_ci_quantile(lo_m, 0.025)
        hi = poisson_ci_quantile(hi_m, 0.975)
        rows.append({"what": f"{'/'.join(g['classes'])} ({key})", "observed": late["groups"][key]["count"],
                     "predicted": mean, "interval": [lo, hi]})
    ej, lj = early["job_node_days"], late["job_node_days"]
    rate = early["interruptions"] / ej if ej else 0.0
    lo_r, hi_r = poisson_ci(early["interruptions"])
    scale = lj / ej if ej else 0.0
    interval = [poisson_ci_quantile(lo_r * scale, 0.025), poisson_ci_quantile(hi_r * scale, 0.975)]
    rows.append({"what": "interruptions (runs ended NODE_FAIL or FAILED)", "observed": late["interruptions"],
                 "predicted": rate * lj, "interval": interval})
    rows.append(_out_of_service(events, early, expo_late, t0, cut, t1))
    return rows


def _out_of_service(events: List[Event], early: dict, expo_late: float, t0: float, cut: float, t1: float) -> dict:
    """Node-days out of service of the episodes that begin in [cut, t1) (up to t1), against the early fit: per
    group the later count times the early episodes' mean length, a compound Poisson spread (the count's and the
    lengths', from their second moment) and the rates' own uncertainty, as a normal 95 % interval."""
    keys = {key for key in early["groups"] if key != "job"}
    lengths: Dict[str, List[float]] = {}
    observed = 0.0
    for e in episodes(events):
        k = event_key(e.reason)
        if k not in keys:
            continue
        if t0 <= e.start < cut and e.end is not None and e.end <= cut:
            lengths.setdefault(k, []).append((e.end - e.start) / DAY_S)
        elif cut <= e.start < t1:
            observed += (min(t1, e.end if e.end is not None else t1) - e.start) / DAY_S
    mean = var = 0.0
    for key in keys:
        d = lengths.get(key)
        if not d:
            continue
        g = early["groups"][key]
        n = g["rate"] * expo_late / 1000
        m1 = sum(d) / len(d)
        m2 = sum(x * x for x in d) / len(d)
        n_sd = (g["ci95"][1] - g["ci95"][0]) * expo_late / 1000 / 3.919928
        mean += n * m1
        var += n * m2 + (m1 * n_sd) ** 2
    half = 1.959964 * math.sqrt(var)
    return {"what": "node-days out of service (episodes that began then)", "observed": round(observed, 2),
            "predicted": mean, "interval": [round(max(0.0, mean - half), 2), round(mean + half, 2)]}


def poisson_ci_quantile(mu: float, q: float) -> int:
    """The ``q`` quantile of a Poisson count with mean ``mu``."""
    if mu <= 0:
        return 0
    k, p, total = 0, math.exp(-mu), 0.0
    if p == 0.0:  # a large mean: the normal approximation
        return max(0, int(round(mu + (1.959964 if q > 0.5 else -1.959964) * math.sqrt(mu))))
    while True:
        total += p
        if total >= q:
            return k
        k += 1
        p *= mu / k


class _Ticking:
    """A text file that reports how far it has been read (its bytes, from the OS's file position) every so often:
    the progress of a long read, at the cost of one tell() per 16,384 lines or per chunk."""

    def __init__(self, fh: IO[str], tick: Callable[[int], None]) -> None:
        self._fh, self._tick = fh, tick

    def _where(self) -> None:
        try:
            self._tick(self._fh.buffer.raw.tell())  # type: ignore[attr-defined]
        except (AttributeError, OSError, ValueError):
            pass

    def read(self, n: int = -1) -> str:
        data = self._fh.read(n)
        self._where()
        return data

    def readline(self) -> str:
        return self._fh.readline()

    def __iter__(self):
        for i, line in enumerate(self._fh):
            if not i & 0x3FFF:
                self._where()
            yield line


def load_records(events_path: Optional[str], sacct_path: Optional[str],
                 progress: Optional[Callable[[int, int], None]] = None) -> Tuple[List[Event], Runs]:
    """The records from their files; ``progress(bytes read, bytes in all)`` is called as they are read."""
    events: List[Event] = []
    runs = Runs()
    paths = [p for p in (events_path, sacct_path) if p]
    total = 0
    for p in paths:
        try:
            total += os.path.getsize(p)
        except OSError:
            pass  # open() below names the file
    done = 0

    def source(fh: IO[str]) -> Any:
        if progress is None:
            return fh
        base = done
        return _Ticking(fh, lambda pos: progress(base + pos, total))

    if events_path:
        with open(events_path, encoding="utf-8", errors="replace") as fh:
            events = read_events(source(fh), events_path)
        done += os.path.getsize(events_path)
    if sacct_path:
        with open(sacct_path, encoding="utf-8", errors="replace") as fh:
            runs = read_sacct_file(source(fh), sacct_path)
        done += os.path.getsize(sacct_path)
    if progress is not None:
        progress(total, total)
    return events, runs


def window_of(events: List[Event], runs: Runs) -> Tuple[float, float]:
    lows = [min(runs.start)] if len(runs) else []
    highs = [max(runs.end)] if len(runs) else []
    if events:
        lows.append(min(e.start for e in events))
        highs.append(max(e.start for e in events))
    if not lows:
        raise CalibrationError("the records are empty: no job run and no node event")
    # one second past the last record (Slurm's records have one-second times): the window is [t0, t1), and the
    # last event - often the one that ended the last job, at the same second - belongs in it
    return min(lows), max(highs) + 1.0
