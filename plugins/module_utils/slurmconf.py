# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Parser and editor for slurm.conf, gres.conf and cgroup.conf that keeps the file as written.

Pure Python, stdlib only, Python 3.9+. The file is kept as a list of logical lines; every line that is not
edited is rendered back byte for byte (comments, blank lines, order, spacing, ``\\`` continuations, CRLF).
Edits replace only the span of the value they change.

The syntax follows Slurm's own reader (``src/common/parse_config.c``), as documented in slurm.conf(5):

* ``#`` starts a comment unless it is preceded by an odd number of backslashes; quotes do not protect it.
* A line whose text (after the comment is cut off and trailing blanks are dropped) ends with an odd number
  of backslashes continues on the next line; the pieces are joined without a blank in between.
* ``Key=Value`` pairs, several per line allowed, blanks around ``=`` allowed, a value either ``"quoted"``
  (no ``"`` inside) or a run of non-blank characters. Keys are case-insensitive; node and partition names
  are not.
* ``Include <file>`` lines are kept as they are and never followed.
* Lines whose first key is a record key (slurm.conf: NodeName, PartitionName, NodeSet, DownNodes,
  FrontendName; gres.conf: NodeName, Name) describe one record identified by that key's value (gres.conf
  lines also by their Name and Type). Other pairs are global settings; when a global key appears more than
  once, the last occurrence wins, as in Slurm.
