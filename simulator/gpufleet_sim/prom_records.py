"""The agent's series in Prometheus, read back for ``gpufleet-sim calibrate --prometheus``.

The node agent writes its verdict, its findings and its Xid counters as Prometheus metrics (the textfile that
node_exporter serves, plugins/module_utils/health/metrics.py). A site that keeps them in Prometheus has the record
of every time a node was judged unhealthy, with the finding that made it so, whether or not it has slurmdbd.

Read from the server's HTTP API (``GET /api/v1/query_range``, one query per metric over the window, at a step) or
from a file of saved answers (``--prometheus-file``: JSON lines, each one answer of ``query_range`` as the API
returns it, or one element of its ``data.result``: ``{"metric": {"__name__": ..., labels}, "values": [[t, "v"],
...]}``; ``curl -s 'http://prom:9090/api/v1/query_range?query=gpufleet_health_verdict&start=..&end=..&step=60' >>
series.jsonl`` makes one). ``gpufleet-sim run --export-history`` writes one (``series.jsonl``).

What is read, per node:

* **episodes**: a stretch of samples where ``gpufleet_health_verdict{verdict="unhealthy"}`` is 1 (or
  ``gpufleet_health_drain_requested`` is 1), from its first such sample to the first sample that says otherwise
  (missing samples, a node whose agent could not report, end nothing). An episode is what the agent drains a node
  for, so it becomes an event like Slurm's drain: its reason is the one the agent writes, ``gpufleet: <code> ...``
  of the report's worst finding (``Report.drain_reason``, built from the ``gpufleet_health_finding`` series of the
  episode's first sample), and ``calibrate`` matches it to a class by the same rule as Slurm's events.
* **Xid events**: the increase of ``gpufleet_gpu_xid_errors_total`` per code over the window (counter resets
  counted as Prometheus's ``increase`` counts them): the kernel-log lines behind the findings, for the report.
* **Time to detect**: a fault is seen at the first check after it, and a check takes its own time, so detection
  is the check interval (a uniform wait up to it) plus the check's run time. Each check is one distinct value of
  ``gpufleet_health_last_run_timestamp_seconds``: the gaps between a node's checks give the interval (their median;
  gaps over six hours are a node out of service, not its timer), and ``gpufleet_health_check_duration_seconds`` at
  each check gives the run time (median and 90th percentile).

Every answer is checked as hostile input: its shape, each label and each sample, by file and line or by query, with
a bound on the size read.
"""

from __future__ import annotations

import json
import math
import statistics
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import IO, Any, Dict, Iterable, List, Optional, Tuple, Union

from ansible_collections.gpufleet.reliability.plugins.module_utils.health.metrics import (
    DRAIN_METRIC,
    DURATION_METRIC,
    FINDING_METRIC,
    LAST_RUN_METRIC,
    VERDICT_METRIC,
    XID_METRIC,
)
from ansible_collections.gpufleet.reliability.plugins.module_utils.health.report import Finding, Report
from ansible_collections.gpufleet.reliability.plugins.module_utils.slurmfacts import drain_reason

from .calibrate import CalibrationError, Event, add_sources

#: the metrics read (the agent's names, plugins/module_utils/health/metrics.py) and the query of each
QUERIES = {VERDICT_METRIC: f'{VERDICT_METRIC}{{verdict="unhealthy"}}',
           **{m: m for m in (FINDING_METRIC, DRAIN_METRIC, XID_METRIC, LAST_RUN_METRIC, DURATION_METRIC)}}
#: checks needed before the site's check interval and check time replace the scenario's
MIN_CHECKS = 5
#: a gap between two checks longer than this is a node out of service or not reporting, not its timer
MAX_INTERVAL_S = 6 * 3600.0
#: one answer (a line of a file, or a server's reply) longer than this is not one we read
MAX_ANSWER = 256 << 20
MAX_LABEL = 256
#: the most samples one query_range answer may hold (Prometheus itself refuses more than 11,000 per series)
MAX_POINTS = 11000


class PromError(CalibrationError):
    """Series that cannot be read: names the file and line, or the query, and what was expected."""


