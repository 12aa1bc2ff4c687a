# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Slurm's output -> ``Node`` objects and job records. Every string here comes from outside: hostile until parsed.

JSON: Slurm 22.05 ``sinfo --json`` (openapi/v0.0.38), Slurm >= 23.02 ``scontrol show node --json`` (data_parser,
e.g. v0.0.42 on 24.11), 24.11's ``sinfo --json`` rows, and slurmrestd's ``/nodes``. Text: ``scontrol -o -d show
node`` and the ``squeue`` format the CLI client asks for.
"""
from __future__ import annotations

import json
import re
import time
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

from ..slurmfacts import is_job_id
from .errors import SlurmError
from .node import Node, split_state

Nodes = Dict[str, Node]


def _num(value: Any) -> Optional[int]:
    """A Slurm number: int, or {"set": bool, "infinite": bool, "number": n} (data_parser >= v0.0.40)."""
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite"):
            return None
        value = value.get("number")
    if value in (None, "", 0):
        return None
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: JSON Infinity
        return None


def _list(value: Any) -> List[str]:
    if value in (None, "", "(null)"):
        return []
    if isinstance(value, str):
        return [v for v in value.split(",") if v and v != "(null)"]
    return [str(v) for v in value if v]


def _str(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


def _node_from_json(n: Mapping[str, Any]) -> Node:
    """One node from 22.05 sinfo --json (v0.0.38) or >= 23.02 scontrol show node --json (data_parser)."""
    state, flags = split_state(n.get("state"), n.get("state_flags") or ())
    nxt = n.get("next_state_after_reboot")
    if isinstance(nxt, list):
        nxt = "+".join(nxt)
    nxt = (nxt or "").lower()
    if nxt == "invalid":
        nxt = ""
    return Node(
        name=str(n["name"]),
        state=state,
        flags=flags,
        reason=n.get("reason") or "",
        reason_user=n.get("reason_set_by_user") or "",
        reason_time=_num(n.get("reason_changed_at")),
        partitions=_list(n.get("partitions")),
        features=_list(n.get("active_features") or n.get("features")),
        gres=n.get("gres") or "",
        gres_used=n.get("gres_used") or "",
        comment=n.get("comment") or "",
        extra=n.get("extra") or "",
        boot_time=_num(n.get("boot_time")),
        next_state=nxt,
        cpus=_num(n.get("cpus")),
        alloc_cpus=_num(n.get("alloc_cpus")) or 0,
        address=n.get("address") or "",
        version=n.get("version") or n.get("slurmd_version") or "",
    )


def _nodes_from_sinfo_rows(rows: Iterable[Mapping[str, Any]]) -> Nodes:
    """24.11 sinfo --json: one row per (state, partition) group, each naming its nodes."""
    nodes: Nodes = {}
    for row in rows:
        names = (row.get("nodes") or {}).get("nodes") or []
        state, flags = split_state((row.get("node") or {}).get("state"))
        reason = row.get("reason") or {}
        if isinstance(reason, str):
            reason = {"description": reason}
        feats = row.get("features") or {}
        gres = row.get("gres") or {}
        part = (row.get("partition") or {}).get("name")
        for name in names:
            node = nodes.get(name)
            if node is None:
                node = nodes[name] = Node(
                    name=name, state=state, flags=flags, reason=reason.get("description") or "",
                    reason_user=reason.get("user") or "", reason_time=_num(reason.get("time")),
                    features=_list(feats.get("active") or feats.get("total")),
                    gres=gres.get("total") or "", gres_used=gres.get("used") or "",
                    comment=row.get("comment") or "", extra=row.get("extra") or "",
                )
            if part and part not in node.partitions:
                node.partitions.append(part)
    return nodes


def parse_nodes_json(text: str) -> Nodes:
    """Nodes from any supported JSON shape -> {name: Node}. Raises SlurmError(kind='parse')."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested too deeply for the decoder
        raise SlurmError(f"cannot parse Slurm JSON output: {exc}", stdout=text[:2000], kind="parse")
    if not isinstance(data, dict):
        raise SlurmError("Slurm JSON output is not an object", stdout=text[:2000], kind="parse")
    errors = data.get("errors") or []
    if not isinstance(errors, list):
        raise SlurmError("unexpected Slurm JSON shape (errors is not a list)", stdout=text[:2000], kind="parse")
    errors = [e for e in errors if e]
    try:
        if "nodes" in data and isinstance(data["nodes"], list):
            nodes: Nodes = {}
            for n in data["nodes"]:
                node = _node_from_json(n)
                nodes[node.name] = node
        elif "sinfo" in data:
            nodes = _nodes_from_sinfo_rows(data["sinfo"])
        else:
            raise KeyError("nodes")
    except (KeyError, TypeError, AttributeError) as exc:
        raise SlurmError(f"unexpected Slurm JSON shape (missing {exc})", stdout=text[:2000], kind="parse")
    if errors and not nodes:
        msgs = "; ".join(str(e.get("description") or e.get("error") or e) if isinstance(e, dict) else str(e)
                         for e in errors)
        raise SlurmError(f"Slurm reported errors: {msgs}", stdout=text[:2000], kind="command")
    return nodes