"""
from __future__ import annotations

import math
import os
import re
import shutil
import time
from typing import Any, Callable, Dict, FrozenSet, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from .fileutil import atomic_write

KINDS = ("slurm", "gres", "cgroup")

RECORD_KEYS: Dict[str, Tuple[str, ...]] = {
    "slurm": ("nodename", "partitionname", "nodeset", "downnodes", "frontendname"),
    "gres": ("nodename", "name"),
    "cgroup": (),
}

# Global keys that may legitimately appear on several lines, one value each (primary and backup controllers).
MULTI_LINE_KEYS = frozenset(("slurmctldhost",))


class SlurmConfError(ValueError):
    """Base class for every error raised here."""


class ParseError(SlurmConfError):
    """A line that Slurm would not accept. ``lineno`` is 1-based."""

    def __init__(self, lineno: int, line: str, problem: str, path: Optional[str] = None) -> None:
        self.lineno = lineno
        self.line = line
        self.problem = problem
        self.path = path
        where = f"{path} line {lineno}" if path else f"line {lineno}"
        super().__init__("{}: {}: {!r}".format(where, problem, line.rstrip("\r\n")))


class ValidationError(SlurmConfError):
    """A value that does not fit what Slurm expects for its key."""

    def __init__(self, key: str, value: Any, expected: str, where: Optional[str] = None) -> None:
        self.key = key
        self.value = value
        self.expected = expected
        prefix = f"{where}: " if where else ""
        super().__init__(f"{prefix}{key}={value!r} is not valid: expected {expected}")


# ---------------------------------------------------------------------------------------------------------
# value types


class Check:
    """A value checker: returns the value's text as Slurm reads it, raises ValueError(what is expected) otherwise.
    ``kind`` says how two checked values compare (values_equal)."""

    __slots__ = ("kind", "func")

    def __init__(self, kind: str, func: Callable[[Any], str]) -> None:
        self.kind = kind
        self.func = func

    def __call__(self, value: Any) -> str:
        return self.func(value)


def _int(lo: int = 0, hi: Optional[int] = None) -> Check:
    expected = f"an integer >= {lo}" + ("" if hi is None else f" and <= {hi}")

    def check(value: Any) -> str:
        text = str(value).strip()
        if not re.fullmatch(r"[0-9]+", text):
            raise ValueError(expected)
        number = int(text)
        if number < lo or (hi is not None and number > hi):
            raise ValueError(expected)
        return str(number)

    return Check("int", check)


def _float(lo: float = 0.0, hi: Optional[float] = None) -> Check:
    def check(value: Any) -> str:
        text = str(value).strip()
        number: Optional[float]
        try:
            number = float(text)
        except ValueError:
            number = None
        if number is None or math.isnan(number) or number < lo or (hi is not None and number > hi):
            raise ValueError("a number >= {:g}{}".format(lo, "" if hi is None else f" and <= {hi:g}"))
        return text

    return Check("float", check)


def _yesno(upper: bool) -> Check:
    words = {"yes": True, "no": False, "true": True, "false": False, "1": True, "0": False}

    def check(value: Any) -> str:
        if isinstance(value, bool):
            flag = value
        else:
            text = str(value).strip().lower()
            if text not in words:
                raise ValueError("a boolean (YES or NO)" if upper else "a boolean (yes or no)")
            flag = words[text]
        word = "yes" if flag else "no"
        return word.upper() if upper else word

    return Check("bool", check)


def _enum(choices: Sequence[str], many: bool = False) -> Check:
    lookup = {c.lower(): c for c in choices}

    def check(value: Any) -> str:
        items = value if isinstance(value, (list, tuple)) else str(value).split(",") if many else [str(value)]
        out = []
        for item in items:
            word = str(item).strip()
            if word.lower() not in lookup:
                raise ValueError(
                    ("a comma-separated list of " if many else "one of ") + ", ".join(choices)
                )
            out.append(lookup[word.lower()])
        if not out or (not many and len(out) != 1):
            raise ValueError(("a comma-separated list of " if many else "one of ") + ", ".join(choices))
        return ",".join(out)

    return Check("enum_list" if many else "enum", check)


def _path(listsep: Optional[str] = None) -> Check:
    def check(value: Any) -> str:
        text = str(value).strip()
        parts = text.split(listsep) if listsep else [text]
        for part in parts:
            if not part.startswith("/") or "\n" in part:
                raise ValueError(
                    "an absolute path" if not listsep else f"absolute paths separated by '{listsep}'"
                )
        return text

    return Check("path", check)


def _check_exit_codes(value: Any) -> str:
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    out = []
    for item in items:
        word = str(item).strip()
        match = re.fullmatch(r"([0-9]+)(?:-([0-9]+))?", word)
        if not match or int(match.group(1)) > 255 or (match.group(2) and not (
                int(match.group(1)) <= int(match.group(2)) <= 255)):
            raise ValueError("exit codes 0-255 separated by commas, ranges as A-B (e.g. 1-9,18)")
        out.append(word)
    if not out:
        raise ValueError("exit codes 0-255 separated by commas, ranges as A-B (e.g. 1-9,18)")
    return ",".join(out)


_exit_codes = Check("exit_codes", _check_exit_codes)


def _check_port(value: Any) -> str:
    text = str(value).strip()
    match = re.fullmatch(r"([0-9]+)(?:-([0-9]+))?", text)
    if not match or not 1 <= int(match.group(1)) <= 65535 or (
            match.group(2) and not int(match.group(1)) <= int(match.group(2)) <= 65535):
        raise ValueError("a TCP port 1-65535 or a range A-B")
    return text


_port = Check("int", _check_port)


def _check_node_ports(value: Any) -> str:
    """Port= of a NodeName line: one port, or for a hostlist of nodes a list like [6818-6821,6830]."""
    text = str(value).strip()
    inner = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    try:
        for item in inner.split(","):
            _port(item)
    except ValueError:
        raise ValueError("a TCP port 1-65535, or ports like [6818-6821,6830] for a list of nodes")
    return text


_node_ports = Check("int", _check_node_ports)


def _check_count(value: Any) -> str:
    text = str(value).strip()
    if not re.fullmatch(r"[0-9]+[KMGTPkmgtp]?", text):
        raise ValueError("a count (integer, optionally with suffix K, M, G, T or P)")
    return text


_count = Check("count", _check_count)

_HEALTH_STATES = ("ALLOC", "ANY", "CYCLE", "IDLE", "MIXED", "NONDRAINED_IDLE")
_PROLOG_FLAGS = ("Alloc", "Contain", "DeferBatch", "ForceRequeueOnFail", "NoHold", "RunInJob", "Serial", "X11")

# Known global keys per kind: lower-case key -> (spelling, validator). Unknown keys are accepted as written.
KeyInfo = Tuple[str, Optional[Check]]  # (spelling, validator or None)
GLOBAL_KEYS: Dict[str, Dict[str, KeyInfo]] = {
    "slurm": {
        "healthcheckprogram": ("HealthCheckProgram", _path()),
        "healthcheckinterval": ("HealthCheckInterval", _int()),
        "healthchecknodestate": ("HealthCheckNodeState", _enum(_HEALTH_STATES, many=True)),
        "rebootprogram": ("RebootProgram", _path()),
        "resumetimeout": ("ResumeTimeout", _int()),
        "resumeprogram": ("ResumeProgram", _path()),
        "resumefailprogram": ("ResumeFailProgram", _path()),
        "suspendprogram": ("SuspendProgram", _path()),
        "slurmdtimeout": ("SlurmdTimeout", _int(0, 65533)),
        "slurmctldtimeout": ("SlurmctldTimeout", _int(0, 65533)),
        "messagetimeout": ("MessageTimeout", _int(1)),
        "tcptimeout": ("TCPTimeout", _int(1)),
        "batchstarttimeout": ("BatchStartTimeout", _int()),
        "prologepilogtimeout": ("PrologEpilogTimeout", _int(0, 65533)),
        "unkillablesteptimeout": ("UnkillableStepTimeout", _int(0, 65533)),
        "unkillablestepprogram": ("UnkillableStepProgram", _path()),
        "killwait": ("KillWait", _int(0, 65533)),
        "inactivelimit": ("InactiveLimit", _int(0, 65533)),
        "minjobage": ("MinJobAge", _int()),
        "maxjobcount": ("MaxJobCount", _int(1)),
        "waittime": ("WaitTime", _int(0, 65533)),
        "overtimelimit": ("OverTimeLimit", _int()),
        "epilogmsgtime": ("EpilogMsgTime", _int()),
        "treewidth": ("TreeWidth", _int(1, 65533)),
        "jobrequeue": ("JobRequeue", _int(0, 1)),
        "killonbadexit": ("KillOnBadExit", _int(0, 1)),
        "returntoservice": ("ReturnToService", _int(0, 2)),
        "usepam": ("UsePAM", _int(0, 1)),
        "requeueexit": ("RequeueExit", _exit_codes),
        "requeueexithold": ("RequeueExitHold", _exit_codes),
        "prologflags": ("PrologFlags", _enum(_PROLOG_FLAGS, many=True)),
        "prolog": ("Prolog", _path()),
        "epilog": ("Epilog", _path()),
        "prologslurmctld": ("PrologSlurmctld", _path()),
        "epilogslurmctld": ("EpilogSlurmctld", _path()),
        "taskprolog": ("TaskProlog", _path()),
        "taskepilog": ("TaskEpilog", _path()),
        "srunprolog": ("SrunProlog", _path()),
        "srunepilog": ("SrunEpilog", _path()),
        "slurmctldport": ("SlurmctldPort", _port),
        "slurmdport": ("SlurmdPort", _port),
        "slurmctldlogfile": ("SlurmctldLogFile", _path()),
        "slurmdlogfile": ("SlurmdLogFile", _path()),
        "slurmctldpidfile": ("SlurmctldPidFile", _path()),
        "slurmdpidfile": ("SlurmdPidFile", _path()),
        "slurmdspooldir": ("SlurmdSpoolDir", _path()),
        "statesavelocation": ("StateSaveLocation", _path()),
        "plugindir": ("PluginDir", _path(":")),
        "plugstackconfig": ("PlugStackConfig", _path()),
        "slurmctldhost": ("SlurmctldHost", None),
        "authtype": ("AuthType", None),
        "authalttypes": ("AuthAltTypes", None),
        "authaltparameters": ("AuthAltParameters", None),
        "authinfo": ("AuthInfo", None),
        "clustername": ("ClusterName", None),
        "grestypes": ("GresTypes", None),
        "proctracktype": ("ProctrackType", None),
        "taskplugin": ("TaskPlugin", None),
        "selecttype": ("SelectType", None),
        "selecttypeparameters": ("SelectTypeParameters", None),
        "schedulertype": ("SchedulerType", None),
        "schedulerparameters": ("SchedulerParameters", None),
        "slurmctldparameters": ("SlurmctldParameters", None),
        "switchtype": ("SwitchType", None),
        "credtype": ("CredType", None),
        "jobcontainertype": ("JobContainerType", None),
        "maxnodecount": ("MaxNodeCount", _int()),
        "slurmuser": ("SlurmUser", None),
        "slurmduser": ("SlurmdUser", None),
    },
    "gres": {
        "autodetect": ("AutoDetect", _enum(("nvml", "off", "rsmi", "oneapi", "nrt"))),
    },
    "cgroup": {
        "cgroupautomount": ("CgroupAutomount", _yesno(False)),
        "cgroupmountpoint": ("CgroupMountpoint", _path()),
        "cgroupplugin": ("CgroupPlugin", _enum(("cgroup/v1", "cgroup/v2", "autodetect", "disabled"))),
        "ignoresystemd": ("IgnoreSystemd", _yesno(False)),
        "ignoresystemdonfailure": ("IgnoreSystemdOnFailure", _yesno(False)),
        "constraincores": ("ConstrainCores", _yesno(False)),
        "constraindevices": ("ConstrainDevices", _yesno(False)),
        "constrainkmemspace": ("ConstrainKmemSpace", _yesno(False)),
        "constrainramspace": ("ConstrainRAMSpace", _yesno(False)),
        "constrainswapspace": ("ConstrainSwapSpace", _yesno(False)),
        "allowedkmemspace": ("AllowedKmemSpace", _float()),
        "allowedramspace": ("AllowedRAMSpace", _float()),
        "allowedswapspace": ("AllowedSwapSpace", _float()),
        "maxrampercent": ("MaxRAMPercent", _float()),
        "maxswappercent": ("MaxSwapPercent", _float()),
        "maxkmempercent": ("MaxKmemPercent", _float()),
        "memoryswappiness": ("MemorySwappiness", _int(0, 100)),
        "minkmemspace": ("MinKmemSpace", _int()),
        "minramspace": ("MinRAMSpace", _int()),
    },
}

# Known keys on record lines: (kind, record key) -> {lower key: (spelling, validator)}
RECORD_ATTRS: Dict[Tuple[str, str], Dict[str, KeyInfo]] = {
    ("slurm", "nodename"): {
        "nodename": ("NodeName", None),
        "nodeaddr": ("NodeAddr", None),
        "nodehostname": ("NodeHostname", None),
        "port": ("Port", _node_ports),
        "cpus": ("CPUs", _int(1)),
        "boards": ("Boards", _int(1)),
        "socketsperboard": ("SocketsPerBoard", _int(1)),
        "corespersocket": ("CoresPerSocket", _int(1)),
        "threadspercore": ("ThreadsPerCore", _int(1)),
        "sockets": ("Sockets", _int(1)),
        "realmemory": ("RealMemory", _int(1)),
        "tmpdisk": ("TmpDisk", _int()),
        "weight": ("Weight", _int()),
        "gres": ("Gres", None),
        "feature": ("Feature", None),
        "features": ("Features", None),
        "state": ("State", _enum(("CLOUD", "DOWN", "DRAIN", "FAIL", "FAILING", "FUTURE", "UNKNOWN"))),
    },
    ("slurm", "partitionname"): {
        "partitionname": ("PartitionName", None),
        "nodes": ("Nodes", None),
        "default": ("Default", _yesno(True)),
        "hidden": ("Hidden", _yesno(True)),
        "rootonly": ("RootOnly", _yesno(True)),
        "disablerootjobs": ("DisableRootJobs", _yesno(True)),
        "exclusiveuser": ("ExclusiveUser", _yesno(True)),
        "state": ("State", _enum(("UP", "DOWN", "DRAIN", "INACTIVE"))),
        "prioritytier": ("PriorityTier", _int(0, 65533)),
        "priorityjobfactor": ("PriorityJobFactor", _int(0, 65533)),
        "resumetimeout": ("ResumeTimeout", _int()),
    },
    ("gres", "nodename"): {
        "nodename": ("NodeName", None),
        "name": ("Name", None),
        "type": ("Type", None),
        "file": ("File", _path()),
        "count": ("Count", _count),
        "autodetect": ("AutoDetect", _enum(("nvml", "off", "rsmi", "oneapi", "nrt"))),
    },
    ("gres", "name"): {
        "name": ("Name", None),
        "type": ("Type", None),
        "file": ("File", _path()),
        "count": ("Count", _count),
    },
}

# What a change needs before it takes effect. Sources: slurm.conf(5), gres.conf(5) and scontrol(1) of Slurm
# 22.05 ("A restart of slurmctld [and slurmd] is required for changes to this parameter to take effect"),
# plus AuthAltTypes/AuthAltParameters (measured in the lab: slurmctld loads auth plugins only at start).
RESTART_KEYS: Dict[str, FrozenSet[str]] = {
    "slurm": frozenset((
        "accountingstorageenforce", "accountingstoragetype", "authtype", "authalttypes", "authaltparameters",
        "authinfo", "backupaddr", "backupcontroller", "controladdr", "controlmachine", "corespecplugin",
        "credtype", "grestypes", "jobcontainertype", "maxjobcount", "maxnodecount", "plugindir",
        "powerplugin", "proctracktype", "schedulerparameters", "schedulertype", "selecttype",
        "selecttypeparameters", "slurmctldhost", "slurmctldparameters", "slurmctldport", "slurmdport",
        "statesavelocation", "switchtype", "taskplugin", "topologyplugin", "slurmuser", "slurmduser",
        "launchtype", "jobacctgathertype", "mpidefault", "communicationparameters",
    )),
    # Type and Cores per gres.conf(5); AutoDetect because slurmd probes the hardware only when it starts.
    "gres": frozenset(("type", "cores", "autodetect", "file", "count", "name", "nodename", "multiplefiles")),
    # the cgroup plugin and its mount point are loaded by slurmd at start
    "cgroup": frozenset(("cgroupplugin", "cgroupmountpoint", "cgroupautomount", "ignoresystemd")),
}
# Record heads whose changes (any key, adding or removing a line) need a restart: slurm.conf(5) NODE
# CONFIGURATION: "Changes in node configuration (e.g. adding nodes, changing their processor count, etc.)
# require restarting both the slurmctld daemon and the slurmd daemons."
RESTART_RECORDS = {("slurm", "nodename"), ("slurm", "frontendname"), ("slurm", "downnodes")}

# From Slurm 23.11 on, scontrol(1): "this command operates by creating new processes for the daemons ... This
# will not be able to change the daemons' listening TCP port settings or authentication mechanism."
RECONFIGURE_RESTARTS_FROM = (23, 11)
RESTART_KEYS_2311: Dict[str, FrozenSet[str]] = {
    "slurm": frozenset(("slurmctldport", "slurmdport", "slurmctldhost", "controlmachine", "controladdr",
                        "backupcontroller", "backupaddr", "authtype", "authalttypes", "authaltparameters",
                        "authinfo")),
    "gres": frozenset(),
    "cgroup": frozenset(),
}
RESTART_RECORD_KEYS_2311: Dict[Tuple[str, str], FrozenSet[str]] = {("slurm", "nodename"): frozenset(("port",))}


Version = Tuple[int, int]


def parse_version(text: Any) -> Optional[Version]:
    """(major, minor) from '24.11.5', 'slurm 22.05.8' or 'slurm-wlm 24.11.5'; None when there is none."""
    match = re.search(r"(\d+)\.(\d+)", str(text or ""))
    return (int(match.group(1)), int(match.group(2))) if match else None


def known_key(kind: str, key: str, record: Optional[str] = None) -> Optional[KeyInfo]:
    """(spelling, validator) of a known key, or None."""
    table = RECORD_ATTRS.get((kind, record), {}) if record else GLOBAL_KEYS.get(kind, {})
    return table.get(key.lower())


_KEY = re.compile(r"[A-Za-z0-9_]+\Z")


def check_key(key: Any, where: Optional[str] = None) -> str:
    """A key as Slurm's reader accepts it (letters, digits, underscore)."""
    if not isinstance(key, str) or not _KEY.match(key):
        prefix = f"{where}: " if where else ""
        raise SlurmConfError(f"{prefix}invalid key {key!r}: expected letters, digits and '_' only")
    return key


