# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Slurm adapter: read and change node state through one small interface.

Standard library only, Python 3.9+, no Ansible import; nothing runs at import time.

Backends
    ``cli`` (default): ``scontrol`` / ``sinfo`` / ``squeue``. Nodes are read as JSON where the release has it
    - Slurm 22.05 ``sinfo --json`` (openapi/v0.0.38; 22.05 has no ``scontrol --json``), Slurm >= 23.02
    ``scontrol show node --json`` (data_parser, e.g. v0.0.42 on 24.11) - and as plain ``scontrol -o -d show
    node`` text otherwise. Changes are one ``scontrol update NodeName=<hostlist>`` per call.
    ``pyslurm``: the ``Node.load`` / ``Nodes.load`` / ``Node.modify`` API of pyslurm (22.5.3 from source,
    23.02+). ``backend='auto'`` picks it only when ``import pyslurm`` works AND pyslurm's major.minor equals
    ``scontrol --version``'s (pyslurm builds are tied to one Slurm release); otherwise the CLI.
    Reboots, jobs, requeue and hostlist expansion always go through the CLI.

Every change first checks that every named node exists, so that an unknown name never leaves a partial update
(``scontrol update NodeName=node1,node9 ...`` drains node1 and then fails on node9).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import time
from dataclasses import asdict, dataclass, field

ERROR_KINDS = ("unreachable", "unknown_node", "command", "parse")
BASE_STATES = ("idle", "mixed", "allocated", "down", "error", "future", "unknown")
NEXT_STATES = ("resume", "down", "undrain")

_UNREACHABLE = re.compile(
    r"Unable to contact slurm controller|Socket timed out|Zero Bytes were transmitted|Connection refused|"
    r"Communication connection failure|Could not establish a configuration source|"
    r"Unable to process configuration file|Munge (?:encode|decode) failed|munge_encode|Invalid authentication|"
    r"Slurmctld\(\w+\) at \S+ is DOWN",
    re.I,
)
_UNKNOWN_NODE = re.compile(r"Invalid node name specified|Node \S+ not found|Unknown node", re.I)


class SlurmError(Exception):
    """A Slurm call failed. ``kind`` is one of ERROR_KINDS."""

    def __init__(self, msg, rc=None, stdout="", stderr="", kind="command"):
        super().__init__(msg)
        self.msg = msg
        self.rc = rc
        self.stdout = stdout or ""
        self.stderr = stderr or ""
        self.kind = kind if kind in ERROR_KINDS else "command"

    def __str__(self):
        return self.msg

    def to_dict(self):
        return {"msg": self.msg, "rc": self.rc, "stdout": self.stdout, "stderr": self.stderr, "kind": self.kind}


@dataclass
class Node:
    name: str
    state: str = "unknown"
    flags: frozenset = field(default_factory=frozenset)
    reason: str = ""
    reason_user: str = ""
    reason_time: int | None = None
    partitions: list = field(default_factory=list)
    features: list = field(default_factory=list)
    gres: str = ""
    gres_used: str = ""
    comment: str = ""
    extra: str = ""
    boot_time: int | None = None
    next_state: str = ""
    cpus: int | None = None
    alloc_cpus: int | None = None
    address: str = ""
    version: str = ""

    @property
    def busy(self):
        """Jobs still on the node (running or completing)."""
        return self.state in ("mixed", "allocated") or "COMPLETING" in self.flags

    @property
    def drained(self):
        return "DRAIN" in self.flags and not self.busy

    @property
    def draining(self):
        return "DRAIN" in self.flags and self.busy

    @property
    def is_down(self):
        return self.state == "down"

    @property
    def not_responding(self):
        return "NOT_RESPONDING" in self.flags

    @property
    def sinfo_state(self):
        """The long state ``sinfo -o %T`` prints (e.g. ``drained``, ``draining@``, ``idle*``, ``reboot^``)."""
        f = self.flags
        if "REBOOT_ISSUED" in f:
            return "reboot^"
        if "MAINTENANCE" in f or "MAINT" in f:
            base = "maint"
        elif "DRAIN" in f:
            base = "draining" if self.busy else "drained"
        elif "REBOOT_REQUESTED" in f and not self.busy:
            base = "reboot"
        elif "COMPLETING" in f:
            base = "completing"
        elif "INVALID_REG" in f:
            base = "inval"
        else:
            base = self.state
        if "NOT_RESPONDING" in f:
            return base + "*"
        if "REBOOT_REQUESTED" in f and base not in ("reboot",):
            return base + "@"
        if "POWERED_DOWN" in f:
            return base + "~"
        return base

    def to_dict(self):
        d = asdict(self)
        d["flags"] = sorted(self.flags)
        d["drained"] = self.drained
        d["draining"] = self.draining
        d["sinfo_state"] = self.sinfo_state
        return d


