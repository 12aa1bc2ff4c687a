# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""RepairConfig: the repair policy's knobs, validated from a plain dict.

Durations are seconds (int/float) or strings such as ``"90s"``, ``"5m"``, ``"24h"``, ``"7d"``.
Fractions are ``0.5`` or ``"50%"``. Limits on unavailable nodes are a count (``2``) or a share
(``"25%"``). Every error names the field and what was expected.

Defaults follow the published anchors (docs/repair.md cites them): a finding must persist 5 min
(Together AI's CompactTTL) and a node rests 30 min after a repair (Together AI's cooldown); at most
3 attempts per incident and 3 per node in 24 h (NVSentinel); escalation to a person after 5 repairs
in 7 days (NVSentinel); one reboot per incident, then the next rung (gpud stops after 2 reboots); the
breaker trips when 50 % of the fleet fails within 5 min (NVSentinel); no more than 20 % of a partition
unavailable (EKS auto-repair) and at least 51 % healthy (medik8s minHealthy).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Optional, Tuple

from ..slurmfacts import NO_EVICT_MARK, REASON_PREFIX
from .model import FAILURE_CLASSES, JOB_ACTIONS, MODES, REPAIR_STEPS, SIGNAL_TO, RepairError

DEFAULT_LADDERS: Dict[str, Tuple[str, ...]] = {
    "gpu_memory": ("reset_gpu", "reboot", "replace"),
    "gpu_lost": ("reboot", "replace"),
    "nvlink": ("reset_gpu", "reboot", "replace"),
    "thermal": ("reboot", "replace"),
    "software": ("reboot", "reimage"),
    "probe": ("reboot", "reimage"),
    "gpu": ("reset_gpu", "reboot", "replace"),
    "other": ("reboot",),
}