def canonical_key(kind: str, key: str, record: Optional[str] = None) -> str:
    info = known_key(kind, key, record)
    return info[0] if info else key


def merge_flags(current: Any, wanted: Any) -> List[str]:
    """A comma list (PrologFlags, ...) that keeps every flag of ``current`` in its order and adds the flags of
    ``wanted`` it lacks, compared case-blind as Slurm reads them (a site's ``Contain`` for pam_slurm_adopt and its
    ``X11`` stay). Either side is a comma string, a list or None."""
    def items(v: Any) -> List[str]:
        if v is None:
            return []
        parts = v.split(",") if isinstance(v, str) else [str(x) for x in v]
        return [p.strip() for p in parts if p.strip()]

    out = items(current)
    seen = {f.lower() for f in out}
    for f in items(wanted):
        if f.lower() not in seen:
            seen.add(f.lower())
            out.append(f)
    return out


def normalize_value(kind: str, key: str, value: Any, record: Optional[str] = None,
                    where: Optional[str] = None) -> str:
    """Validate ``value`` for ``key`` and return its text as it will be written.

    Raises ValidationError naming the key and what was expected.
    """
    if value is None:
        raise ValidationError(key, value, "a value (use remove to delete a key)", where)
    info = known_key(kind, key, record)
    if info and info[1] is not None:
        try:
            text = info[1](value)
        except ValueError as exc:
            raise ValidationError(info[0], value, str(exc), where)
    else:
        if isinstance(value, bool):
            text = ("YES" if value else "NO") if kind == "slurm" else ("yes" if value else "no")
        elif isinstance(value, (list, tuple)):
            text = ",".join(str(v) for v in value)
        elif isinstance(value, (int, float, str)):
            text = str(value)
        else:
            raise ValidationError(key, value, "a string, number, boolean or list", where)
    _check_writable(key, text, where)
    return text