@dataclass
class Series:
    name: str
    labels: Dict[str, str]
    values: List[Tuple[float, float]] = field(default_factory=list)


# ---- reading answers ------------------------------------------------------------------------------------------------
def _labels(v: Any, where: str) -> Dict[str, str]:
    if not isinstance(v, dict):
        raise PromError(f"{where}: metric: expected a mapping of labels, got {type(v).__name__}")
    out = {}
    for k, x in v.items():
        if not isinstance(k, str) or not isinstance(x, str) or len(k) > MAX_LABEL or len(x) > MAX_LABEL:
            raise PromError(f"{where}: metric: expected labels as short text, got {str(k)[:40]!r}")
        out[k] = x
    return out


def _values(v: Any, where: str) -> List[Tuple[float, float]]:
    if not isinstance(v, list):
        raise PromError(f"{where}: values: expected a list of [time, \"value\"], got {type(v).__name__}")
    out = []
    last = -math.inf
    for i, pair in enumerate(v):
        if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], (int, float))
                and not isinstance(pair[0], bool) and isinstance(pair[1], str)):
            raise PromError(f"{where}: values[{i}]: expected [time, \"value\"], got {str(pair)[:60]}")
        t = float(pair[0])
        try:
            x = float(pair[1])
        except ValueError:
            raise PromError(f"{where}: values[{i}]: expected a number as text, got {pair[1][:40]!r}") from None
        if not math.isfinite(t) or t <= last:
            raise PromError(f"{where}: values[{i}]: expected times that rise, got {pair[0]!r} after {last}")
        last = t
        out.append((t, x))
    return out


def _series(item: Any, where: str, name: Optional[str] = None) -> Series:
    if not isinstance(item, dict) or "values" not in item:
        raise PromError(f"{where}: expected a range series {{metric, values}} (a query_range answer's "
                        f"data.result element)")
    labels = _labels(item.get("metric", {}), where)
    metric = labels.pop("__name__", None) or name
    if not metric:
        raise PromError(f"{where}: metric: no __name__ (save plain selectors such as {VERDICT_METRIC}, whose answers "
                        f"keep it)")
    return Series(metric, labels, _values(item["values"], where))


def _answer(doc: Any, where: str, name: Optional[str] = None) -> List[Series]:
    """The series of one query_range answer, or of one series saved alone."""
    if isinstance(doc, dict) and "status" in doc:
        if doc.get("status") != "success":
            raise PromError(f"{where}: the server answered {str(doc.get('status'))[:20]!r}: "
                            f"{str(doc.get('error'))[:200]}")
        data = doc.get("data")
        if not isinstance(data, dict) or data.get("resultType") != "matrix" or not isinstance(
                data.get("result"), list):
            raise PromError(f"{where}: expected data.resultType matrix with a result list (query_range)")
        return [_series(s, f"{where}: result[{i}]", name) for i, s in enumerate(data["result"])]
    return [_series(doc, where, name)]


def _parse(text: Union[str, bytes], where: str, name: Optional[str] = None) -> List[Series]:
    """The series of one answer's text, bounded and checked."""
    if len(text) > MAX_ANSWER:
        raise PromError(f"{where}: an answer longer than {MAX_ANSWER} bytes")
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise PromError(f"{where}: not JSON ({str(e)[:80]})") from None
    return _answer(doc, where, name)


def read_series_file(fh: IO[str], source: str = "series") -> List[Series]:
    """JSON lines of saved answers (see the module's text)."""
    out: List[Series] = []
    for n, line in enumerate(fh, start=1):
        if not line.strip():
            continue
        out += _parse(line, f"{source}: line {n}")
    return out


