"""``gpufleet-sim run --export-history DIR``: what one simulated run did, in the formats of a real cluster's records.

* ``events.txt``: Slurm's node events as ``sacctmgr -P show event
  format=Cluster,NodeName,TimeStart,TimeEnd,State,Reason,User`` prints them (a header line, ``|`` between fields,
  times as ``YYYY-MM-DDTHH:MM:SS`` UTC, ``Unknown`` for a node still out at the end). They come from the virtual
  Slurm, the one writer of the simulated nodes' records (vslurm.py).
* ``sacct.json``: the jobs' runs as ``sacct --json`` gives them (Slurm 24.11's shape): one record per run, ended
  by a crash (``NODE_FAIL``; ``FAILED`` for a fault of the job's own software), a drain's requeue (``REQUEUED``),
  the end of the work (``COMPLETED``) or the end of the horizon (``RUNNING``).

* ``nodes.jsonl``: the nodes' repair histories as Slurm's node records hold them (the ``Extra`` field), one
  ``scontrol show node NAME --json`` document a line, written at each change of a node's history: what a site's
  dumps of its node records (a cron job appending ``scontrol show node --json | jq -c .``) show, taken often.

* ``series.jsonl``: the agent's series as Prometheus keeps them, one ``query_range`` result a line
  (``{"metric": {"__name__": ..., labels}, "values": [[time, "value"], ...]}``): ``gpufleet_health_verdict``
  (``verdict="unhealthy"``: 1 or 0), ``gpufleet_health_drain_requested`` and ``gpufleet_health_finding`` (one series
  per finding, with the agent's labels), sampled at each report the simulated agent made (at a fault's detection
  and at each repair's verification), as a Prometheus that scraped at those moments would hold them.

``gpufleet-sim calibrate`` reads them back, so calibrating an exported run can be checked against the scenario that
made it (tests/unit/simulator/test_calibrate.py: the coverage test).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from ansible_collections.gpufleet.reliability.plugins.module_utils.health.metrics import (
    DRAIN_METRIC,
    FINDING_METRIC,
    VERDICT_METRIC,
    finding_labels,
)

from .brain import to_epoch
from .report import _atomic_write

CLUSTER = "sim"
EVENT_FIELDS = ("Cluster", "NodeName", "TimeStart", "TimeEnd", "State", "Reason", "User")


def iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(epoch))


NOT_KEPT = "the run kept no records: call sim.keep_records() before sim.run()"


def _kept(sim) -> None:
    if sim.vslurm.events is None or any(job.runs is None for job in sim.jobs):
        raise ValueError(NOT_KEPT)


def events_text(events) -> str:
    if events is None:
        raise ValueError(NOT_KEPT)
    lines = ["|".join(EVENT_FIELDS)]
    for name, start, end, state, reason, user in events:
        lines.append("|".join((CLUSTER, name, iso(start), "Unknown" if end is None else iso(end), state,
                               reason.replace("|", " "), user)))
    return "\n".join(lines) + "\n"


def sacct_json(sim) -> dict:
    _kept(sim)
    jobs = []
    jid = 1000
    for job in sim.jobs:
        nnodes = len(job.nodes)
        for start_h, end_h, state in job.runs:
            jid += 1
            start, end = to_epoch(start_h), to_epoch(end_h)
            jobs.append({"job_id": jid, "name": job.name, "state": {"current": [state], "reason": "None"},
                         "allocation_nodes": nnodes, "cluster": CLUSTER,
                         "time": {"start": start, "end": end, "elapsed": end - start}})
    return {"jobs": jobs, "meta": {"plugin": {"name": "gpufleet-sim export"}}}


def nodes_jsonl(history_log) -> str:
    """One ``scontrol show node NAME --json`` document a line for each write of a node's repair history."""
    lines = []
    for _at, name, text in history_log or ():
        lines.append(json.dumps({"nodes": [{"name": name, "extra": text}], "errors": []}, separators=(",", ":")))
    return "\n".join(lines) + ("\n" if lines else "")


def series_jsonl(report_log) -> str:
    """The agent's series (verdict, drain request, findings) at each report of ``report_log``, one series a line."""
    verdict: dict = {}
    drain: dict = {}
    findings: dict = {}
    for at, name, rep in report_log or ():
        t = round(float(at), 3)
        verdict.setdefault(name, []).append([t, "1" if rep.get("verdict") == "unhealthy" else "0"])
        drain.setdefault(name, []).append([t, "1" if rep.get("drain") else "0"])
        for f in rep.get("findings") or ():
            if f.get("severity") == "info":
                continue
            labels = finding_labels(name, f.get("check") or "", f.get("code") or "", f.get("gpu"),
                                    f.get("severity") or "", f.get("action") or "none")
            findings.setdefault(tuple((k, str(v)) for k, v in labels.items()), []).append([t, "1"])

    def samples(values: list) -> list:  # one sample a time, in time order (a later report at one time wins)
        return sorted(dict(values).items())

    lines = []
    for name, values in verdict.items():
        lines.append({"metric": {"__name__": VERDICT_METRIC, "node": name, "verdict": "unhealthy"},
                      "values": samples(values)})
        lines.append({"metric": {"__name__": DRAIN_METRIC, "node": name}, "values": samples(drain[name])})
    for labels, values in findings.items():
        lines.append({"metric": {"__name__": FINDING_METRIC, **dict(labels)}, "values": samples(values)})
    return "".join(json.dumps(x, separators=(",", ":")) + "\n" for x in lines)


def export_history(sim, out: Path) -> dict:
    """Write the run's records into ``out`` (created if missing); the paths written. The run must have kept them
    (``sim.keep_records()`` before it ran); the nodes' repair histories and the agent's series are there when it kept
    those too."""
    _kept(sim)
    out = Path(out)
    files = {"events": out / "events.txt", "sacct": out / "sacct.json"}
    _atomic_write(files["events"], events_text(sim.vslurm.events).encode())
    _atomic_write(files["sacct"], (json.dumps(sacct_json(sim), indent=1) + "\n").encode())
    if sim.vslurm.history_log is not None:
        files["nodes"] = out / "nodes.jsonl"
        _atomic_write(files["nodes"], nodes_jsonl(sim.vslurm.history_log).encode())
    if sim.vslurm.report_log is not None:
        files["series"] = out / "series.jsonl"
        _atomic_write(files["series"], series_jsonl(sim.vslurm.report_log).encode())
    return files