def _check_writable(key: str, text: str, where: Optional[str] = None) -> None:
    if "\n" in text or "\r" in text:
        raise ValidationError(key, text, "a value on one line", where)
    if '"' in text:
        raise ValidationError(key, text, 'a value without \'"\' (Slurm has no escape for it)', where)
    if re.search(r"(^|[^\\])(\\\\)*#", text):
        raise ValidationError(key, text, "a value without '#' (Slurm reads it as the start of a comment)", where)
    if text.endswith("\\"):
        raise ValidationError(key, text, "a value that does not end with '\\' (a line continuation)", where)


def values_equal(kind: str, key: str, a: Any, b: Any, record: Optional[str] = None) -> bool:
    """Compare two written values the way Slurm reads them for known keys (case, order of flag lists)."""
    if a == b:
        return True
    info = known_key(kind, key, record)
    if not info or info[1] is None:
        return False
    check = info[1]
    try:
        na, nb = check(a), check(b)
    except ValueError:
        return False
    if check.kind == "enum_list":
        return sorted(na.lower().split(",")) == sorted(nb.lower().split(","))
    if check.kind == "float":
        return float(na) == float(nb)
    if check.kind in ("enum", "bool"):
        return na.lower() == nb.lower()
    return na == nb


def _quote(text: str) -> str:
    return f'"{text}"' if (text == "" or re.search(r"\s", text)) else text