# Keys scontrol prints for a node; free text (OS, Comment, Extra, Reason) may contain spaces and '='.
_TEXT_KEYS = [
    "NodeName", "Arch", "CoresPerSocket", "CPUAlloc", "CPUEfctv", "CPUTot", "CPULoad", "AvailableFeatures",
    "ActiveFeatures", "Gres", "GresDrain", "GresUsed", "NodeAddr", "NodeHostName", "Port", "Version", "OS",
    "RealMemory", "AllocMem", "FreeMem", "Sockets", "Boards", "State", "ThreadsPerCore", "TmpDisk", "Weight",
    "Owner", "MCS_label", "Partitions", "BootTime", "SlurmdStartTime", "LastBusyTime", "ResumeAfterTime",
    "CfgTRES", "AllocTRES", "CapWatts", "CurrentWatts", "AveWatts", "ExtSensorsJoules", "ExtSensorsWatts",
    "ExtSensorsTemp", "Comment", "Extra", "Reason", "NextState", "InstanceId", "InstanceType", "Topology", "Power",
    "LowestJoules", "ConsumedJoules", "CPUSpecList", "MemSpecLimit", "CoreSpecCount", "ReservationName",
]
_TEXT_SPLIT = re.compile(r"(?:^|\s)(" + "|".join(_TEXT_KEYS) + r")=")
# the trailing "[user@time]" of a Reason, searched for on its own: a lazy "^(.*?)\s*\[" prefix backtracked
# quadratically on a reason full of '[' (16,000 of them took a second)
_REASON = re.compile(r"\[(?P<user>[^@\[\]]*)@(?P<time>[^\[\]]+)\]\s*$")


