# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Kernel-log parser for GPU health: every Xid / SXid line shape, fallen-off-bus without an Xid, bursts.

Accepted prefixes: raw ``/dev/kmsg`` records (``pri,seq,usec,flags;msg``), ``[sec.usec]``, ``dmesg -T``
``[Sun Feb 23 16:24:18 2025]`` (read as UTC), ``dmesg --time-format iso`` (comma before the microseconds),
``dmesg --decode`` (``kern  :warn  :``), syslog/journald ``Mon DD HH:MM:SS host kernel:``, or none. The
parser never raises on bad input; lines it does not understand are skipped.
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Tuple, Union

from .model import KernelEvent, ascii_re, normalize_pci

_XID_RE = ascii_re(
    r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.[0-9a-fA-F])?"
    r"(?: GPU-I:(?P<gi>\d+))?(?: GPU-CI:(?P<ci>\d+))?\): (?P<xid>\d{1,6}),?"
    r"(?: pid=(?P<pid>'<unknown>'|<unknown>|\d+),?)?(?: name=(?P<name>[^,]*),)?\s*(?P<msg>.*)")
_SXID_RE = ascii_re(
    r"nvidia-nvswitch(?P<sw>\d{1,4}): SXid \((?:PCI:)?(?P<pci>[^)]*)\): (?P<sxid>\d{1,6}),?\s*(?P<msg>.*)")
_FOB_PCI_RE = ascii_re(r"NVRM: The NVIDIA GPU (?P<pci>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.\d)?)")
_FOB_ONE_RE = ascii_re(
    r"NVRM: GPU (?:at )?(?:PCI:)?(?P<pci>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.\d)?):? "
    r"(?:GPU )?has fallen off the bus")
_FOB_TEXT = "fallen off the bus"
_UUID_RE = ascii_re(r"NVRM: GPU at PCI:(?P<pci>[0-9a-fA-F:.]+): (?P<uuid>GPU-[0-9a-fA-F-]{8,})")
_RATE_RE = ascii_re(r"NVRM: Rate limiting .* for GPU at PCI:(?P<pci>[0-9a-fA-F:.]+)")

_RAW_KMSG_RE = ascii_re(r"^(?P<pri>\d{1,4}),(?P<seq>\d{1,20}),(?P<usec>\d{1,20}),[^;]*;")
_MONO_RE = ascii_re(r"\[\s*(?P<mono>\d{1,12}\.\d{1,9})\]")
_ISO_RE = ascii_re(
    r"(?P<y>\d{4})-(?P<mo>\d\d)-(?P<d>\d\d)T(?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)(?:[,.](?P<frac>\d{1,9}))?"
    r"(?P<tz>Z|[+-]\d\d:?\d\d)?")
_CTIME_RE = ascii_re(
    r"\[(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) (?P<mon>[A-Z][a-z]{2}) +(?P<d>\d{1,2}) (?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)"
    r" (?P<y>\d{4})\]")
_MONTHS = {m: i for i, m in enumerate(("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov",
                                       "Dec"), start=1)}
_NVL5_SEV_RE = ascii_re(r"\b(Fatal|Nonfatal|Non-fatal)\b")
_RECOVERY_RE = ascii_re(r"recovery action changed from (?P<old>0x[0-9a-fA-F]+|\d+)[^)]*\)? ?to "
                        r"(?P<new>0x[0-9a-fA-F]+|\d+)")
_GPC_TPC_RE = ascii_re(r"GPC (?P<gpc>\d{1,6}), TPC (?P<tpc>\d{1,6})(?!\d)")  # bounded: int() of 5000 digits raises
_RST_RE = ascii_re(r"RST: (?P<rst>Yes|No), D-RST: (?P<drst>Yes|No)")

Line = Union[str, bytes, KernelEvent]