# ---------------------------------------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------------------------------------
def _num(value):
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


def _list(value):
    if value in (None, "", "(null)"):
        return []
    if isinstance(value, str):
        return [v for v in value.split(",") if v and v != "(null)"]
    return [str(v) for v in value if v]


def _str(value):
    if value is None:
        return ""
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


def split_state(state, flags=()):
    """('IDLE', ['DRAIN']) or ['IDLE', 'DRAIN'] or 'IDLE*+DRAIN' -> ('idle', frozenset({'DRAIN', ...}))."""
    parts = []
    if isinstance(state, (list, tuple)):
        parts = [str(s) for s in state]
    elif state:
        parts = str(state).split("+")
    out_flags = set(str(f).upper() for f in flags or ())
    base = None
    for part in parts:
        p = part.strip()
        suffixes = {"*": "NOT_RESPONDING", "~": "POWERED_DOWN", "#": "POWERING_UP", "%": "POWERING_DOWN",
                    "!": "POWER_DOWN", "@": "REBOOT_REQUESTED", "^": "REBOOT_ISSUED", "$": "MAINTENANCE"}
        while p and p[-1] in suffixes:
            out_flags.add(suffixes[p[-1]])
            p = p[:-1]
        low = p.lower()
        if base is None and low in BASE_STATES:
            base = low
        elif p:
            out_flags.add(p.upper())
    # sinfo's long names, should a caller hand one in
    aliases = {"drained": ("idle", "DRAIN"), "draining": ("mixed", "DRAIN"), "completing": ("idle", "COMPLETING")}
    if base is None:
        for f in list(out_flags):
            if f.lower() in aliases:
                out_flags.discard(f)
                b, extra_flag = aliases[f.lower()]
                base = b
                out_flags.add(extra_flag)
    return base or "unknown", frozenset(out_flags)


def _node_from_json(n):
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


def _nodes_from_sinfo_rows(rows):
    """24.11 sinfo --json: one row per (state, partition) group, each naming its nodes."""
    nodes = {}
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


def parse_nodes_json(text):
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
            nodes = {}
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