def _parse_time(text: Optional[str]) -> Optional[int]:
    if not text or text in ("None", "Unknown", "N/A", "(null)"):
        return None
    try:
        return int(time.mktime(time.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S")))
    except ValueError:
        return None


def parse_node_text_line(line: str) -> Dict[str, str]:
    """One ``scontrol -o [-d] show node`` line -> dict of key -> raw value."""
    parts = _TEXT_SPLIT.split(line.strip())
    # parts: ['', key1, value1, key2, value2, ...]
    if len(parts) < 3 or parts[1] != "NodeName":
        raise SlurmError(f"cannot parse scontrol node line: {line[:200]!r}", stdout=line, kind="parse")
    return {parts[i]: parts[i + 1].strip() for i in range(1, len(parts) - 1, 2)}


def _null(v: Optional[str]) -> str:
    return "" if v in (None, "(null)", "N/A") else str(v)


def parse_nodes_text(text: str) -> Nodes:
    """``scontrol -o -d show node`` output -> {name: Node}."""
    nodes: Nodes = {}
    for line in text.splitlines():
        if not line.strip() or not line.lstrip().startswith("NodeName="):
            continue
        kv = parse_node_text_line(line)
        state, flags = split_state(kv.get("State", ""))
        reason, user, rtime = kv.get("Reason", ""), "", None
        m = _REASON.search(reason)
        if m:
            reason, user, rtime = reason[:m.start()].rstrip(), m.group("user"), _parse_time(m.group("time"))
        name = kv["NodeName"]
        nodes[name] = Node(
            name=name, state=state, flags=flags, reason=reason, reason_user=user, reason_time=rtime,
            partitions=_list(kv.get("Partitions")), features=_list(_null(kv.get("ActiveFeatures"))),
            gres=_null(kv.get("Gres", "")), gres_used=_null(kv.get("GresUsed", "")),
            comment=_null(kv.get("Comment", "")), extra=_null(kv.get("Extra", "")),
            boot_time=_parse_time(kv.get("BootTime")), next_state=(kv.get("NextState") or "").lower(),
            cpus=_num(kv.get("CPUTot")), alloc_cpus=_num(kv.get("CPUAlloc")) or 0,
            address=kv.get("NodeAddr", ""), version=kv.get("Version", ""),
        )
    return nodes


def parse_version(text: str) -> Tuple[int, int, int]:
    """'slurm-wlm 22.05.8' / 'slurm 24.11.5' -> (22, 5, 8)."""
    # bounded digit runs that start a run: linear time on a long string of digits (unbounded \d+ is quadratic)
    m = re.search(r"(?<!\d)(\d{1,6})\.(\d{1,6})(?:\.(\d{1,6}))?", (text or "")[:4096])
    if not m:
        raise SlurmError(f"cannot parse Slurm version from {text!r}", stdout=text, kind="parse")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def parse_jobs_text(text: str, sep: str = "\x1f") -> List[Dict[str, Any]]:
    """``squeue -h -o %A<sep>%T<sep>%u<sep>%N<sep>%M<sep>%e<sep>%r<sep>%j`` -> job dicts."""
    jobs: List[Dict[str, Any]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        f = line.split(sep)
        if len(f) < 8:
            raise SlurmError(f"cannot parse squeue line {line!r}", stdout=text, kind="parse")
        jobs.append({
            "job_id": f[0], "state": f[1], "user": f[2], "nodes": f[3], "elapsed": f[4],
            "end_time": _parse_time(f[5]), "reason": f[6], "name": sep.join(f[7:]),
        })
    return jobs


#: squeue --Format fields of parse_job_records, the comment last (it is free text a user sets).
JOB_FIELDS = ("JobID", "State", "Requeue", "QOS", "NodeList", "EligibleTime", "Comment")


def parse_job_records(text: str, sep: str = "\x1f") -> List[Dict[str, Any]]:
    """``squeue -h -O JobID:<sep>,State:<sep>,Requeue:<sep>,QOS:<sep>,NodeList:<sep>,EligibleTime:<sep>,Comment:<sep>``
    -> job dicts (job_id, state, requeue, qos, nodes, eligible, comment). ``eligible`` is the epoch second a
    pending job may start from (its begin time: in the future for a requeued job Slurm holds back) or None. The
    comment may hold anything a user typed, the separator included, so it is the rest of the line; a line that is
    not a job (a comment with a newline in it) is a parse error, never a guess."""
    jobs: List[Dict[str, Any]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        f = line.split(sep, 6)
        if len(f) < 7 or not is_job_id(f[0].strip()) or f[2].strip() not in ("0", "1"):
            raise SlurmError(f"cannot parse squeue job line {line[:200]!r}", stdout=text, kind="parse")
        comment = f[6][:-1] if f[6].endswith(sep) else f[6]
        jobs.append({"job_id": f[0].strip(), "state": f[1].strip().upper(), "requeue": f[2].strip() == "1",
                     "qos": _null(f[3].strip()), "nodes": _null(f[4].strip()), "eligible": _parse_time(f[5].strip()),
                     "comment": _null(comment)})
    return jobs
