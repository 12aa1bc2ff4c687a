"""Operating policies: how a fault is found, who acts on the repair plan, and how spares are used.

A policy is *not* a second model of the health rules or of the repair ladder: which symptom is unhealthy and
which action comes next always come from the collection's brain (``plugins/module_utils/health`` and
``plugins/module_utils/repair``, see ``brain.py``). A policy only sets the operating knobs around it:

detection        reactive: the job finds out by crashing; passive: the health agent runs the real rules every
                 ``check_interval_min`` on each node and drains on its verdict (precursors included).
repair           manual: a person carries out each planned step during business hours; auto: the plan is
                 executed at once; approval: each step waits for a human approval delay (Together-style).
spares           none: the job waits for its own node; cold: an idle node must be provisioned first;
                 hot: idle nodes are kept validated and swap in within ``hot_swap_min``.
identify         human: a person has to find the bad node before the job can restart (no automation);
                 auto: the scheduler excludes the node the job died on.
jobs             the repair policy's ``jobs.action`` (passed to the brain's RepairConfig): what plan() does with
                 a job on a node it drained: wait (the job keeps the node until the fault or its end),
                 requeue (stop it now, losing the work since its checkpoint), checkpoint_requeue (signal it to
                 checkpoint, then requeue it: no lost work). Every built-in policy sets it explicitly.
"""

from __future__ import annotations

from typing import Any

from ansible_collections.gpufleet.reliability.plugins.module_utils import spec as checks

from .dists import SpecError

KNOBS = {
    "detection": ("reactive", "passive"),
    "repair": ("manual", "auto", "approval"),
    "spares": ("none", "cold", "hot"),
    "identify": ("human", "auto"),
    "jobs": ("wait", "requeue", "checkpoint_requeue"),
}

BUILTIN: dict[str, dict[str, Any]] = {
    "reactive-manual": {"detection": "reactive", "repair": "manual", "spares": "cold", "identify": "human",
                        "jobs": "checkpoint_requeue", "label": "Reactive, manual repair"},
    "reactive-auto": {"detection": "reactive", "repair": "auto", "spares": "cold", "identify": "auto",
                      "jobs": "checkpoint_requeue", "label": "Reactive, automatic requeue + repair"},
    "passive-wait": {"detection": "passive", "repair": "auto", "spares": "cold", "identify": "auto",
                     "jobs": "wait", "label": "Passive checks + auto-repair, drained jobs keep the node (jobs: wait)"},
    "passive+auto-repair": {"detection": "passive", "repair": "auto", "spares": "cold", "identify": "auto",
                            "jobs": "checkpoint_requeue", "label": "Passive checks + auto-repair"},
    "passive+auto-repair+hot-spares": {"detection": "passive", "repair": "auto", "spares": "hot",
                                       "identify": "auto", "jobs": "checkpoint_requeue",
                                       "label": "Passive + auto-repair + hot spares"},
    "together-approval": {"detection": "passive", "repair": "approval", "spares": "hot", "identify": "auto",
                          "jobs": "checkpoint_requeue", "label": "Passive + human-approved repair (Together-style)"},
}


def resolve(spec: Any, path: str = "policy") -> dict:
    """Turn a policy name or a user mapping (optionally ``base: <builtin>``) into a complete knob dict."""
    if isinstance(spec, str):
        if spec not in BUILTIN:
            raise SpecError(f"{path}: unknown policy {spec!r}; expected one of {sorted(BUILTIN)} or a mapping")
        out = dict(BUILTIN[spec])
        out["name"] = spec
        return out
    if not isinstance(spec, dict):
        raise SpecError(f"{path}: expected a policy name or a mapping, got {type(spec).__name__}")
    allowed = set(KNOBS) | {"name", "base", "label", "check_interval_min", "approval_delay_min", "auto_approve"}
    checks.unknown_keys(spec, sorted(allowed), path, fail=checks.raising(SpecError))
    if "name" not in spec or not isinstance(spec["name"], str):
        raise SpecError(f"{path}.name: required field is missing (expected a string)")
    base = spec.get("base", "passive+auto-repair")
    if base not in BUILTIN:
        raise SpecError(f"{path}.base: expected one of {sorted(BUILTIN)}, got {base!r}")
    out = dict(BUILTIN[base])
    for k, options in KNOBS.items():
        if k in spec:
            if spec[k] not in options:
                raise SpecError(f"{path}.{k}: expected one of {list(options)}, got {spec[k]!r}")
            out[k] = spec[k]
    if "check_interval_min" in spec:
        v = spec["check_interval_min"]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < float("inf"):
            raise SpecError(f"{path}.check_interval_min: expected a number > 0, got {v!r}")
        out["check_interval_min"] = float(v)
    if "approval_delay_min" in spec:
        out["approval_delay_min"] = spec["approval_delay_min"]
    out["name"] = spec["name"]
    out["label"] = spec.get("label", spec["name"])
    return out


def load_file(path: str) -> list[dict]:
    """A user policy file: a mapping (one policy) or a list of mappings."""
    import yaml

    try:
        with open(path) as fh:
            data = yaml.safe_load(fh)
    except OSError as e:
        raise SpecError(f"{path}: cannot read policy file: {e}")
    items = data if isinstance(data, list) else [data]
    return [resolve(p, f"{path}[{i}]") for i, p in enumerate(items)]