def _parse_time(text):
    if not text or text in ("None", "Unknown", "N/A", "(null)"):
        return None
    try:
        return int(time.mktime(time.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S")))
    except ValueError:
        return None


def parse_node_text_line(line):
    """One ``scontrol -o [-d] show node`` line -> dict of key -> raw value."""
    parts = _TEXT_SPLIT.split(line.strip())
    # parts: ['', key1, value1, key2, value2, ...]
    if len(parts) < 3 or parts[1] != "NodeName":
        raise SlurmError(f"cannot parse scontrol node line: {line[:200]!r}", stdout=line, kind="parse")
    return {parts[i]: parts[i + 1].strip() for i in range(1, len(parts) - 1, 2)}


def _null(v):
    return "" if v in (None, "(null)", "N/A") else v


def parse_nodes_text(text):
    """``scontrol -o -d show node`` output -> {name: Node}."""
    nodes = {}
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


def parse_version(text):
    """'slurm-wlm 22.05.8' / 'slurm 24.11.5' -> (22, 5, 8)."""
    # bounded digit runs that start a run: linear time on a long string of digits (unbounded \d+ is quadratic)
    m = re.search(r"(?<!\d)(\d{1,6})\.(\d{1,6})(?:\.(\d{1,6}))?", (text or "")[:4096])
    if not m:
        raise SlurmError(f"cannot parse Slurm version from {text!r}", stdout=text, kind="parse")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


_HOSTLIST_OK = re.compile(r"^[A-Za-z0-9_.\-]+(\[[0-9,\-]+\][A-Za-z0-9_.\-]*)*$")


def split_hostlist_expr(expr):
    """Split a hostlist expression at top-level commas, checking brackets; returns the parts."""
    if isinstance(expr, (list, tuple)):
        parts = []
        for e in expr:
            parts.extend(split_hostlist_expr(e))
        return parts
    if not isinstance(expr, str) or not expr.strip():
        raise ValueError("a node name or hostlist expression is required (got an empty value)")
    parts, depth, cur = [], 0, ""
    for ch in expr.strip():
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"invalid hostlist expression {expr!r}: unbalanced ']'")
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if depth:
        raise ValueError(f"invalid hostlist expression {expr!r}: unbalanced '['")
    parts.append(cur)
    parts = [p.strip() for p in parts if p.strip()]
    for p in parts:
        if not _HOSTLIST_OK.match(p):
            raise ValueError(f"invalid node name or hostlist {p!r} in {expr!r}")
    return parts


def expand_hostlist_local(expr):
    """Pure-Python hostlist expansion for where no scontrol exists (AWX): 'gpu[01-03,7]x,n1' ->
    ['gpu01x', 'gpu02x', 'gpu03x', 'gpu7x', 'n1']. Several bracket groups multiply out, as in Slurm."""
    out = []
    for part in split_hostlist_expr(expr):
        names = [""]
        for text, inner in re.findall(r"([^\[]*)(?:\[([^\]]*)\])?", part):
            choices = [text]
            if inner:
                choices = []
                for rng in inner.split(","):
                    if "-" in rng:
                        a, b = rng.split("-", 1)
                        if not (a.isdigit() and b.isdigit()) or int(b) < int(a):
                            raise ValueError(f"invalid range {rng!r} in hostlist {part!r}")
                        width = len(a) if a.startswith("0") else 0
                        choices += [f"{text}{i:0{width}d}" for i in range(int(a), int(b) + 1)]
                    elif rng.isdigit():
                        choices.append(text + rng)
                    else:
                        raise ValueError(f"invalid range {rng!r} in hostlist {part!r}")
            names = [n + c for n in names for c in choices]
        for n in names:
            if n and n not in out:
                out.append(n)
    return out


def parse_jobs_text(text, sep="\x1f"):
    jobs = []
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


# ---------------------------------------------------------------------------------------------------------
# Runners and backends
# ---------------------------------------------------------------------------------------------------------
def subprocess_runner(env=None, timeout=120):
    """Default runner: argv -> (rc, stdout, stderr), LC_ALL=C, no shell."""
    def run(argv):
        full_env = dict(os.environ)
        full_env.update(env or {})
        full_env["LC_ALL"] = "C"
        try:
            p = subprocess.run(argv, capture_output=True, text=True, env=full_env, timeout=timeout, check=False)
        except FileNotFoundError as exc:
            return 127, "", f"{argv[0]}: command not found ({exc})"
        except subprocess.TimeoutExpired:
            return 124, "", f"{argv[0]} timed out after {timeout}s"
        return p.returncode, p.stdout, p.stderr
    return run


def pyslurm_version(mod):
    """(major, minor) of an imported pyslurm module, or None."""
    for attr in ("__version__", "version"):
        v = getattr(mod, attr, None)
        if callable(v):
            try:
                v = v()
            except Exception:  # noqa: BLE001 - any failure means "unknown"
                v = None
        if v:
            m = re.match(r"\s*(\d+)\.(\d+)", str(v))
            if m:
                return int(m.group(1)), int(m.group(2))
    return None


def select_backend(requested, pyslurm_module, slurm_version):
    """Decide the backend. Returns (name, why).

    requested: 'auto' | 'cli' | 'pyslurm'; pyslurm_module: the imported module or None;
    slurm_version: (major, minor, micro) from ``scontrol --version`` or None.
    pyslurm's versions mirror Slurm's without the leading zero: pyslurm 22.5.x <-> Slurm 22.05.
    """
    if requested not in ("auto", "cli", "pyslurm"):
        raise ValueError(f"backend must be one of auto, cli, pyslurm; got {requested!r}")
    if requested == "cli":
        return "cli", "requested"
    if pyslurm_module is None:
        if requested == "pyslurm":
            raise SlurmError("backend=pyslurm requested but pyslurm cannot be imported", kind="command")
        return "cli", "pyslurm not importable"
    pv = pyslurm_version(pyslurm_module)
    sv = tuple(slurm_version[:2]) if slurm_version else None
    missing_api = [a for a in ("Node", "Nodes") if not hasattr(pyslurm_module, a)]
    if pv is None or sv is None or pv != sv or missing_api:
        pvs = f"{pv[0]}.{pv[1]}" if pv else "(unknown version)"
        svs = f"{sv[0]}.{sv[1]:02d}" if sv else "(unknown version)"
        why = (f"pyslurm {pvs} lacks {missing_api}" if missing_api
               else f"pyslurm {pvs} does not match Slurm {svs}")
        if requested == "pyslurm":
            raise SlurmError(f"backend=pyslurm unusable: {why}", kind="command")
        return "cli", why
    return "pyslurm", f"pyslurm {pv[0]}.{pv[1]} matches Slurm {sv[0]}.{sv[1]:02d}"


def _import_pyslurm():
    try:
        import pyslurm  # noqa: F401  pylint: disable=import-outside-toplevel
    except Exception:  # noqa: BLE001 - ImportError or a broken build (undefined symbols)
        return None
    return pyslurm


class _PyslurmNodes:
    """Node reads and state changes through pyslurm's Node API (only used when it matches Slurm)."""

    def __init__(self, mod):
        self.mod = mod

    def _err(self, exc):
        text = str(exc)
        if re.search(r"does not exist|not found|Invalid node name", text, re.I):
            return SlurmError(text, kind="unknown_node")
        if _UNREACHABLE.search(text):
            return SlurmError(text, kind="unreachable")
        return SlurmError(f"pyslurm: {text}", kind="command")

    def nodes(self):
        try:
            loaded = self.mod.Nodes.load()
        except Exception as exc:  # noqa: BLE001
            raise self._err(exc)
        out = {}
        for name in list(loaded):
            n = loaded[name]
            state, flags = split_state(getattr(n, "state", "") or "")
            gres = getattr(n, "configured_gres", {}) or {}
            used = getattr(n, "allocated_gres", {}) or {}
            out[str(name)] = Node(
                name=str(name), state=state, flags=flags, reason=getattr(n, "reason", "") or "",
                reason_user=getattr(n, "reason_user", "") or "",
                reason_time=_num(getattr(n, "reason_time", None)),
                partitions=_list(getattr(n, "partitions", None)),
                features=_list(getattr(n, "active_features", None) or getattr(n, "available_features", None)),
                gres=",".join(f"{k}:{v}" for k, v in gres.items()) if isinstance(gres, dict) else _str(gres),
                gres_used=",".join(f"{k}:{v}" for k, v in used.items()) if isinstance(used, dict) else _str(used),
                comment=getattr(n, "comment", "") or "", extra=getattr(n, "extra", "") or "",
                boot_time=_num(getattr(n, "boot_time", None)),
            )
        return out

    def modify(self, names, **changes):
        """One update RPC for all ``names`` (pyslurm's ``Node(NAMES).modify(changes)`` passes the list to
        slurm_update_node as one node list), as the CLI backend sends one ``scontrol update``: never a loop that
        could stop half way. The caller has checked that every name exists."""
        try:
            self.mod.Node(",".join(names)).modify(self.mod.Node(**changes))
        except Exception as exc:  # noqa: BLE001
            raise self._err(exc)


class SlurmClient:
    """Read and change Slurm nodes.

    runner: callable argv -> (rc, stdout, stderr); modules pass a wrapper around ``module.run_command``.
    """

    def __init__(self, runner=None, backend="auto", scontrol="scontrol", sinfo="sinfo", squeue="squeue",
                 env=None):
        self.runner = runner or subprocess_runner(env)
        self.scontrol = scontrol
        self.sinfo = sinfo
        self.squeue = squeue
        self.requested_backend = backend
        if backend not in ("auto", "cli", "pyslurm"):
            raise ValueError(f"backend must be one of auto, cli, pyslurm; got {backend!r}")
        self._version = None
        self._backend = None
        self.backend_reason = ""
        self._pyslurm = None
        self.commands = []  # every argv run, for diagnostics and tests

    # ---- plumbing ----------------------------------------------------------------------------------------
    def _run(self, argv, unknown_ok=False):
        argv = [str(a) for a in argv]
        self.commands.append(argv)
        rc, out, err = self.runner(argv)
        out, err = out or "", err or ""
        if rc != 0:
            text = "; ".join(line.strip() for line in (err.strip() or out.strip()).splitlines()
                             if line.strip() and not line.startswith("**")) or f"rc={rc}"
            cmd = " ".join(argv[:4])
            if rc == 127:
                raise SlurmError(f"{argv[0]} not found: is the Slurm client installed and on PATH?", rc, out, err,
                                 kind="command")
            if _UNREACHABLE.search(text):
                raise SlurmError(f"slurmctld unreachable ({cmd}): {text}", rc, out, err, kind="unreachable")
            if _UNKNOWN_NODE.search(text) and not unknown_ok:
                raise SlurmError(f"unknown node ({cmd}): {text}", rc, out, err, kind="unknown_node")
            raise SlurmError(f"{cmd} failed (rc={rc}): {text}", rc, out, err, kind="command")
        return out

    def version(self):
        """Slurm version as 'major.minor.micro' (e.g. '22.05.8')."""
        if self._version is None:
            self._version = parse_version(self._run([self.scontrol, "--version"]))
        major, minor, micro = self._version
        return f"{major}.{minor:02d}.{micro}"

    def version_info(self):
        self.version()
        return self._version

    @property
    def backend(self):
        if self._backend is None:
            if self.requested_backend == "cli":
                self._backend, self.backend_reason = "cli", "requested"
            else:
                mod = _import_pyslurm()
                self._backend, self.backend_reason = select_backend(
                    self.requested_backend, mod, self.version_info() if mod is not None else None)
                if self._backend == "pyslurm":
                    self._pyslurm = _PyslurmNodes(mod)
        return self._backend

    # ---- reading -----------------------------------------------------------------------------------------
    def expand_hostlist(self, expr):
        """'node[1-3],gpu7' or a list -> ['node1', 'node2', 'node3', 'gpu7'] (via scontrol show hostnames)."""
        parts = split_hostlist_expr(expr)
        if all("[" not in p for p in parts):
            seen = []
            for p in parts:
                if p not in seen:
                    seen.append(p)
            return seen
        out = self._run([self.scontrol, "show", "hostnames", ",".join(parts)])
        names = []
        for n in out.split():
            if n not in names:
                names.append(n)
        return names

    def compress_hostlist(self, names):
        names = list(names)
        if len(names) <= 1:
            return ",".join(names)
        return self._run([self.scontrol, "show", "hostlist", ",".join(names)]).strip()

    def nodes(self, names=None):
        """{name: Node} for every node, or for ``names`` (a hostlist expression or list). Unknown -> error."""
        wanted = self.expand_hostlist(names) if names is not None else None
        if self.backend == "pyslurm":
            allnodes = self._pyslurm.nodes()
        else:
            allnodes = self._cli_nodes()
        if wanted is None:
            return allnodes
        missing = [n for n in wanted if n not in allnodes]
        if missing:
            raise SlurmError(f"unknown node(s): {', '.join(missing)}", kind="unknown_node")
        return {n: allnodes[n] for n in wanted}

    def _cli_nodes(self):
        major, minor, _micro = self.version_info()
        if (major, minor) >= (23, 2):
            argv = [self.scontrol, "show", "node", "--json"]
        elif (major, minor) >= (21, 8):
            argv = [self.sinfo, "--json"]
        else:
            return parse_nodes_text(self._run([self.scontrol, "-o", "-d", "show", "node"]))
        out = self._run(argv)
        try:
            return parse_nodes_json(out)
        except SlurmError as exc:
            # sinfo --json exits 0 with {"errors": [{"error": "Unspecified error"}], "nodes": []} when
            # slurmctld is down: ask scontrol ping which it is.
            if exc.kind == "command":
                self.ping()
            raise

    def node(self, name):
        if not isinstance(name, str) or not name or "," in name or "[" in name:
            raise ValueError(f"node(): one node name expected, got {name!r}")
        return self.nodes([name])[name]

    def jobs(self, node=None, states=None):
        """Jobs (optionally on one node / in some states) as dicts: job_id, state, user, nodes, elapsed,
        end_time (epoch or None), reason, name."""
        sep = "\x1f"
        fmt = sep.join(("%A", "%T", "%u", "%N", "%M", "%e", "%r", "%j"))
        argv = [self.squeue, "-h", "-o", fmt]
        if node:
            self.nodes(node)  # unknown node -> SlurmError(kind='unknown_node') instead of an empty list
            argv += ["-w", node]
        if states:
            argv += ["-t", ",".join(states)]
        return parse_jobs_text(self._run(argv), sep)

    # ---- changing ----------------------------------------------------------------------------------------
    def _targets(self, names):
        """Expand and validate that every node exists (before anything changes)."""
        nodes = self.nodes(names)
        return list(nodes)

    def _update(self, names, *settings):
        hl = self.compress_hostlist(names)
        self._run([self.scontrol, "update", f"NodeName={hl}", *settings])
        return names

    @staticmethod
    def _need_reason(reason, what):
        if not isinstance(reason, str) or not reason.strip():
            raise ValueError(f"a non-empty reason is required to {what} a node")
        if "\n" in reason:
            raise ValueError("reason must be one line")
        return reason.strip()

    def drain(self, names, reason):
        reason = self._need_reason(reason, "drain")
        targets = self._targets(names)
        if self.backend == "pyslurm":
            self._pyslurm.modify(targets, state="DRAIN", reason=reason)
            return targets
        return self._update(targets, "State=DRAIN", f"Reason={reason}")

    def down(self, names, reason):
        reason = self._need_reason(reason, "down")
        targets = self._targets(names)
        if self.backend == "pyslurm":
            self._pyslurm.modify(targets, state="DOWN", reason=reason)
            return targets
        return self._update(targets, "State=DOWN", f"Reason={reason}")

    def resume(self, names):
        """Resume nodes that are drained/draining/down/failed; others are left alone (scontrol would reject
        the whole batch with 'Invalid node state specified'). Returns the names resumed."""
        nodes = self.nodes(names)
        targets = [n for n, node in nodes.items()
                   if "DRAIN" in node.flags or node.is_down or "FAIL" in node.flags]
        if not targets:
            return []
        if self.backend == "pyslurm":
            self._pyslurm.modify(targets, state="RESUME")
            return targets
        return self._update(targets, "State=RESUME")

    def reboot(self, names, reason=None, nextstate="resume", asap=True):
        """``scontrol reboot [ASAP] nextstate=... [reason=...] <hostlist>`` (reason optional, as in Slurm)."""
        if reason is not None:
            reason = self._need_reason(reason, "reboot")
        if nextstate not in NEXT_STATES:
            raise ValueError(f"nextstate must be one of {', '.join(NEXT_STATES)}; got {nextstate!r}")
        targets = self._targets(names)
        argv = [self.scontrol, "reboot"]
        if asap:
            argv.append("ASAP")
        argv.append(f"nextstate={nextstate.upper()}")
        if reason:
            argv.append(f"reason={reason}")
        argv.append(self.compress_hostlist(targets))
        self._run(argv)
        return targets

    def cancel_reboot(self, names):
        targets = self._targets(names)
        self._run([self.scontrol, "cancel_reboot", self.compress_hostlist(targets)])
        return targets

    def set_comment(self, name, text):
        targets = self._targets(name)
        if "\n" in (text or ""):
            raise ValueError("comment must be one line")
        if self.backend == "pyslurm":
            self._pyslurm.modify(targets, comment=text or "")
            return targets
        return self._update(targets, f"Comment={text or ''}")

    def set_extra(self, name, text):
        """Node Extra field (Slurm >= 22.05); older releases fall back to Comment."""
        targets = self._targets(name)
        if "\n" in (text or ""):
            raise ValueError("extra must be one line")
        if self.version_info()[:2] < (22, 5):
            return self._update(targets, f"Comment={text or ''}")
        if self.backend == "pyslurm":
            self._pyslurm.modify(targets, extra=text or "")
            return targets
        return self._update(targets, f"Extra={text or ''}")

    def requeue(self, job_id):
        job_id = str(job_id).strip()
        if not re.match(r"^\d+(_\d+)?$", job_id):
            raise ValueError(f"job_id must be a Slurm job id, got {job_id!r}")
        self._run([self.scontrol, "requeue", job_id])
        return job_id

    def ping(self):
        """True when slurmctld answers; raises SlurmError(kind='unreachable') otherwise."""
        out = self._run([self.scontrol, "ping"])
        if "is UP" not in out:
            raise SlurmError(f"slurmctld is not up: {out.strip()}", 1, out, "", kind="unreachable")
        return True