def _days_from_civil(y: int, m: int, d: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm; no calendar import)."""
    y -= m <= 2
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def _epoch(y: Union[str, int], mo: Union[str, int], d: Union[str, int], h: Union[str, int],
           mi: Union[str, int], s: Union[str, int], frac: Optional[str] = None,
           tz: Optional[str] = None) -> Optional[float]:
    try:
        y, mo, d, h, mi, s = int(y), int(mo), int(d), int(h), int(mi), int(s)
        if not (1970 <= y <= 9999 and 1 <= mo <= 12 and 1 <= d <= 31 and h < 24 and mi < 60 and s < 61):
            return None
        t = float(_days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + s)
    except (ValueError, OverflowError):  # pragma: no cover - the ranges above keep this from happening
        return None
    if frac:
        t += int(frac) / (10 ** len(frac))
    if tz and tz != "Z":
        sign = 1 if tz[0] == "+" else -1
        digits = tz[1:].replace(":", "")
        t -= sign * (int(digits[:2]) * 3600 + int(digits[2:4]) * 60)
    return t


def _times(prefix: str) -> Tuple[Optional[float], Optional[float]]:
    """(monotonic, wallclock) from the text before the NVRM/nvswitch marker."""
    mono: Optional[float] = None
    wall: Optional[float] = None
    m = _MONO_RE.search(prefix)
    if m:
        try:
            mono = float(m.group("mono"))
        except ValueError:
            mono = None
    m = _ISO_RE.search(prefix)
    if m:
        wall = _epoch(m.group("y"), m.group("mo"), m.group("d"), m.group("h"), m.group("mi"), m.group("s"),
                      m.group("frac"), m.group("tz"))
    else:
        m = _CTIME_RE.search(prefix)
        if m and m.group("mon") in _MONTHS:
            wall = _epoch(m.group("y"), _MONTHS[m.group("mon")], m.group("d"), m.group("h"), m.group("mi"),
                          m.group("s"))
    return mono, wall


def _lines(data: Union[None, str, bytes, Iterable[Line]]) -> Iterable[Line]:
    if data is None:
        return ()
    if isinstance(data, bytes):
        data = data.decode("utf-8", "replace")
    if isinstance(data, str):
        # records end at "\n" only: str.splitlines() also splits at \x1c-\x1e, \x85 and U+2028, which would let
        # text inside one record (a process name) start a second, forged record
        return data.split("\n")
    return data


def parse_kmsg(text_or_lines: Union[None, str, bytes, Iterable[Line]], boot_id: Optional[str] = None,
               boot_time: Optional[float] = None) -> List[KernelEvent]:
    """Parse kernel-log text (or an iterable of lines / KernelEvent objects) into GPU-relevant events.

    ``boot_time`` (epoch seconds) dates records that only carry seconds-since-boot.
    """
    events: List[KernelEvent] = []
    pending_fob: _Pending = None  # a "NVRM: The NVIDIA GPU <pci>" line awaiting its 3rd line
    for item in _lines(text_or_lines):
        if isinstance(item, KernelEvent):
            events.append(item)
            continue
        if isinstance(item, bytes):
            item = item.decode("utf-8", "replace")
        if not isinstance(item, str):
            continue
        try:
            ev, pending_fob = _parse_line(item.rstrip("\r\n"), pending_fob, boot_id, boot_time)
        except (ValueError, OverflowError, IndexError):  # pragma: no cover - defensive: never crash on input
            ev = None
        if ev is not None:
            events.append(ev)
    return events


# a "NVRM: The NVIDIA GPU <pci>" line awaiting the line that says it fell off the bus:
# (pci, its line, the text before its marker, lines left to wait)
_Pending = Optional[Tuple[Optional[str], str, str, int]]


def _parse_line(line: str, pending_fob: _Pending, boot_id: Optional[str],
                boot_time: Optional[float]) -> Tuple[Optional[KernelEvent], _Pending]:
    seq: Optional[int] = None
    mono: Optional[float] = None
    body = line
    m = _RAW_KMSG_RE.match(line)
    if m:
        seq = int(m.group("seq"))
        mono = int(m.group("usec")) / 1e6
        body = line[m.end():]
    elif line[:1] == " " and "=" in line[:40] and "NVRM" not in line:
        return None, pending_fob  # /dev/kmsg continuation (" SUBSYSTEM=pci")

    def stamp(ev: KernelEvent, prefix: str) -> KernelEvent:
        pm, pw = _times(prefix)
        ev.monotonic = mono if mono is not None else pm
        ev.wallclock = pw
        if ev.wallclock is None and boot_time is not None and ev.monotonic is not None:
            ev.wallclock = boot_time + ev.monotonic
        ev.seq = seq
        ev.boot_id = boot_id
        return ev

    idx = body.find("NVRM: Xid")
    if idx >= 0:
        m = _XID_RE.search(body, idx)
        if m:
            msg = m.group("msg").strip()
            pid = m.group("pid")
            xid = int(m.group("xid"))
            ev = KernelEvent(kind="xid", raw=line, xid=xid, pci=normalize_pci(m.group("pci")),
                             pid=None if pid in (None, "'<unknown>'", "<unknown>") else pid,
                             name=None if m.group("name") in (None, "<unknown>") else m.group("name").strip(),
                             message=msg,
                             gpu_instance=int(m.group("gi")) if m.group("gi") else None,
                             compute_instance=int(m.group("ci")) if m.group("ci") else None)
            sev = _NVL5_SEV_RE.search(msg)
            if sev and 144 <= xid <= 150:
                ev.severity = "Nonfatal" if sev.group(1) != "Fatal" else "Fatal"
            return stamp(ev, body[:idx]), None
    idx = body.find("SXid")
    if idx >= 0:
        m = _SXID_RE.search(body)
        if m:
            msg = m.group("msg").strip()
            head = msg.split(",", 1)[0].strip()
            ev = KernelEvent(kind="sxid", raw=line, xid=int(m.group("sxid")), pci=normalize_pci(m.group("pci")),
                             message=msg, switch=int(m.group("sw")),
                             severity=head if head in ("Fatal", "Non-fatal") or head.startswith("Severity") else None)
            return stamp(ev, body[:m.start()]), pending_fob
    m = _FOB_PCI_RE.search(body)
    if m:
        pend = (normalize_pci(m.group("pci")), line, body[:m.start()], 3)
        if _FOB_TEXT in body[m.end():]:
            return stamp(KernelEvent(kind="fallen_off_bus", raw=line, xid=79, pci=pend[0],
                                     message="GPU has fallen off the bus (no Xid line)"), pend[2]), None
        return None, pend
    if _FOB_TEXT in body:
        m = _FOB_ONE_RE.search(body)
        if m:
            return stamp(KernelEvent(kind="fallen_off_bus", raw=line, xid=79, pci=normalize_pci(m.group("pci")),
                                     message="GPU has fallen off the bus (no Xid line)"), body[:m.start()]), None
        if pending_fob is not None:
            pci, first, prefix, _unused = pending_fob
            return stamp(KernelEvent(kind="fallen_off_bus", raw=first + "\n" + line, xid=79, pci=pci,
                                     message="GPU has fallen off the bus (no Xid line)"), prefix), None
        return stamp(KernelEvent(kind="fallen_off_bus", raw=line, xid=79, pci=None,
                                 message="a GPU has fallen off the bus (address not printed)"), body), None
    if pending_fob is not None:
        pci, first, prefix, left = pending_fob
        pending_fob = (pci, first, prefix, left - 1) if left > 1 and "NVRM:" in body else None
    m = _UUID_RE.search(body)
    if m:
        return stamp(KernelEvent(kind="gpu_uuid", raw=line, pci=normalize_pci(m.group("pci")),
                                 uuid=m.group("uuid")), body[:m.start()]), pending_fob
    m = _RATE_RE.search(body)
    if m:
        return stamp(KernelEvent(kind="rate_limit", raw=line, pci=normalize_pci(m.group("pci")),
                                 message=body[m.start():].strip()), body[:m.start()]), pending_fob
    return None, pending_fob


def recovery_action_of(ev: KernelEvent) -> Optional[int]:
    """Xid 154: the new recovery action value (0 none .. 7), or None if the text does not say."""
    m = _RECOVERY_RE.search(ev.message or "")
    if not m:
        return None
    try:
        return int(m.group("new"), 0)
    except ValueError:
        return None


def gpc_tpc_of(ev: KernelEvent) -> Optional[Tuple[int, int]]:
    m = _GPC_TPC_RE.search(ev.message or "")
    return (int(m.group("gpc")), int(m.group("tpc"))) if m else None


def reset_flags_of(ev: KernelEvent) -> Optional[Tuple[bool, bool]]:
    """Xid 94/95: (reset required, drain-and-reset required) from ``RST: Yes, D-RST: No``; None if absent."""
    m = _RST_RE.search(ev.message or "")
    return (m.group("rst") == "Yes", m.group("drst") == "Yes") if m else None


def event_time(ev: KernelEvent) -> Optional[float]:
    return ev.wallclock


def group_bursts(events: List[KernelEvent], window_s: float = 180.0) -> List[List[KernelEvent]]:
    """Group events per (kind, pci, code): consecutive events closer than ``window_s`` form one burst.

    Undated events (no wall clock) of one key form a single burst. Returns a list of lists, in first-seen order.
    """
    bursts: List[List[KernelEvent]] = []
    open_by_key: Dict[Tuple[str, Optional[str], Optional[int]], List[KernelEvent]] = {}
    for ev in events:
        key = (ev.kind if ev.kind != "fallen_off_bus" else "xid", ev.pci, ev.xid)
        cur = open_by_key.get(key)
        if cur is not None and _close(cur[-1], ev, window_s):
            cur.append(ev)
            continue
        cur = [ev]
        open_by_key[key] = cur
        bursts.append(cur)
    return bursts


def _close(a: KernelEvent, b: KernelEvent, window_s: float) -> bool:
    if a.wallclock is not None and b.wallclock is not None:
        return abs(b.wallclock - a.wallclock) <= window_s
    if a.monotonic is not None and b.monotonic is not None and a.boot_id == b.boot_id:
        return abs(b.monotonic - a.monotonic) <= window_s
    return True