def query_range(base: str, query: str, start: float, end: float, step: float, timeout: float = 60.0,
                name: Optional[str] = None) -> List[Series]:
    """One ``/api/v1/query_range`` of a Prometheus server (http or https). The window is cut in pieces of at most
    MAX_POINTS steps, as Prometheus refuses more."""
    parts = urllib.parse.urlsplit(base)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise PromError(f"--prometheus: expected the server's URL (http://host:9090), got {base[:80]!r}")
    out: Dict[Tuple[str, Tuple[Tuple[str, str], ...]], Series] = {}
    t = start
    while t < end:
        stop = min(end, t + step * (MAX_POINTS - 1))
        q = urllib.parse.urlencode({"query": query, "start": f"{t:.3f}", "end": f"{stop:.3f}", "step": f"{step:g}"})
        url = f"{base.rstrip('/')}/api/v1/query_range?{q}"
        where = f"{query} ({base})"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - the scheme is checked above
                body = resp.read(MAX_ANSWER + 1)
        except urllib.error.HTTPError as e:
            body = e.read(MAX_ANSWER + 1)  # Prometheus says why in the body (bad_data, execution)
            if not body:
                raise PromError(f"{where}: HTTP {e.code}") from None
        except (urllib.error.URLError, OSError) as e:
            raise PromError(f"{where}: cannot reach the server: {getattr(e, 'reason', e)}") from None
        for s in _parse(body, where, name):
            key = (s.name, tuple(sorted(s.labels.items())))
            have = out.get(key)
            if have is None:
                out[key] = s
            else:  # the next piece: samples after the last one kept (the pieces share their edge)
                last = have.values[-1][0] if have.values else -math.inf
                have.values += [v for v in s.values if v[0] > last]
        t = stop + step
    return list(out.values())


def fetch(base: str, start: float, end: float, step: float, timeout: float = 60.0) -> List[Series]:
    """The series calibrate reads, from a server, over [start, end]."""
    out: List[Series] = []
    for name, query in QUERIES.items():
        out += query_range(base, query, start, end, step, timeout, name)
    return out


# ---- what they say --------------------------------------------------------------------------------------------------
def _finding(labels: Dict[str, str]) -> Optional[Finding]:
    gpu = labels.get("gpu", "")
    try:
        return Finding(check=labels.get("check", ""), severity=labels.get("severity", ""), detail="",
                       action=labels.get("action", "none"), code=labels.get("code", ""),
                       gpu=int(gpu) if gpu.isdigit() else None)
    except ValueError:
        return None  # a severity or action the rules do not know: not the agent's


def episodes(series: Iterable[Series]) -> List[Event]:
    """The agent's unhealthy (or drain-asking) stretches, one Event each, with the drain reason the agent writes."""
    sick: Dict[str, Dict[float, bool]] = {}
    findings: Dict[Tuple[str, float], List[Finding]] = {}
    for s in series:
        node = s.labels.get("node", "")
        if not node:
            continue
        if s.name == VERDICT_METRIC and s.labels.get("verdict") == "unhealthy" or s.name == DRAIN_METRIC:
            seen = sick.setdefault(node, {})
            for t, x in s.values:
                seen[t] = seen.get(t, False) or x == 1
        elif s.name == FINDING_METRIC:
            f = _finding(s.labels)
            if f is not None:
                for t, x in s.values:
                    if x == 1:
                        findings.setdefault((node, t), []).append(f)
    out = []
    for node, seen in sick.items():
        start: Optional[float] = None
        for t in sorted(seen):
            if seen[t] and start is None:
                start = t
            elif not seen[t] and start is not None:
                out.append(_event(node, start, t, findings))
                start = None
        if start is not None:
            out.append(_event(node, start, None, findings))
    out.sort(key=lambda e: (e.start, e.node))
    return out


def _event(node: str, start: float, end: Optional[float],
           findings: Dict[Tuple[str, float], List[Finding]]) -> Event:
    report = Report(findings=findings.get((node, start), []))
    reason = report.drain_reason() if report.worst is not None else drain_reason("unknown")
    return Event(node, start, end, "DRAIN", reason)


