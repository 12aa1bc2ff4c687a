# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Slurm node as the adapter reports it: one model for every backend, body and test.

``state`` is the base state in lower case (``idle``, ``mixed``, ``allocated``, ``down``, ...) and ``flags`` the
upper-case state flags (``DRAIN``, ``COMPLETING``, ``NOT_RESPONDING``, ...), whichever Slurm output they came from.
Whether a node is out of service and whether we took it out are the one rule of ``slurmfacts.py``; the
properties here only apply it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, Dict, FrozenSet, Iterable, List, Optional, Sequence, Tuple, Union

from .. import slurmfacts
from ..slurmfacts import REBOOT_FLAGS

BASE_STATES = ("idle", "mixed", "allocated", "down", "error", "future", "unknown")
NEXT_STATES = ("resume", "down", "undrain")

_SUFFIXES = {"*": "NOT_RESPONDING", "~": "POWERED_DOWN", "#": "POWERING_UP", "%": "POWERING_DOWN",
             "!": "POWER_DOWN", "@": "REBOOT_REQUESTED", "^": "REBOOT_ISSUED", "$": "MAINTENANCE"}
# sinfo's long names, should a caller hand one in
_ALIASES = {"drained": ("idle", "DRAIN"), "draining": ("mixed", "DRAIN"), "completing": ("idle", "COMPLETING")}


def split_state(state: Union[str, Sequence[Any], None], flags: Iterable[Any] = ()) -> Tuple[str, FrozenSet[str]]:
    """('IDLE', ['DRAIN']) or ['IDLE', 'DRAIN'] or 'IDLE*+DRAIN' -> ('idle', frozenset({'DRAIN', ...}))."""
    parts: List[str] = []
    if isinstance(state, (list, tuple)):
        parts = [str(s) for s in state]
    elif state:
        parts = str(state).split("+")
    out_flags = set(str(f).upper() for f in flags or ())
    base: Optional[str] = None
    for part in parts:
        p = part.strip()
        while p and p[-1] in _SUFFIXES:
            out_flags.add(_SUFFIXES[p[-1]])
            p = p[:-1]
        low = p.lower()
        if base is None and low in BASE_STATES:
            base = low
        elif p:
            out_flags.add(p.upper())
    if base is None:
        for f in list(out_flags):
            if f.lower() in _ALIASES:
                out_flags.discard(f)
                b, extra_flag = _ALIASES[f.lower()]
                base = b
                out_flags.add(extra_flag)
    return base or "unknown", frozenset(out_flags)


@dataclass
class Node:
    name: str
    state: str = "unknown"
    flags: FrozenSet[str] = field(default_factory=frozenset)
    reason: str = ""
    reason_user: str = ""
    reason_time: Optional[int] = None
    partitions: List[str] = field(default_factory=list)
    features: List[str] = field(default_factory=list)
    gres: str = ""
    gres_used: str = ""
    comment: str = ""
    extra: str = ""
    boot_time: Optional[int] = None
    next_state: str = ""
    cpus: Optional[int] = None
    alloc_cpus: Optional[int] = None
    address: str = ""
    version: str = ""

    # -- the rules of slurmfacts.py, applied (never a copy of them) ------------------------------------------
    @property
    def busy(self) -> bool:
        """Jobs still on the node (running or completing)."""
        return slurmfacts.busy(self.state, self.flags)

    @property
    def out_of_service(self) -> bool:
        """DOWN, drained, draining or failed."""
        return slurmfacts.out_of_service(self.state, self.flags)

    def foreign(self, prefix: str) -> Optional[str]:
        """None when we may act on the node; else why not (out of service with a reason not starting ``prefix``)."""
        return slurmfacts.foreign_reason(self.state, self.flags, self.reason, prefix)

    def drained_by(self, prefix: str) -> bool:
        """Out of service with a reason that starts with ``prefix``: we took it out, we may bring it back."""
        return slurmfacts.drained_by(self.state, self.flags, self.reason, prefix)

    @property
    def drained(self) -> bool:
        """Slurm's DRAINED: the DRAIN flag and no job left (whoever drained it)."""
        return "DRAIN" in self.flags and not self.busy

    @property
    def draining(self) -> bool:
        return "DRAIN" in self.flags and self.busy

    @property
    def is_down(self) -> bool:
        return self.state == "down"

    @property
    def not_responding(self) -> bool:
        return "NOT_RESPONDING" in self.flags

    @property
    def reboot_pending(self) -> bool:
        return bool(self.flags & REBOOT_FLAGS)

    @property
    def sinfo_state(self) -> str:
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

    def but(self, **changes: Any) -> Node:
        """A copy with some fields changed (what a change is predicted to do, in check mode)."""
        return replace(self, **changes)

    def to_dict(self) -> Dict[str, Any]:
        d = asdict(self)
        d["flags"] = sorted(self.flags)
        d["drained"] = self.drained
        d["draining"] = self.draining
        d["sinfo_state"] = self.sinfo_state
        return d

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> Node:
        """The inverse of to_dict (derived keys ignored): a node from a cached inventory record."""
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        fields["flags"] = frozenset(str(f) for f in fields.get("flags") or ())
        return cls(**fields)