# ---------------------------------------------------------------------------------------------------------
# lines


_WS = " \t\n\v\f\r"  # C isspace()
_EOL = re.compile(r"\r*\n\Z|\r+\Z")
_PAIR = re.compile(r'([A-Za-z0-9_]+)[ \t\v\f\r\n]*=[ \t\v\f\r\n]*("[^"]*"|[^ \t\n\v\f\r"]+)(?=[ \t\n\v\f\r]|\Z)')
_INCLUDE = re.compile(r"[ \t\v\f\r\n]*include[ \t\v\f\r\n]", re.IGNORECASE)


def _split_eol(line: str) -> Tuple[str, str]:
    """(text, line ending) of a physical line; like Slurm's _strip_cr_nl, trailing CR and LF are the ending."""
    match = _EOL.search(line)
    return (line[: match.start()], match.group(0)) if match else (line, "")


def split_lines(text: str) -> List[str]:
    """Physical lines with their endings, split on LF only (as fgets does)."""
    parts = text.split("\n")
    lines = [part + "\n" for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def _comment_start(body: str) -> int:
    """Index where the comment starts (len(body) if none), as Slurm's _strip_comments does."""
    backslashes = 0
    for index, char in enumerate(body):
        if char == "#" and backslashes % 2 == 0:
            return index
        backslashes = backslashes + 1 if char == "\\" else 0
    return len(body)


def _continuation(code: str) -> int:
    """For the code part of a physical line: index of the continuation backslash, or -1."""
    end = len(code)
    while end > 0 and code[end - 1] in _WS:
        end -= 1
    count = 0
    while end - count > 0 and code[end - count - 1] == "\\":
        count += 1
    return end - 1 if count % 2 == 1 else -1


class Pair:
    """One Key=Value on a logical line; offsets index into the logical code text."""

    __slots__ = ("key", "value", "quoted", "start", "vstart", "end")

    def __init__(self, key: str, value: str, quoted: bool, start: int, vstart: int, end: int) -> None:
        self.key, self.value, self.quoted = key, value, quoted
        self.start, self.vstart, self.end = start, vstart, end

    def __repr__(self) -> str:
        return f"Pair({self.key!r}, {self.value!r})"


class Entry:
    """A logical line: one or more physical lines joined by continuations."""

    def __init__(self, lines: Sequence[str], lineno: int) -> None:
        self.lines = list(lines)  # physical lines, each with its line ending
        self.lineno = lineno  # 1-based number of the first physical line
        self.parse()

    # the logical code text and how it maps back to physical lines
    def _segments(self) -> List[Tuple[int, int, int]]:
        segments = []  # (physical index, start, end) of code text that is part of the logical line
        for index, line in enumerate(self.lines):
            body, _eol = _split_eol(line)
            code = body[: _comment_start(body)]
            cont = _continuation(code)
            if cont >= 0:
                segments.append((index, 0, cont))
            else:
                segments.append((index, 0, len(code)))
        return segments

    def parse(self) -> None:
        segments = self._segments()
        self.code = "".join(self.lines[i][s:e] for i, s, e in segments)
        self._segs = segments
        self.pairs: List[Pair] = []
        self.include: Optional[str] = None
        stripped = self.code.strip()
        if not stripped:
            self.type = "blank" if not any(_split_eol(line)[0].strip() for line in self.lines) else "comment"
            return
        if _INCLUDE.match(self.code):
            self.type = "include"
            self.include = stripped[len("include"):].strip()
            return
        self.type = "pairs"
        pos = 0
        while True:
            while pos < len(self.code) and self.code[pos] in _WS:
                pos += 1
            if pos >= len(self.code):
                break
            match = _PAIR.match(self.code, pos)
            if not match:
                phys = self.physical_of(pos)
                raise ParseError(self.lineno + phys, self.lines[phys],
                                 f"expected Key=Value (or 'Include <file>') at {self.code[pos:pos + 40]!r}")
            raw = match.group(2)
            quoted = raw.startswith('"')
            self.pairs.append(Pair(match.group(1), raw[1:-1] if quoted else raw, quoted,
                                   match.start(1), match.start(2), match.end(2)))
            pos = match.end()
        if not self.pairs:  # pragma: no cover - the loop either finds pairs or raises
            raise ParseError(self.lineno, self.lines[0], "expected Key=Value")

    def physical_of(self, offset: int) -> int:
        base = 0
        for index, start, end in self._segs:
            if offset < base + (end - start):
                return index
            base += end - start
        return self._segs[-1][0]

    def head(self) -> Optional[str]:
        return self.pairs[0].key.lower() if self.pairs else None

    def get(self, key: str) -> Optional[str]:
        """Value of ``key`` on this line (last occurrence), or None."""
        found = None
        for pair in self.pairs:
            if pair.key.lower() == key.lower():
                found = pair.value
        return found

    def find(self, key: str) -> Optional[Pair]:
        found = None
        for pair in self.pairs:
            if pair.key.lower() == key.lower():
                found = pair
        return found

    def replace(self, start: int, end: int, text: str) -> None:
        """Replace logical code span [start, end) with ``text`` and parse the line again.

        The text goes into the physical line that holds ``start``; parts of the span on later physical lines
        are cut out of those lines, so continuations and comments stay where they are."""
        target: Optional[int] = None
        candidate: Optional[int] = None
        base = 0
        for number, (_index, seg_start, seg_end) in enumerate(self._segs):
            length = seg_end - seg_start
            if base <= start < base + length:
                target = number
                break
            if start == base + length and candidate is None:
                candidate = number
            base += length
        if target is None:
            target = candidate if candidate is not None else len(self._segs) - 1
        new_lines = list(self.lines)
        base = 0
        for number, (index, seg_start, seg_end) in enumerate(self._segs):
            length = seg_end - seg_start
            lo, hi = max(start, base), min(end, base + length)
            line = new_lines[index]
            if number == target:
                a = seg_start + (start - base)
                b = seg_start + (max(hi, start) - base)
                new_lines[index] = line[:a] + text + line[b:]
            elif lo < hi:
                new_lines[index] = line[: seg_start + lo - base] + line[seg_start + hi - base:]
            base += length
        old = self.lines
        self.lines = new_lines
        try:
            self.parse()
        except ParseError:
            self.lines = old
            self.parse()
            raise

    def render(self) -> str:
        return "".join(self.lines)


# ---------------------------------------------------------------------------------------------------------
# the file


def guess_kind(path: Any) -> Optional[str]:
    """slurm, gres or cgroup from a file name (slurm.conf, gres.conf, cgroup.conf), else None."""
    name = os.path.basename(str(path)).lower()
    for kind in KINDS:
        if name == kind + ".conf" or name.startswith(kind + ".conf.") or name.endswith("-" + kind + ".conf"):
            return kind
    return None


class ConfFile:
    """A parsed configuration file that can be edited and rendered back."""

    def __init__(self, text: str = "", kind: str = "slurm", path: Optional[str] = None,
                 validate: bool = True) -> None:
        if kind not in KINDS:
            raise SlurmConfError("kind must be one of {}, got {!r}".format(", ".join(KINDS), kind))
        self.kind = kind
        self.path = path
        self.validate = validate
        self.original = text
        self.entries: List[Entry] = []
        # (scope, name, key) tuples; scope is "global" or a record key
        self.changes: List[Tuple[str, Optional[str], Optional[str]]] = []
        physical = split_lines(text)
        index = 0
        while index < len(physical):
            group = [physical[index]]
            while True:
                body, _eol = _split_eol(group[-1])
                code = body[: _comment_start(body)]
                if _continuation(code) >= 0 and index + len(group) < len(physical):
                    group.append(physical[index + len(group)])
                else:
                    break
            try:
                self.entries.append(Entry(group, index + 1))
            except ParseError as exc:
                exc.path = path
                raise ParseError(exc.lineno, exc.line, exc.problem, path)
            index += len(group)
        if validate:
            self.check()

    @classmethod
    def load(cls, path: str, kind: Optional[str] = None, validate: bool = True) -> ConfFile:
        kind = kind or guess_kind(path)
        if kind is None:
            raise SlurmConfError(
                "cannot tell the kind of {} from its name; pass kind ({})".format(path, ", ".join(KINDS)))
        with open(path, encoding="utf-8", errors="surrogateescape", newline="") as handle:
            return cls(handle.read(), kind, path=path, validate=validate)

    # ------------------------------------------------------------------ reading
    def render(self) -> str:
        return "".join(entry.render() for entry in self.entries)

    @property
    def changed(self) -> bool:
        return self.render() != self.original

    def _is_record(self, entry: Entry) -> bool:
        return entry.type == "pairs" and entry.head() in RECORD_KEYS[self.kind]

    def global_pairs(self) -> Iterator[Tuple[Entry, Pair]]:
        for entry in self.entries:
            if entry.type == "pairs" and not self._is_record(entry):
                for pair in entry.pairs:
                    yield entry, pair

    def get(self, key: str) -> Optional[str]:
        """Effective value of a global key (its last occurrence), or None."""
        found = None
        for _entry, pair in self.global_pairs():
            if pair.key.lower() == key.lower():
                found = pair.value
        return found

    def get_all(self, key: str) -> List[str]:
        return [pair.value for _entry, pair in self.global_pairs() if pair.key.lower() == key.lower()]

    def settings(self) -> Dict[str, str]:
        """Effective global settings: {key as first written: value}."""
        out: Dict[str, str] = {}
        names: Dict[str, str] = {}
        for _entry, pair in self.global_pairs():
            name = names.setdefault(pair.key.lower(), pair.key)
            out[name] = pair.value
        return out

    def includes(self) -> List[Optional[str]]:
        return [entry.include for entry in self.entries if entry.type == "include"]

    def outline(self) -> List[Tuple[str, Optional[str]]]:
        """The global settings and Include lines in file order: [(key, value)], keys spelt as Slurm documents
        them, ``("Include", target)`` for an Include line. Record lines (NodeName=...) are left out."""
        out: List[Tuple[str, Optional[str]]] = []
        for entry in self.entries:
            if entry.type == "include":
                out.append(("Include", entry.include))
            elif entry.type == "pairs" and not self._is_record(entry):
                out.extend((canonical_key(self.kind, pair.key), pair.value) for pair in entry.pairs)
        return out

    def records(self, head: Optional[str] = None) -> Iterator[Entry]:
        for entry in self.entries:
            if self._is_record(entry) and (head is None or entry.head() == head.lower()):
                yield entry

    def _record_matches(self, entry: Entry, head: str, ident: Mapping[str, Optional[str]]) -> bool:
        if entry.head() != head:
            return False
        for key, value in ident.items():
            have = entry.get(key)
            if key.lower() == head:
                if have != value:
                    return False
            elif (have or "").lower() != (value or "").lower():
                return False
        return True

    def find_records(self, head: str, ident: Mapping[str, Optional[str]]) -> List[Entry]:
        head = head.lower()
        return [e for e in self.records(head) if self._record_matches(e, head, ident)]

    def record_identity(self, head: str, attrs: Mapping[str, Any]) -> Dict[str, Optional[str]]:
        """The keys that identify a record line: its head key, and for gres.conf also Name and Type."""
        head = head.lower()
        lowered = {k.lower(): (k, v) for k, v in attrs.items()}
        if head not in lowered or lowered[head][1] in (None, ""):
            raise ValidationError(canonical_key(self.kind, head, head), None, "the record's name")
        ident: Dict[str, Optional[str]] = {canonical_key(self.kind, head, head): str(lowered[head][1])}
        if self.kind == "gres":
            for extra in ("name", "type"):
                if extra != head:
                    value = lowered.get(extra, (None, None))[1]
                    ident[canonical_key(self.kind, extra, head)] = None if value is None else str(value)
        return ident

    # ------------------------------------------------------------------ checking
    def check(self) -> None:
        """Validate every known value in the file; raise ValidationError with the line number."""
        for entry in self.entries:
            if entry.type != "pairs":
                continue
            record = entry.head() if self._is_record(entry) else None
            for pair in entry.pairs:
                info = known_key(self.kind, pair.key, record)
                if info and info[1] is not None:
                    try:
                        info[1](pair.value)
                    except ValueError as exc:
                        line = entry.lineno + entry.physical_of(pair.start)
                        where = f"{self.path} line {line}" if self.path else f"line {line}"
                        raise ValidationError(pair.key, pair.value, str(exc), where)

    # ------------------------------------------------------------------ editing
    def _new_entry(self, text: str, before: Optional[Entry] = None, after: Optional[Entry] = None) -> Entry:
        if after is not None:
            position = self.entries.index(after) + 1
        elif before is not None:
            position = self.entries.index(before)
        else:
            position = len(self.entries)
        if position > 0:
            prev = self.entries[position - 1]
            body, eol = _split_eol(prev.lines[-1])
            code = body[: _comment_start(body)]
            cont = _continuation(code)
            if cont >= 0:
                # a continuation at the end of the file continues nothing; it would swallow the new line
                body = body[:cont] + body[cont + 1:]
            if cont >= 0 or "\n" not in eol:
                # a last line ending in CR alone has no line break (lines split at LF): add one, or the new
                # line would join it (after '#', as part of the comment)
                prev.lines[-1] = body + (eol + "\n" if eol else self._newline())
                prev.parse()
        eol = self._newline()
        entry = Entry([text + eol], 0)
        self.entries.insert(position, entry)
        self._renumber()
        return entry

    def _newline(self) -> str:
        for entry in self.entries:
            for line in entry.lines:
                eol = _split_eol(line)[1]
                if "\n" in eol:
                    return eol
        return "\n"

    def _renumber(self) -> None:
        lineno = 1
        for entry in self.entries:
            entry.lineno = lineno
            lineno += len(entry.lines)

    def _remove_pair(self, entry: Entry, pair: Pair) -> None:
        if len(entry.pairs) == 1:
            self.entries.remove(entry)
            self._renumber()
            return
        start = pair.start
        while start > 0 and entry.code[start - 1] in " \t":
            start -= 1
        if start == 0:  # first pair on the line: eat the blanks after it instead
            end = pair.end
            while end < len(entry.code) and entry.code[end] in _WS:
                end += 1
            entry.replace(pair.start, end, "")
        else:
            entry.replace(start, pair.end, "")

    def _set_pair(self, entry: Entry, pair: Pair, text: str) -> None:
        entry.replace(pair.vstart, pair.end, _quote(text))

    def _append_pair(self, entry: Entry, key: str, text: str) -> None:
        end = len(entry.code.rstrip(_WS))
        entry.replace(end, end, f" {key}={_quote(text)}")

    def set(self, key: str, value: Any) -> bool:
        """Set a global key. Returns True when the file changed. A list value for SlurmctldHost gives one line
        per item; for other keys a list is joined with commas."""
        check_key(key)
        if self._is_record_key(key):
            raise SlurmConfError(f"{key} lines are records: use set_record, not set")
        spelling = canonical_key(self.kind, key)
        if key.lower() in MULTI_LINE_KEYS and isinstance(value, (list, tuple)):
            return self._set_multi(key, spelling, [self._norm(key, v) for v in value])
        text = self._norm(key, value)
        found = [(e, p) for e, p in self.global_pairs() if p.key.lower() == key.lower()]
        if found:
            entry, pair = found[-1]
            if pair.value == text or values_equal(self.kind, key, pair.value, text):
                return False
            self._set_pair(entry, pair, text)
        else:
            self._insert_global(f"{spelling}={_quote(text)}")
        self.changes.append(("global", None, spelling))
        return True

    def _insert_global(self, line: str) -> Entry:
        """Add a global line after the last global setting, else before the first record, else at the end."""
        anchor = None
        for entry, _pair in self.global_pairs():
            anchor = entry
        if anchor is not None:
            return self._new_entry(line, after=anchor)
        return self._new_entry(line, before=next(self.records(), None))

    def _set_multi(self, key: str, spelling: str, texts: List[str]) -> bool:
        found = [(e, p) for e, p in self.global_pairs() if p.key.lower() == key.lower()]
        if [p.value for _e, p in found] == texts:
            return False
        # keep the place of the first occurrence: new lines go right after it, then it goes
        anchor = found[0][0] if found else None
        if anchor is not None:
            for text in reversed(texts):
                self._new_entry(f"{spelling}={_quote(text)}", after=anchor)
        else:
            previous = None
            for text in texts:
                previous = (self._insert_global(f"{spelling}={_quote(text)}") if previous is None
                            else self._new_entry(f"{spelling}={_quote(text)}", after=previous))
        for entry, _pair in reversed(found):
            current = [p for p in entry.pairs if p.key.lower() == key.lower()]
            if entry in self.entries and current:
                self._remove_pair(entry, current[0])
        self.changes.append(("global", None, spelling))
        return True

    def remove(self, key: str) -> bool:
        """Remove every occurrence of a global key. Returns True when the file changed."""
        check_key(key)
        found = [(e, p) for e, p in self.global_pairs() if p.key.lower() == key.lower()]
        if not found:
            return False
        for entry, _pair in reversed(found):
            # the entry may have been re-parsed by an earlier removal: look the pair up again
            current = [p for p in entry.pairs if p.key.lower() == key.lower()]
            if entry in self.entries and current:
                self._remove_pair(entry, current[-1])
        self.changes.append(("global", None, canonical_key(self.kind, key)))
        return True

    def _is_record_key(self, key: str) -> bool:
        return key.lower() in RECORD_KEYS[self.kind]

    def _norm(self, key: str, value: Any, record: Optional[str] = None) -> str:
        if self.validate:
            return normalize_value(self.kind, key, value, record)
        if value is None:
            raise ValidationError(key, value, "a value (use remove to delete a key)")
        if isinstance(value, bool):
            text = ("YES" if value else "NO") if self.kind == "slurm" else ("yes" if value else "no")
        elif isinstance(value, (list, tuple)):
            text = ",".join(str(v) for v in value)
        else:
            text = str(value)
        _check_writable(key, text)
        return text

    def set_record(self, head: str, attrs: Mapping[str, Any], state: str = "present") -> bool:
        """Make a record line (NodeName=..., PartitionName=..., gres NodeName=... Name=gpu ...) present with
        these keys (a value of None removes that key from the line) or absent. Returns True on change."""
        head = head.lower()
        if head not in RECORD_KEYS[self.kind]:
            raise SlurmConfError("{} is not a record key in {}.conf (expected one of {})".format(
                head, self.kind, ", ".join(canonical_key(self.kind, k, k) for k in RECORD_KEYS[self.kind])))
        if state not in ("present", "absent"):
            raise SlurmConfError(f"state must be present or absent, got {state!r}")
        for key in attrs:
            check_key(key)
        ident = self.record_identity(head, attrs)
        name = ident[canonical_key(self.kind, head, head)]
        found = self.find_records(head, ident)
        spelling_head = canonical_key(self.kind, head, head)
        if state == "absent":
            if not found:
                return False
            for entry in found:
                self.entries.remove(entry)
            self._renumber()
            self.changes.append((head, name, None))
            return True
        texts: Dict[str, Optional[str]] = {}
        for key, value in attrs.items():
            if value is None:
                texts[key] = None
            else:
                where = f"{spelling_head}={name}"
                texts[key] = self._norm_record(key, value, head, where)
        changed_keys = []
        if not found:
            parts = []
            head_first = [k for k in texts if k.lower() == head] + [k for k in texts if k.lower() != head]
            for key in head_first:
                value_text = texts[key]
                if value_text is not None:
                    parts.append(f"{canonical_key(self.kind, key, head)}={_quote(value_text)}")
            same = list(self.records(head))
            if same:
                self._new_entry(" ".join(parts), after=same[-1])
            elif head == "nodename" and self.kind == "slurm" and next(self.records("partitionname"), None):
                self._new_entry(" ".join(parts), before=next(self.records("partitionname")))
            else:
                self._new_entry(" ".join(parts))
            self.changes.append((head, name, None))
            return True
        entry = found[-1]
        for key, text in texts.items():
            if key.lower() == head:
                continue
            pair = entry.find(key)
            if text is None:
                if pair is not None:
                    while pair is not None:
                        self._remove_pair(entry, pair)
                        pair = entry.find(key)
                    changed_keys.append(key)
            elif pair is None:
                self._append_pair(entry, canonical_key(self.kind, key, head), text)
                changed_keys.append(key)
            elif not (pair.value == text or values_equal(self.kind, key, pair.value, text, head)):
                self._set_pair(entry, pair, text)
                changed_keys.append(key)
        for key in changed_keys:
            self.changes.append((head, name, canonical_key(self.kind, key, head)))
        return bool(changed_keys)

    def _norm_record(self, key: str, value: Any, head: str, where: str) -> str:
        if self.validate:
            return normalize_value(self.kind, key, value, head, where)
        return self._norm(key, value)

    # ------------------------------------------------------------------ effect of the changes
    def restart_reasons(self, version: Union[None, str, Sequence[int]] = None) -> List[str]:
        """Changed things that need a daemon restart rather than ``scontrol reconfigure``.

        ``version`` is the Slurm release ((major, minor) or text such as '24.11.5'). From 23.11 on, reconfigure
        starts new daemon processes, so only listening ports and authentication need a restart; for older or
        unknown releases the per-key notes of slurm.conf(5) and gres.conf(5) of 22.05 apply."""
        if isinstance(version, str):
            version = parse_version(version)
        new_style = version is not None and tuple(version) >= RECONFIGURE_RESTARTS_FROM
        reasons: List[str] = []
        for scope, name, key in self.changes:
            if scope == "global":
                restart = RESTART_KEYS_2311 if new_style else RESTART_KEYS
                if key is not None and key.lower() in restart[self.kind]:
                    reasons.append(key)
                continue
            label = f"{canonical_key(self.kind, scope, scope)}={name}"
            if new_style:
                if key is not None and key.lower() in RESTART_RECORD_KEYS_2311.get((self.kind, scope), ()):
                    reasons.append(f"{label} {key}")
            elif (self.kind, scope) in RESTART_RECORDS or (
                    self.kind == "gres" and (key is None or key.lower() in RESTART_KEYS["gres"])):
                reasons.append(label if key is None else f"{label} {key}")
        out: List[str] = []
        for reason in reasons:
            if reason not in out:
                out.append(reason)
        return out


# ---------------------------------------------------------------------------------------------------------
# writing


def backup_name(path: str, now: Optional[float] = None) -> str:
    stamp = time.strftime("%Y-%m-%d@%H:%M:%S", time.localtime(now))
    return f"{path}.{os.getpid()}.{stamp}~"


def write_atomic(path: str, text: str, backup: bool = False) -> Optional[str]:
    """Write ``text`` to ``path`` through a temporary file in the same directory and os.replace, keeping the
    old file's mode and owner. With ``backup`` the old file is copied first; its name is returned.

    A symbolic link (slurm.conf linked to shared storage is common) is followed: its target is replaced and the
    link stays."""
    path = os.path.realpath(path)
    backup_path = None
    if backup and os.path.exists(path):
        backup_path = backup_name(path)
        shutil.copy2(path, backup_path)
    atomic_write(path, text, None, keep_owner=True)
    return backup_path