DEFAULT_STEP_TIMEOUT = {"reset_gpu": 600.0, "reboot": 1800.0, "reimage": 7200.0, "replace": 7 * 86400.0}

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)?\s*$")
_UNITS = {None: 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(value: Any, where: str) -> float:
    if isinstance(value, bool):
        raise RepairError(f"{where}: expected a duration (seconds, or a string like '5m', '24h', '7d'), got {value!r}")
    if isinstance(value, (int, float)):
        if value < 0 or math.isnan(value):
            raise RepairError(f"{where}: expected a duration >= 0, got {value!r}")
        return float(value)
    if isinstance(value, str):
        m = _DURATION.match(value)
        if m:
            return float(m.group(1)) * _UNITS[m.group(2)]
    raise RepairError(f"{where}: expected a duration (seconds, or a string like '5m', '24h', '7d'), got {value!r}")


def parse_fraction(value: Any, where: str) -> float:
    frac: Optional[float] = None
    if isinstance(value, bool):
        frac = None
    elif isinstance(value, (int, float)):
        frac = float(value)
    elif isinstance(value, str) and value.strip().endswith("%"):
        try:
            frac = float(value.strip()[:-1]) / 100.0
        except ValueError:
            frac = None
    if frac is None or not (0.0 <= frac <= 1.0):
        raise RepairError(f"{where}: expected a fraction between 0 and 1 (0.5 or '50%'), got {value!r}")
    return frac


def parse_int(value: Any, where: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise RepairError(f"{where}: expected an integer >= {minimum}, got {value!r}")
    return value


@dataclass(frozen=True)
class Limit:
    """A limit given as a count or as a share of a total."""

    count: Optional[int] = None
    share: Optional[float] = None

    def of(self, total: int) -> int:
        if self.count is not None:
            return self.count
        if self.share is not None:
            return int(math.floor(self.share * total + 1e-9))
        return total

    def to_value(self) -> Any:
        if self.count is not None:
            return self.count
        if self.share is not None:
            return f"{self.share * 100:g}%"
        return None

    @classmethod
    def parse(cls, value: Any, where: str) -> Limit:
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return cls(count=value)
        if isinstance(value, str) and value.strip().endswith("%"):
            return cls(share=parse_fraction(value, where))
        raise RepairError(f"{where}: expected a node count (e.g. 2) or a share (e.g. '20%'), got {value!r}")


def _mapping(value: Any, where: str, allowed: Iterable[str]) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise RepairError(f"{where}: expected a mapping, got {type(value).__name__}")
    unknown = [k for k in value if k not in allowed]
    if unknown:
        raise RepairError(
            "{}: unknown key(s) {}; expected some of {}".format(
                where, ", ".join(sorted(map(str, unknown))), ", ".join(allowed)
            )
        )
    return value


_TOP = (
    "ttl",
    "cooldown",
    "budget",
    "max_attempts_per_incident",
    "escalate",
    "lemon",
    "ladders",
    "modes",
    "approval_for",
    "blast_radius",
    "breaker",
    "spares",
    "step_timeout",
    "reason_prefix",
    "class_map",
    "hook_actions",
    "resume_degraded",
    "history_keep",
    "jobs",
)
_JOBS = ("action", "by_class", "signal", "signal_to", "grace", "max_evictions", "eviction_window", "opt_out_comment",
         "opt_out_qos")
#: Signals a job may be asked to checkpoint with (scancel --signal takes the name without SIG).
JOB_SIGNALS = ("USR1", "USR2", "TERM", "INT", "HUP", "QUIT", "ALRM", "URG", "CONT", "XCPU")


@dataclass(frozen=True)
class RepairConfig:
    ttl_s: float = 300.0
    cooldown_s: float = 1800.0
    budget_attempts: int = 3
    budget_window_s: float = 86400.0
    max_attempts_per_incident: int = 3
    escalate_repairs: int = 5
    escalate_window_s: float = 7 * 86400.0
    # a new incident inside the cooldown of a verified repair (a relapse) goes to a person at once
    escalate_relapse: bool = True
    lemon_incidents: int = 4
    lemon_window_s: float = 30 * 86400.0
    lemon_action: str = "replace"
    ladders: Dict[str, Tuple[str, ...]] = field(default_factory=lambda: dict(DEFAULT_LADDERS))
    default_mode: str = "automatic"
    modes: Dict[str, str] = field(default_factory=dict)
    # actions that wait for a person's approval in every mode: a replacement files an RMA and takes hardware away
    approval_for: Tuple[str, ...] = ("replace",)
    max_unavailable: Limit = Limit(share=0.2)
    min_healthy: float = 0.51
    domain_limits: Dict[str, Limit] = field(default_factory=dict)
    max_parallel: Optional[int] = None
    breaker_enabled: bool = True
    breaker_window_s: float = 300.0
    breaker_fraction: float = 0.5
    breaker_min_nodes: int = 3
    spares_enabled: bool = True
    spare_on: Tuple[str, ...] = ("evict", "replace", "escalate")
    step_timeout_s: Dict[str, float] = field(default_factory=lambda: dict(DEFAULT_STEP_TIMEOUT))
    reason_prefix: str = REASON_PREFIX
    class_map: Dict[str, str] = field(default_factory=dict)
    hook_actions: Tuple[str, ...] = ("reimage", "replace")
    resume_degraded: bool = True
    history_keep_s: float = 30 * 86400.0
    # the jobs on a node the policy drained (docs/jobs.md): checkpoint and requeue them onto a spare made ready first
    job_action: str = "checkpoint_requeue"
    job_action_by_class: Dict[str, str] = field(default_factory=dict)
    job_signal: str = "USR1"
    job_signal_to: str = "steps"
    job_grace_s: float = 600.0
    max_evictions: int = 4
    eviction_window_s: float = 3600.0
    opt_out_comment: str = NO_EVICT_MARK
    opt_out_qos: Tuple[str, ...] = ()

    def job_action_for(self, failure_class: Optional[str]) -> str:
        return self.job_action_by_class.get(failure_class or "", self.job_action)

    def mode_for(self, failure_class: Optional[str]) -> str:
        return self.modes.get(failure_class or "", self.default_mode)

    def needs_approval(self, failure_class: Optional[str], action: str) -> bool:
        """Whether ``action`` on a node of ``failure_class`` waits for a person: in approval mode, or when the
        action is one of ``approval_for`` (a replacement, by default) in any mode."""
        return self.mode_for(failure_class) == "approval" or action in self.approval_for

    def ladder_for(self, failure_class: str) -> Tuple[str, ...]:
        return self.ladders.get(failure_class, self.ladders.get("other", ("reboot",)))

    @classmethod
    def from_dict(cls, data: Optional[Mapping[str, Any]]) -> RepairConfig:  # noqa: C901 - one flat validator
        top = _mapping(data, "repair config", _TOP)
        kw: Dict[str, Any] = {}
        if "ttl" in top:
            kw["ttl_s"] = parse_duration(top["ttl"], "ttl")
        if "cooldown" in top:
            kw["cooldown_s"] = parse_duration(top["cooldown"], "cooldown")
        if "history_keep" in top:
            kw["history_keep_s"] = parse_duration(top["history_keep"], "history_keep")
        b = _mapping(top.get("budget"), "budget", ("attempts", "window"))
        if "attempts" in b:
            kw["budget_attempts"] = parse_int(b["attempts"], "budget.attempts", 1)
        if "window" in b:
            kw["budget_window_s"] = parse_duration(b["window"], "budget.window")
        if "max_attempts_per_incident" in top:
            kw["max_attempts_per_incident"] = parse_int(
                top["max_attempts_per_incident"], "max_attempts_per_incident", 1
            )
        e = _mapping(top.get("escalate"), "escalate", ("repairs", "window", "relapse"))
        if "repairs" in e:
            kw["escalate_repairs"] = parse_int(e["repairs"], "escalate.repairs", 1)
        if "window" in e:
            kw["escalate_window_s"] = parse_duration(e["window"], "escalate.window")
        if "relapse" in e:
            if not isinstance(e["relapse"], bool):
                raise RepairError(f"escalate.relapse: expected true or false, got {e['relapse']!r}")
            kw["escalate_relapse"] = e["relapse"]
        lm = _mapping(top.get("lemon"), "lemon", ("incidents", "window", "action"))
        if "incidents" in lm:
            kw["lemon_incidents"] = parse_int(lm["incidents"], "lemon.incidents", 1)
        if "window" in lm:
            kw["lemon_window_s"] = parse_duration(lm["window"], "lemon.window")
        if "action" in lm:
            if lm["action"] not in ("replace", "reimage", "escalate"):
                raise RepairError(
                    "lemon.action: expected one of replace, reimage, escalate, got {!r}".format(lm["action"])
                )
            kw["lemon_action"] = lm["action"]
        if "ladders" in top:
            lad = _mapping(top["ladders"], "ladders", FAILURE_CLASSES)
            ladders = dict(DEFAULT_LADDERS)
            for cls_name, steps in lad.items():
                where = f"ladders.{cls_name}"
                if not isinstance(steps, (list, tuple)) or not steps:
                    raise RepairError(
                        "{}: expected a non-empty list of steps from {}, got {!r}".format(
                            where, ", ".join(REPAIR_STEPS), steps
                        )
                    )
                seen = []
                for i, s in enumerate(steps):
                    if s not in REPAIR_STEPS:
                        raise RepairError(
                            "{}[{}]: expected one of {}, got {!r}".format(where, i, ", ".join(REPAIR_STEPS), s)
                        )
                    if s in seen:
                        raise RepairError(f"{where}[{i}]: {s!r} appears twice (one step of each kind per incident)")
                    seen.append(s)
                ladders[cls_name] = tuple(seen)
            kw["ladders"] = ladders
        if "modes" in top:
            md = _mapping(top["modes"], "modes", ("default",) + FAILURE_CLASSES)
            modes = {}
            for k, v in md.items():
                if v not in MODES:
                    raise RepairError(f"modes.{k}: expected automatic or approval, got {v!r}")
                if k == "default":
                    kw["default_mode"] = v
                else:
                    modes[k] = v
            kw["modes"] = modes
        if "approval_for" in top:
            kw["approval_for"] = _action_list(top["approval_for"], "approval_for", REPAIR_STEPS + ("evict",))
        br = _mapping(
            top.get("blast_radius"), "blast_radius", ("max_unavailable", "min_healthy", "domains", "max_parallel")
        )
        if "max_unavailable" in br:
            kw["max_unavailable"] = Limit.parse(br["max_unavailable"], "blast_radius.max_unavailable")
        if "min_healthy" in br:
            kw["min_healthy"] = parse_fraction(br["min_healthy"], "blast_radius.min_healthy")
        if "domains" in br:
            dm = br["domains"]
            if not isinstance(dm, Mapping):
                raise RepairError("blast_radius.domains: expected a mapping of domain kind (rack, switch) to a limit")
            kw["domain_limits"] = {str(k): Limit.parse(v, f"blast_radius.domains.{k}") for k, v in dm.items()}
        if br.get("max_parallel") is not None:
            kw["max_parallel"] = parse_int(br["max_parallel"], "blast_radius.max_parallel", 1)
        bk = _mapping(top.get("breaker"), "breaker", ("enabled", "window", "fraction", "min_nodes"))
        if "enabled" in bk:
            if not isinstance(bk["enabled"], bool):
                raise RepairError("breaker.enabled: expected true or false, got {!r}".format(bk["enabled"]))
            kw["breaker_enabled"] = bk["enabled"]
        if "window" in bk:
            kw["breaker_window_s"] = parse_duration(bk["window"], "breaker.window")
        if "fraction" in bk:
            kw["breaker_fraction"] = parse_fraction(bk["fraction"], "breaker.fraction")
        if "min_nodes" in bk:
            kw["breaker_min_nodes"] = parse_int(bk["min_nodes"], "breaker.min_nodes", 1)
        sp = _mapping(top.get("spares"), "spares", ("enabled", "on"))
        if "enabled" in sp:
            if not isinstance(sp["enabled"], bool):
                raise RepairError("spares.enabled: expected true or false, got {!r}".format(sp["enabled"]))
            kw["spares_enabled"] = sp["enabled"]
        if "on" in sp:
            kw["spare_on"] = _action_list(sp["on"], "spares.on", ("evict", "reimage", "replace", "escalate"))
        if "step_timeout" in top:
            st = _mapping(top["step_timeout"], "step_timeout", REPAIR_STEPS)
            timeouts = dict(DEFAULT_STEP_TIMEOUT)
            for k, v in st.items():
                timeouts[k] = parse_duration(v, f"step_timeout.{k}")
            kw["step_timeout_s"] = timeouts
        if "reason_prefix" in top:
            rp = top["reason_prefix"]
            if not isinstance(rp, str) or not rp.strip():
                raise RepairError(f"reason_prefix: expected a non-empty string, got {rp!r}")
            kw["reason_prefix"] = rp
        if "class_map" in top:
            cm = top["class_map"]
            if not isinstance(cm, Mapping):
                raise RepairError("class_map: expected a mapping of finding code (or code prefix) to a failure class")
            for k, v in cm.items():
                if v not in FAILURE_CLASSES:
                    raise RepairError(
                        "class_map.{}: expected one of {}, got {!r}".format(k, ", ".join(FAILURE_CLASSES), v)
                    )
            kw["class_map"] = {str(k).lower(): v for k, v in cm.items()}
        if "hook_actions" in top:
            kw["hook_actions"] = _action_list(top["hook_actions"], "hook_actions", ("reimage", "replace"))
        if "resume_degraded" in top:
            if not isinstance(top["resume_degraded"], bool):
                raise RepairError("resume_degraded: expected true or false, got {!r}".format(top["resume_degraded"]))
            kw["resume_degraded"] = top["resume_degraded"]
        if "jobs" in top:
            kw.update(_jobs(top["jobs"]))
        return cls(**kw)

    def to_dict(self) -> Dict[str, Any]:
        return {
            "ttl": self.ttl_s,
            "cooldown": self.cooldown_s,
            "budget": {"attempts": self.budget_attempts, "window": self.budget_window_s},
            "max_attempts_per_incident": self.max_attempts_per_incident,
            "escalate": {"repairs": self.escalate_repairs, "window": self.escalate_window_s,
                         "relapse": self.escalate_relapse},
            "lemon": {"incidents": self.lemon_incidents, "window": self.lemon_window_s, "action": self.lemon_action},
            "ladders": {k: list(v) for k, v in self.ladders.items()},
            "modes": dict({"default": self.default_mode}, **self.modes),
            "approval_for": list(self.approval_for),
            "blast_radius": {
                "max_unavailable": self.max_unavailable.to_value(),
                "min_healthy": self.min_healthy,
                "domains": {k: v.to_value() for k, v in self.domain_limits.items()},
                "max_parallel": self.max_parallel,
            },
            "breaker": {
                "enabled": self.breaker_enabled,
                "window": self.breaker_window_s,
                "fraction": self.breaker_fraction,
                "min_nodes": self.breaker_min_nodes,
            },
            "spares": {"enabled": self.spares_enabled, "on": list(self.spare_on)},
            "step_timeout": dict(self.step_timeout_s),
            "reason_prefix": self.reason_prefix,
            "class_map": dict(self.class_map),
            "hook_actions": list(self.hook_actions),
            "resume_degraded": self.resume_degraded,
            "history_keep": self.history_keep_s,
            "jobs": {
                "action": self.job_action,
                "by_class": dict(self.job_action_by_class),
                "signal": self.job_signal,
                "signal_to": self.job_signal_to,
                "grace": self.job_grace_s,
                "max_evictions": self.max_evictions,
                "eviction_window": self.eviction_window_s,
                "opt_out_comment": self.opt_out_comment,
                "opt_out_qos": list(self.opt_out_qos),
            },
        }


def _job_action(value: Any, where: str) -> str:
    if value not in JOB_ACTIONS:
        raise RepairError("{}: expected one of {}, got {!r}".format(where, ", ".join(JOB_ACTIONS), value))
    return str(value)


def _jobs(value: Any) -> Dict[str, Any]:
    """The ``jobs`` section: what happens to the jobs on a node the policy drained."""
    j = _mapping(value, "jobs", _JOBS)
    kw: Dict[str, Any] = {}
    if "action" in j:
        kw["job_action"] = _job_action(j["action"], "jobs.action")
    if "by_class" in j:
        bc = _mapping(j["by_class"], "jobs.by_class", FAILURE_CLASSES)
        kw["job_action_by_class"] = {str(k): _job_action(v, f"jobs.by_class.{k}") for k, v in bc.items()}
    if "signal" in j:
        sig = j["signal"]
        name = sig.upper()[3:] if isinstance(sig, str) and sig.upper().startswith("SIG") else sig
        name = name.upper() if isinstance(name, str) else name
        if name not in JOB_SIGNALS:
            raise RepairError("jobs.signal: expected a signal name from {}, got {!r}".format(
                ", ".join(JOB_SIGNALS), sig))
        kw["job_signal"] = name
    if "signal_to" in j:
        if j["signal_to"] not in SIGNAL_TO:
            raise RepairError("jobs.signal_to: expected one of {}, got {!r}".format(
                ", ".join(SIGNAL_TO), j["signal_to"]))
        kw["job_signal_to"] = j["signal_to"]
    if "grace" in j:
        kw["job_grace_s"] = parse_duration(j["grace"], "jobs.grace")
    if "max_evictions" in j:
        kw["max_evictions"] = parse_int(j["max_evictions"], "jobs.max_evictions", 0)
    if "eviction_window" in j:
        kw["eviction_window_s"] = parse_duration(j["eviction_window"], "jobs.eviction_window")
    if "opt_out_comment" in j:
        oc = j["opt_out_comment"]
        if not isinstance(oc, str):
            raise RepairError(f"jobs.opt_out_comment: expected a text (empty: no marker), got {oc!r}")
        kw["opt_out_comment"] = oc
    if "opt_out_qos" in j:
        q = j["opt_out_qos"]
        if not isinstance(q, (list, tuple)) or not all(isinstance(x, str) and x for x in q):
            raise RepairError(f"jobs.opt_out_qos: expected a list of QOS names, got {q!r}")
        kw["opt_out_qos"] = tuple(q)
    return kw


def _action_list(value: Any, where: str, allowed: Iterable[str]) -> Tuple[str, ...]:
    if not isinstance(value, (list, tuple)):
        raise RepairError("{}: expected a list of actions from {}, got {!r}".format(where, ", ".join(allowed), value))
    for i, a in enumerate(value):
        if a not in allowed:
            raise RepairError("{}[{}]: expected one of {}, got {!r}".format(where, i, ", ".join(allowed), a))
    return tuple(value)
