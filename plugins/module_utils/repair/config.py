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
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from .. import spec
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
#: spec's checks raise RepairError, as every caller of the repair configuration expects
_FAIL = spec.raising(RepairError)


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
    return spec.integer(value, where, minimum, fail=_FAIL)


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
    return spec.mapping(value, where, allowed, fail=_FAIL)


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
        got = self.ladders.get(failure_class)
        return got if got is not None else self.ladders.get("other", ("reboot",))

    @classmethod
    def from_dict(cls, data: Optional[Mapping[str, Any]]) -> RepairConfig:
        """The configuration from its mapping form (the role's ``node_repair_config``), every field checked: an
        error names the field (``budget.window``) and what was expected. Missing fields keep their defaults."""
        top = _mapping(data, "repair config", _TOP)
        kw: Dict[str, Any] = {}
        sections: Dict[str, Mapping[str, Any]] = {}
        for path, name, parse in _FIELDS:
            if len(path) == 1:
                where, where_from = path[0], top
            else:
                if path[0] not in sections:
                    sections[path[0]] = _mapping(top.get(path[0]), path[0], _SECTION_KEYS[path[0]])
                where, where_from = ".".join(path), sections[path[0]]
            if path[-1] in where_from:
                value = parse(where_from[path[-1]], where)
                if value is not _UNSET:
                    kw[name] = value
        if "ladders" in top:
            kw["ladders"] = _ladders(top["ladders"])
        if "modes" in top:
            kw.update(_modes(top["modes"]))
        if "step_timeout" in top:
            st = _mapping(top["step_timeout"], "step_timeout", REPAIR_STEPS)
            given = {k: parse_duration(v, f"step_timeout.{k}") for k, v in st.items()}
            kw["step_timeout_s"] = dict(DEFAULT_STEP_TIMEOUT, **given)
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
    return str(spec.choice(value, where, JOB_ACTIONS, fail=_FAIL))


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
        kw["job_signal_to"] = spec.choice(j["signal_to"], "jobs.signal_to", SIGNAL_TO, fail=_FAIL)
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
        spec.choice(a, f"{where}[{i}]", allowed, fail=_FAIL)
    return tuple(value)


# ------------------------------------------------------------------ RepairConfig.from_dict, field by field
_UNSET = object()  # a parser's answer for "leave the default" (blast_radius.max_parallel: null)


def _bool(value: Any, where: str) -> bool:
    return spec.boolean(value, where, fail=_FAIL)


def _int1(value: Any, where: str) -> int:
    return parse_int(value, where, 1)


def _int1_or_default(value: Any, where: str) -> Any:
    return _UNSET if value is None else parse_int(value, where, 1)


def _choice(*options: str) -> Callable[[Any, str], str]:
    return lambda value, where: str(spec.choice(value, where, options, fail=_FAIL))


def _actions(*allowed: str) -> Callable[[Any, str], Tuple[str, ...]]:
    return lambda value, where: _action_list(value, where, allowed)


def _nonempty(value: Any, where: str) -> str:
    return spec.string(value, where, fail=_FAIL)


def _domains(value: Any, where: str) -> Dict[str, Limit]:
    if not isinstance(value, Mapping):
        raise RepairError(f"{where}: expected a mapping of domain kind (rack, switch) to a limit")
    return {str(k): Limit.parse(v, f"{where}.{k}") for k, v in value.items()}


def _class_map(value: Any, where: str) -> Dict[str, str]:
    if not isinstance(value, Mapping):
        raise RepairError(f"{where}: expected a mapping of finding code (or code prefix) to a failure class")
    for k, v in value.items():
        spec.choice(v, f"{where}.{k}", FAILURE_CLASSES, fail=_FAIL)
    return {str(k).lower(): v for k, v in value.items()}


def _ladders(value: Any) -> Dict[str, Tuple[str, ...]]:
    lad = _mapping(value, "ladders", FAILURE_CLASSES)
    ladders = dict(DEFAULT_LADDERS)
    for cls_name, steps in lad.items():
        where = f"ladders.{cls_name}"
        if not isinstance(steps, (list, tuple)) or not steps:
            raise RepairError(f"{where}: expected a non-empty list of steps from {', '.join(REPAIR_STEPS)}, "
                              f"got {steps!r}")
        seen: List[str] = []
        for i, s in enumerate(steps):
            spec.choice(s, f"{where}[{i}]", REPAIR_STEPS, fail=_FAIL)
            if s in seen:
                raise RepairError(f"{where}[{i}]: {s!r} appears twice (one step of each kind per incident)")
            seen.append(s)
        ladders[cls_name] = tuple(seen)
    return ladders


def _modes(value: Any) -> Dict[str, Any]:
    md = _mapping(value, "modes", ("default",) + FAILURE_CLASSES)
    kw: Dict[str, Any] = {}
    modes = {}
    for k, v in md.items():
        spec.choice(v, f"modes.{k}", MODES, fail=_FAIL)
        if k == "default":
            kw["default_mode"] = v
        else:
            modes[k] = v
    kw["modes"] = modes
    return kw


#: (path in the mapping, RepairConfig field, parser(value, where)) for every field but ladders, modes,
#: step_timeout and jobs, in the order they are checked
_FIELDS: Tuple[Tuple[Tuple[str, ...], str, Callable[[Any, str], Any]], ...] = (
    (("ttl",), "ttl_s", parse_duration),
    (("cooldown",), "cooldown_s", parse_duration),
    (("history_keep",), "history_keep_s", parse_duration),
    (("budget", "attempts"), "budget_attempts", _int1),
    (("budget", "window"), "budget_window_s", parse_duration),
    (("max_attempts_per_incident",), "max_attempts_per_incident", _int1),
    (("escalate", "repairs"), "escalate_repairs", _int1),
    (("escalate", "window"), "escalate_window_s", parse_duration),
    (("escalate", "relapse"), "escalate_relapse", _bool),
    (("lemon", "incidents"), "lemon_incidents", _int1),
    (("lemon", "window"), "lemon_window_s", parse_duration),
    (("lemon", "action"), "lemon_action", _choice("replace", "reimage", "escalate")),
    (("approval_for",), "approval_for", _actions(*REPAIR_STEPS, "evict")),
    (("blast_radius", "max_unavailable"), "max_unavailable", Limit.parse),
    (("blast_radius", "min_healthy"), "min_healthy", parse_fraction),
    (("blast_radius", "domains"), "domain_limits", _domains),
    (("blast_radius", "max_parallel"), "max_parallel", _int1_or_default),
    (("breaker", "enabled"), "breaker_enabled", _bool),
    (("breaker", "window"), "breaker_window_s", parse_duration),
    (("breaker", "fraction"), "breaker_fraction", parse_fraction),
    (("breaker", "min_nodes"), "breaker_min_nodes", _int1),
    (("spares", "enabled"), "spares_enabled", _bool),
    (("spares", "on"), "spare_on", _actions("evict", "reimage", "replace", "escalate")),
    (("reason_prefix",), "reason_prefix", _nonempty),
    (("class_map",), "class_map", _class_map),
    (("hook_actions",), "hook_actions", _actions("reimage", "replace")),
    (("resume_degraded",), "resume_degraded", _bool),
)
#: the keys each section allows, in _FIELDS' order
_SECTION_KEYS: Dict[str, Tuple[str, ...]] = {
    section: tuple(f[0][1] for f in _FIELDS if f[0][0] == section and len(f[0]) == 2)
    for section in dict.fromkeys(f[0][0] for f in _FIELDS if len(f[0]) == 2)
}
