# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Findings and the report: verdict, the strongest action, evidence."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Tuple

from ..slurmfacts import drain_reason

ACTION_ORDER = ("none", "monitor", "reset_gpu", "reboot", "reimage", "replace")
SEVERITIES = ("info", "warning", "critical", "unknown")
VERDICTS = ("healthy", "degraded", "unhealthy", "unknown")

# severity -> verdict; verdict precedence: unhealthy > unknown > degraded > healthy
_VERDICT_OF = {"info": "healthy", "warning": "degraded", "critical": "unhealthy", "unknown": "unknown"}
_VERDICT_RANK = {"healthy": 0, "degraded": 1, "unknown": 2, "unhealthy": 3}
_SEVERITY_RANK = {"info": 0, "warning": 1, "unknown": 2, "critical": 3}
EXIT_CODES = {"healthy": 0, "degraded": 1, "unhealthy": 2, "unknown": 3}


def action_rank(action: str) -> int:
    return ACTION_ORDER.index(action)


def strongest_action(actions: Iterable[str]) -> str:
    best = "none"
    for a in actions:
        if action_rank(a) > action_rank(best):
            best = a
    return best


@dataclass
class Finding:
    check: str
    severity: str
    detail: str
    action: str = "none"
    code: str = ""
    gpu: Optional[int] = None
    evidence: List[str] = field(default_factory=list)
    pci: Optional[str] = None
    # True when the finding asks for the node to be taken out of service although no automatic repair step
    # applies (e.g. a node-level power brake: drain and let a person investigate, do not reset GPUs).
    drain: bool = False

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"finding.severity: expected one of {', '.join(SEVERITIES)}, got {self.severity!r}")
        if self.action not in ACTION_ORDER:
            raise ValueError(f"finding.action: expected one of {', '.join(ACTION_ORDER)}, got {self.action!r}")
        if not self.code:
            self.code = self.check

    @property
    def rank(self) -> Tuple[int, int]:
        return (_SEVERITY_RANK[self.severity], action_rank(self.action))

    def to_dict(self) -> Dict[str, Any]:
        return {
            "check": self.check,
            "severity": self.severity,
            "gpu": self.gpu,
            "detail": self.detail,
            "evidence": list(self.evidence),
            "action": self.action,
            "code": self.code,
            "pci": self.pci,
            "drain": self.drain,
        }


@dataclass
class Report:
    findings: List[Finding] = field(default_factory=list)
    hostname: Optional[str] = None
    checked_at: Optional[float] = None
    skipped: List[str] = field(default_factory=list)
    state: Optional[Dict[str, Any]] = None  # the state to carry to the next run

    @property
    def worst(self) -> Optional[Finding]:
        best = None
        for f in self.findings:
            if f.severity == "info":
                continue
            if best is None or _VERDICT_RANK[_VERDICT_OF[f.severity]] > _VERDICT_RANK[_VERDICT_OF[best.severity]] or (
                    _VERDICT_OF[f.severity] == _VERDICT_OF[best.severity] and action_rank(f.action) >
                    action_rank(best.action)):
                best = f
        return best

    @property
    def verdict(self) -> str:
        v = "healthy"
        for f in self.findings:
            cand = _VERDICT_OF[f.severity]
            if _VERDICT_RANK[cand] > _VERDICT_RANK[v]:
                v = cand
        return v

    @property
    def action(self) -> str:
        return strongest_action(f.action for f in self.findings)

    @property
    def code(self) -> str:
        w = self.worst
        return w.code if w else "ok"

    @property
    def gpu(self) -> Optional[int]:
        w = self.worst
        return w.gpu if w else None

    @property
    def drain(self) -> bool:
        """True when a finding asks for the node to be drained although no automatic repair applies."""
        return any(f.drain for f in self.findings)

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    @property
    def summary(self) -> str:
        w = self.worst
        if w is None:
            n = len(self.findings)
            return "healthy" + (f" ({n} informational finding{'s' if n != 1 else ''})" if n else "")
        where = f" on gpu {w.gpu}" if w.gpu is not None else (f" on {w.pci}" if w.pci else "")
        others = sum(1 for f in self.findings if f is not w and f.severity != "info")
        more = f"; {others} more finding{'s' if others != 1 else ''}" if others else ""
        return f"{self.verdict}: {w.code}{where} ({w.detail}) -> {self.action}{more}"

    def drain_reason(self) -> str:
        """Short Slurm reason, ``gpufleet: <code> <gpu>``: the worst finding, or the finding that asks for the
        drain when the verdict alone would not drain (not unhealthy)."""
        w = self.worst
        if self.verdict != "unhealthy":
            w = next((f for f in self.findings if f.drain), w)
        if w is None:
            return drain_reason("ok")
        return drain_reason(w.code, w.gpu, w.pci)

    def to_dict(self) -> Dict[str, Any]:
        return {
            "verdict": self.verdict,
            "action": self.action,
            "code": self.code,
            "gpu": self.gpu,
            "drain": self.drain,
            "findings": [f.to_dict() for f in self.findings],
            "summary": self.summary,
        }