def xid_counts(series: Iterable[Series], t0: float, t1: float, grace: float) -> Dict[str, float]:
    """Xid lines per code between t0 and t1: each counter's increase (a drop is a reset: counted from zero). A
    counter whose first sample comes more than ``grace`` seconds after t0 was created in the window (the agent writes
    a GPU's counter for a code at its first line of that code): its first value counts too."""
    out: Dict[str, float] = {}
    for s in series:
        if s.name != XID_METRIC:
            continue
        code = s.labels.get("xid", "")
        prev = None
        total = 0.0
        for t, x in s.values:
            if t < t0 or t >= t1:
                continue
            if prev is not None:
                total += x - prev if x >= prev else x
            elif t > t0 + grace:
                total += x
            prev = x
        if total:
            out[code] = out.get(code, 0.0) + total
    return out


def detection(series: Iterable[Series], t0: float, t1: float) -> dict:
    """The agent's checks between t0 and t1: how many, the median interval between a node's checks and the check's
    run time (median, p90), in minutes; None for what fewer than MIN_CHECKS checks cannot say."""
    runs: Dict[str, Dict[float, float]] = {}  # node -> sample time -> the check it shows (its start, epoch)
    took: Dict[str, Dict[float, float]] = {}  # node -> sample time -> that check's run time, seconds
    for s in series:
        if s.name not in (LAST_RUN_METRIC, DURATION_METRIC) or not s.labels.get("node"):
            continue
        into = (runs if s.name == LAST_RUN_METRIC else took).setdefault(s.labels["node"], {})
        for t, x in s.values:
            if t0 <= t < t1 and math.isfinite(x):
                into[t] = x
    gaps: List[float] = []
    durations: List[float] = []
    for node, seen in runs.items():
        checks: Dict[float, Optional[float]] = {}
        for t in sorted(seen):
            checks.setdefault(seen[t], took.get(node, {}).get(t))
        starts = sorted(checks)
        gaps += [b - a for a, b in zip(starts, starts[1:]) if 0 < b - a <= MAX_INTERVAL_S]
        durations += [d for d in checks.values() if d is not None and d >= 0]
    out: dict = {"checks": sum(len(set(seen.values())) for seen in runs.values()), "interval_min": None,
                 "duration_min": None}
    if len(gaps) >= MIN_CHECKS:
        out["interval_min"] = statistics.median(gaps) / 60.0
    if len(durations) >= MIN_CHECKS:
        out["duration_min"] = {"median": statistics.median(durations) / 60.0,
                               "p90": statistics.quantiles(durations, n=10, method="inclusive")[8] / 60.0}
    return out


def calibrated_detection(raw: dict, found: dict, window: List[str]) -> dict:
    """``raw`` (a scenario's mapping, changed in place and returned) with the check interval and the check's run time
    the agent's series show, each with a ``sources:`` entry; what they cannot show is left as it was."""
    rep = raw.setdefault("repair", {})
    if not isinstance(rep, dict):
        raise CalibrationError("the base scenario's repair section is not a mapping")
    entries = []
    if found.get("interval_min"):
        rep["check_interval_min"] = round(found["interval_min"], 3)
        entries.append({"paths": ["repair.check_interval_min"], "source": {
            "kind": "site", "count": found["checks"], "window": list(window),
            "why": "the agent's series: the median gap between a node's checks (last-run timestamps)"}})
    d = found.get("duration_min")
    if d and d["median"] > 0:
        rep["check_detect_min"] = ({"dist": "lognormal", "median": round(d["median"], 4), "p90": round(d["p90"], 4)}
                                   if d["p90"] > d["median"] else round(d["median"], 4))
        entries.append({"paths": ["repair.check_detect_min"], "source": {
            "kind": "site", "count": found["checks"], "window": list(window),
            "why": "the agent's series: each check's run time (check duration at each last-run timestamp)"}})
    add_sources(raw, entries)
    return raw


def load(base: Optional[str], path: Optional[str], start: float, end: float, step: float) -> List[Series]:
    """The series from a server (``base``) or a file (``path``)."""
    if path:
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                return read_series_file(fh, path)
        except OSError as e:
            raise PromError(f"{path}: cannot read: {e.strerror}") from None
    if not base:
        raise PromError("--prometheus: expected the server's URL, or --prometheus-file")
    return fetch(base, start, end, step)
