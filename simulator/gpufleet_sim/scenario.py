"""Scenario YAML: loading and validation.

Every error names the field (``faults[2].rate_per_1000_node_days``) and says what was expected. The result
is a plain, fully defaulted dict plus parsed samplers, so the engine never re-checks input.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

from ansible_collections.gpufleet.reliability.plugins.module_utils import safeyaml, spec

from . import sources
from .dists import SpecError, parse_duration
from .policies import resolve

# the repair brain's vocabulary (plugins/module_utils/repair/model.py REPAIR_STEPS)
ACTIONS = ("reset_gpu", "reboot", "reimage", "replace")
LEVEL = {"none": 0, "reset_gpu": 1, "reboot": 2, "reimage": 3, "replace": 4}
CATEGORIES = ("gpu", "network", "host", "software", "maintenance", "unknown")
EFFECTS = ("crash", "silent", "straggler")
SCOPES = ("node", "rack", "job")

DEFAULT_ACTIONS = {
    "reset_gpu": {"duration_min": {"dist": "lognormal", "median": 5, "p90": 15}, "success": 0.7},
    "reboot": {"duration_min": {"dist": "lognormal", "median": 15, "p90": 30}, "success": 0.9},
    "reimage": {"duration_min": {"dist": "lognormal", "median": 60, "p90": 120}, "success": 0.95},
    # technician swap; the parts lead time is repair.rma_lead_days
    "replace": {"duration_min": {"dist": "lognormal", "median": 240, "p90": 480}, "success": 0.95},
}


_FAIL = spec.raising(SpecError)
#: how each kind of field is checked (plugins/module_utils/spec.py: the one validator of every config reader)
_CHECK = {float: spec.number, int: spec.integer, bool: spec.boolean, list: spec.sequence,
          str: lambda v, where, fail: spec.string(v, where, empty_ok=True, fail=fail),
          dict: lambda v, where, fail: spec.mapping(v, where, none_ok=False, fail=fail)}


def _get(d: dict, key: str, path: str, kind, default: Any = ..., check=None):
    if key not in d or d[key] is None:
        if default is ...:
            raise SpecError(f"{path}.{key}: required field is missing (expected {_kname(kind)})")
        return copy.deepcopy(default)
    v = d[key]
    where = f"{path}.{key}"
    if kind in _CHECK:
        checked = _CHECK[kind](v, where, fail=_FAIL)
        v = checked if kind is float else v  # a number is a float from here on; a mapping stays the caller's
    if check is not None:
        msg = check(v)
        if msg:
            raise SpecError(f"{where}: expected {msg}, got {v!r}")
    return v


def _kname(kind) -> str:
    return {float: "a number", int: "an integer", bool: "true/false", str: "a string", list: "a list",
            dict: "a mapping"}.get(kind, "a value")


def _pos(v):
    return None if v > 0 else "a value > 0"


def _nonneg(v):
    return None if v >= 0 else "a value >= 0"


def _prob(v):
    return None if 0 <= v <= 1 else "a probability between 0 and 1"


def _slowdown(v):
    # the share of speed lost: 1.0 would stop the job for good
    return None if 0 <= v < 1 else "the share of speed lost, >= 0 and < 1"


def _one_of(options):
    return lambda v: None if v in options else f"one of {list(options)}"


def _unknown(d: dict, allowed: set, path: str) -> None:
    spec.unknown_keys(d, sorted(allowed), path, fail=_FAIL)


def _dur(d: dict, key: str, path: str, default: Any = ...):
    spec = d.get(key, default) if d.get(key) is not None else default
    if spec is ...:
        raise SpecError(f"{path}.{key}: required field is missing (expected a duration)")
    sampler, mean = parse_duration(f"{path}.{key}", spec)
    return {"spec": spec, "sample": sampler, "mean": mean}


def _kmsg(d: dict, key: str, path: str) -> list[str]:
    v = d.get(key) or []
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise SpecError(f"{path}.{key}: expected a list of kernel-log lines (strings)")
    return v


def validate(raw: Any, source: str = "scenario") -> dict:
    """Validate a scenario mapping; return the normalised scenario. Raise SpecError naming the field."""
    if not isinstance(raw, dict):
        raise SpecError(f"{source}: expected a mapping at the top level, got {type(raw).__name__}")
    top = {"name", "description", "horizon_days", "seeds", "price_per_gpu_hour", "spare_cost_per_gpu_hour", "cluster",
           "jobs", "faults", "false_positives", "lemons", "repair", "policies", "health_config", "repair_config",
           "sweep", "estimates", "sources"}
    _unknown(raw, top, source)
    sc: dict = {"name": _get(raw, "name", source, str, "scenario"),
                "description": _get(raw, "description", source, str, "")}
    sc["horizon_days"] = _get(raw, "horizon_days", source, float, None, _pos) if raw.get("horizon_days") else None
    sc["seeds"] = _get(raw, "seeds", source, int, 10, lambda v: None if v >= 1 else "an integer >= 1")
    sc["price_per_gpu_hour"] = _get(raw, "price_per_gpu_hour", source, float, 3.0, _nonneg)
    # what an idle spare GPU-hour costs (owned or rented, it is paid for): by default the same price
    sc["spare_cost_per_gpu_hour"] = _get(raw, "spare_cost_per_gpu_hour", source, float, sc["price_per_gpu_hour"],
                                         _nonneg)

    c = _get(raw, "cluster", source, dict)
    cp = f"{source}.cluster"
    _unknown(c, {"nodes", "gpus_per_node", "nodes_per_rack", "idle_nodes_fail", "gpu_type"}, cp)
    cluster = {
        "nodes": _get(c, "nodes", cp, int, check=lambda v: None if v >= 1 else "an integer >= 1"),
        "gpus_per_node": _get(c, "gpus_per_node", cp, int, 8, lambda v: None if v >= 1 else "an integer >= 1"),
        "nodes_per_rack": _get(c, "nodes_per_rack", cp, int, 16, lambda v: None if v >= 1 else "an integer >= 1"),
        "idle_nodes_fail": _get(c, "idle_nodes_fail", cp, bool, True),
        "gpu_type": _get(c, "gpu_type", cp, str, "H100"),
    }
    sc["cluster"] = cluster

    jobs_raw = _get(raw, "jobs", source, list)
    if not jobs_raw:
        raise SpecError(f"{source}.jobs: expected at least one job")
    jobs = []
    used = 0
    for i, j in enumerate(jobs_raw):
        jp = f"{source}.jobs[{i}]"
        if not isinstance(j, dict):
            raise SpecError(f"{jp}: expected a mapping")
        _unknown(j, {"name", "nodes", "work_hours", "checkpoint_interval_min", "checkpoint_cost_min", "restart_min",
                     "faults_while_down", "standbys"}, jp)
        ci = j.get("checkpoint_interval_min", "young")
        if not (ci in ("young", "daly") or (isinstance(ci, (int, float)) and not isinstance(ci, bool) and ci >= 0)):
            raise SpecError(f"{jp}.checkpoint_interval_min: expected a number >= 0 (0: in-memory checkpoint every "
                            f"step, no lost work) or 'young' or 'daly', got {ci!r}")
        job = {
            "name": _get(j, "name", jp, str, f"job{i}"),
            "nodes": _get(j, "nodes", jp, int, check=lambda v: None if v >= 1 else "an integer >= 1"),
            "work_hours": _get(j, "work_hours", jp, float, None, _pos) if j.get("work_hours") is not None else None,
            "checkpoint_interval_min": ci,
            "checkpoint_cost_min": _get(j, "checkpoint_cost_min", jp, float, 1.0, _nonneg),
            "restart_min": _dur(j, "restart_min", jp, {"dist": "lognormal", "median": 10, "p90": 25}),
            "faults_while_down": _get(j, "faults_while_down", jp, bool, True),
            # warm standbys of the job's own (AIReSim's): a failed node's slot takes the first of them; repaired nodes
            # refill the list in the order they come back; 0: every replacement is drawn from the idle pool
            "standbys": _get(j, "standbys", jp, int, 0, lambda v: None if v >= 0 else "an integer >= 0"),
        }
        if ci == 0 and job["checkpoint_cost_min"] > 0:
            raise SpecError(f"{jp}.checkpoint_interval_min: 0 means an in-memory checkpoint every step, free; with "
                            f"checkpoint_cost_min {job['checkpoint_cost_min']:g} give an interval in minutes, or "
                            "'young' / 'daly'")
        used += job["nodes"]
        jobs.append(job)
    if used > cluster["nodes"]:
        raise SpecError(f"{source}.jobs: the jobs need {used} nodes but cluster.nodes is {cluster['nodes']}")
    if sc["horizon_days"] is None and any(j["work_hours"] is None for j in jobs):
        raise SpecError(f"{source}.horizon_days: required unless every job sets work_hours")
    sc["jobs"] = jobs

    faults_raw = _get(raw, "faults", source, list)
    faults = []
    names = set()
    for i, f in enumerate(faults_raw):
        fp = f"{source}.faults[{i}]"
        if not isinstance(f, dict):
            raise SpecError(f"{fp}: expected a mapping")
        _unknown(f, {"name", "category", "hardware", "rate_per_1000_node_days", "rate_per_gpu_year", "job_mtbf_h",
                     "weibull_shape", "scope", "effect", "job_detect_min", "kmsg", "visible", "precursor",
                     "fixed_by", "lemon", "silent_detect_h", "slowdown", "episode_min", "outage_h", "note",
                     "source"}, fp)
        if f.get("source") is not None:
            sources.check_source(f["source"], f"{fp}.source")
        name = _get(f, "name", fp, str)
        if name in names:
            raise SpecError(f"{fp}.name: expected a unique fault name, {name!r} is used twice")
        names.add(name)
        rates = [k for k in ("rate_per_1000_node_days", "rate_per_gpu_year", "job_mtbf_h") if f.get(k) is not None]
        if len(rates) != 1:
            raise SpecError(f"{fp}: expected exactly one of rate_per_1000_node_days, rate_per_gpu_year, job_mtbf_h; "
                            f"got {rates or 'none'}")
        category = _get(f, "category", fp, str, "gpu", _one_of(CATEGORIES))
        fault = {
            "name": name,
            "category": category,
            "hardware": _get(f, "hardware", fp, bool, category in ("gpu", "network", "host")),
            "scope": _get(f, "scope", fp, str, "node", _one_of(SCOPES)),
            "effect": _get(f, "effect", fp, str, "crash", _one_of(EFFECTS)),
            "weibull_shape": _get(f, "weibull_shape", fp, float, 1.0, _pos),
            "job_detect_min": _dur(f, "job_detect_min", fp, 0.5),
            "kmsg": _kmsg(f, "kmsg", fp),
            "visible": _get(f, "visible", fp, float, 1.0, _prob),
            "fixed_by": _get(f, "fixed_by", fp, str, "reboot", _one_of(ACTIONS)),
            "lemon": _get(f, "lemon", fp, bool, category == "gpu"),
            "silent_detect_h": _dur(f, "silent_detect_h", fp, {"dist": "uniform", "low": 1, "high": 48}),
            "slowdown": _get(f, "slowdown", fp, float, 0.2, _slowdown),
            "episode_min": _dur(f, "episode_min", fp, {"dist": "uniform", "low": 10, "high": 72}),
            "outage_h": _dur(f, "outage_h", fp, {"dist": "lognormal", "median": 1, "p90": 4}),
        }
        key = rates[0]
        val = _get(f, key, fp, float, check=_nonneg)
        gpn = cluster["gpus_per_node"]
        if key == "rate_per_1000_node_days":
            per_node_h = val / 1000.0 / 24.0
        elif key == "rate_per_gpu_year":
            per_node_h = val * gpn / (365.0 * 24.0)
        else:
            if fault["scope"] != "job":
                raise SpecError(f"{fp}.job_mtbf_h: only valid with scope: job (a per-job failure rate)")
            if val <= 0:
                raise SpecError(f"{fp}.job_mtbf_h: expected a value > 0, got {val}")
            per_node_h = None
            fault["job_mtbf_h"] = val
        fault["per_node_h"] = per_node_h
        pre = f.get("precursor")
        if pre is not None:
            pp = f"{fp}.precursor"
            if not isinstance(pre, dict):
                raise SpecError(f"{pp}: expected a mapping with share, lead_h and kmsg")
            _unknown(pre, {"share", "lead_h", "kmsg"}, pp)
            fault["precursor"] = {"share": _get(pre, "share", pp, float, check=_prob),
                                  "lead_h": _dur(pre, "lead_h", pp, {"dist": "lognormal", "median": 4, "p90": 24}),
                                  "kmsg": _kmsg(pre, "kmsg", pp)}
            if not fault["precursor"]["kmsg"]:
                raise SpecError(f"{pp}.kmsg: expected at least one kernel-log line the health rules can judge")
        else:
            fault["precursor"] = None
        if fault["effect"] == "crash" and fault["scope"] == "node" and fault["hardware"] and not fault["kmsg"]:
            raise SpecError(f"{fp}.kmsg: a hardware crash fault needs the kernel-log lines it emits "
                            f"(the health rules judge them); use effect: silent for faults no check sees")
        faults.append(fault)
    if not faults:
        raise SpecError(f"{source}.faults: expected at least one fault class")
    sc["faults"] = faults

    sc["false_positive"] = _false_positive(_get(raw, "false_positives", source, dict, {}), f"{source}.false_positives")

    lem = _get(raw, "lemons", source, dict, {})
    lp = f"{source}.lemons"
    _unknown(lem, {"fraction", "multiplier", "cured_by", "cure_probability", "cure_probability_then"}, lp)
    sc["lemons"] = {"fraction": _get(lem, "fraction", lp, float, 0.0, _prob),
                    "multiplier": _get(lem, "multiplier", lp, float, 5.0, lambda v: None if v >= 1 else "a value >= 1"),
                    "cured_by": _get(lem, "cured_by", lp, str, "replace", _one_of(ACTIONS)),
                    # misdiagnosis: a repair that passes verification but leaves the lemon's fault in place
                    "cure_probability": _get(lem, "cure_probability", lp, float, 1.0, _prob)}
    # a repair whose second stage ran (repair.actions.<a>.then: AIReSim's manual repair after its automated one)
    # cures with this chance instead; by default the same
    sc["lemons"]["cure_probability_then"] = _get(lem, "cure_probability_then", lp, float,
                                                 sc["lemons"]["cure_probability"], _prob)

    rep = _get(raw, "repair", source, dict, {})
    rp = f"{source}.repair"
    _unknown(rep, {"actions", "human_response_min", "business_hours", "approval_delay_min", "hot_swap_min",
                   "cold_swap_min", "verify_min", "rma_lead_days", "check_interval_min", "check_detect_min",
                   "technicians", "run_interval_min"}, rp)
    acts_raw = _get(rep, "actions", rp, dict, {})
    _unknown(acts_raw, set(ACTIONS), f"{rp}.actions")
    actions = {}
    for a in ACTIONS:
        ap = f"{rp}.actions.{a}"
        spec = dict(DEFAULT_ACTIONS[a])
        spec.update(_get(acts_raw, a, f"{rp}.actions", dict, {}))
        _unknown(spec, {"duration_min", "success", "then"}, ap)
        actions[a] = {"duration_min": _dur(spec, "duration_min", ap),
                      "success": _get(spec, "success", ap, float, check=_prob)}
        then = _get(spec, "then", ap, dict, None)
        if then is not None:  # a second stage for a share of the steps (AIReSim: manual repair after automated)
            tp = f"{ap}.then"
            _unknown(then, {"probability", "duration_min"}, tp)
            actions[a]["then"] = {"probability": _get(then, "probability", tp, float, check=_prob),
                                  "duration_min": _dur(then, "duration_min", tp)}
    bh = rep.get("business_hours", {"start": 9, "end": 17, "weekdays": 5})
    if bh is not None:
        bp = f"{rp}.business_hours"
        if not isinstance(bh, dict):
            raise SpecError(f"{bp}: expected a mapping with start, end, weekdays, or null for 24/7 staffing")
        _unknown(bh, {"start", "end", "weekdays"}, bp)
        bh = {"start": _get(bh, "start", bp, float, 9, lambda v: None if 0 <= v < 24 else "an hour 0-24"),
              "end": _get(bh, "end", bp, float, 17, lambda v: None if 0 < v <= 24 else "an hour 0-24"),
              "weekdays": _get(bh, "weekdays", bp, int, 5, lambda v: None if 1 <= v <= 7 else "1..7")}
        if bh["end"] <= bh["start"]:
            raise SpecError(f"{bp}.end: expected an hour after start ({bh['start']}), got {bh['end']}")
    sc["repair"] = {
        "actions": actions,
        "human_response_min": _dur(rep, "human_response_min", rp, {"dist": "lognormal", "median": 30, "p90": 120}),
        "business_hours": bh,
        "approval_delay_min": _dur(rep, "approval_delay_min", rp, {"dist": "lognormal", "median": 15, "p90": 60}),
        "hot_swap_min": _dur(rep, "hot_swap_min", rp, 5),
        "cold_swap_min": _dur(rep, "cold_swap_min", rp, {"dist": "lognormal", "median": 45, "p90": 90}),
        "verify_min": _dur(rep, "verify_min", rp, 5),
        "rma_lead_days": _dur(rep, "rma_lead_days", rp, {"dist": "lognormal", "median": 3, "p90": 5}),
        "check_interval_min": _get(rep, "check_interval_min", rp, float, 5.0, _pos),
        "check_detect_min": _dur(rep, "check_detect_min", rp, 0.5),
        # the repair run (repair.yml on a timer) plans every node that needs attention this often
        "run_interval_min": _get(rep, "run_interval_min", rp, float, 5.0,
                                 lambda v: None if 0 < v <= 7 * 24 * 60 else "minutes > 0 and at most a week (10080)"),
        # people who carry out hands-on steps at once (null: as many as needed)
        "technicians": _get(rep, "technicians", rp, int, None, lambda v: None if v >= 1 else "an integer >= 1"),
    }
    sc["health_config"] = _get(raw, "health_config", source, dict, {})
    sc["repair_config"] = _get(raw, "repair_config", source, dict, {})
    pol = raw.get("policies")
    if pol is not None and not isinstance(pol, list):
        raise SpecError(f"{source}.policies: expected a list of policy names or policy mappings")
    sc["policies"] = pol or ["reactive-manual", "reactive-auto", "passive-wait", "passive+auto-repair",
                             "passive+auto-repair+hot-spares", "together-approval"]
    for i, p in enumerate(sc["policies"]):  # wrong names fail now, also when --policy picks others
        resolve(p, f"{source}.policies[{i}]")
    sc["sweep"] = _get(raw, "sweep", source, dict, {})
    sc["estimates"] = _estimates(raw, source)
    sc["sources"] = sources.parse_section(raw.get("sources"), source)
    # every input with where it comes from (an estimate, the sources: section, a fault's own, the default's)
    sc["input_sources"] = sources.resolve(raw, sc["sources"], sc["estimates"])
    sc["raw"] = raw
    return sc


def _estimates(raw: dict, source: str) -> list:
    """The inputs that are estimates, each with its plausible range and what it rests on (``gpufleet-sim
    sensitivity`` varies each over its range). A fault is named by its name (``faults[straggler].visible``); the
    path is resolved, and each end of the range validated, when sensitivity runs: a scenario derived from this one
    with other faults (an override) stays valid."""
    items = raw.get("estimates")
    if items is None:
        return []
    if not isinstance(items, list):
        raise SpecError(f"{source}.estimates: expected a list of {{path, low, high, source}} mappings")
    out = []
    for i, e in enumerate(items):
        where = f"{source}.estimates[{i}]"
        if not isinstance(e, dict):
            raise SpecError(f"{where}: expected a mapping with path, low, high and source")
        _unknown(e, {"path", "low", "high", "source"}, where)
        path = _get(e, "path", where, str)
        for end in ("low", "high"):
            if e.get(end) is None:
                raise SpecError(f"{where}.{end}: required field is missing (the {end} end of the plausible range)")
        why = _get(e, "source", where, str, ..., lambda v: None if v.strip() else "a non-empty string")
        out.append({"name": path, "where": f"{where}.path", "low": e["low"], "high": e["high"], "source": why})
    return out


def resolve_names(raw: dict, path: str, where: str) -> str:
    """``faults[straggler].visible`` -> ``faults[20].visible``: a list of named mappings indexed by name."""
    def index(m: re.Match) -> str:
        items = raw.get(m.group(1))
        names = [x.get("name") for x in items] if isinstance(items, list) and all(isinstance(x, dict) for x in items) \
            else []
        if m.group(2) not in names:
            raise SpecError(f"{where}: no {m.group(1)} entry named {m.group(2)!r} (expected one of {names})")
        return f"{m.group(1)}[{names.index(m.group(2))}]"
    resolved = re.sub(r"\b(faults|jobs)\[([A-Za-z_][\w+-]*)\]", index, path)
    _split(resolved)  # a clear error for any other malformed path
    return resolved


# A passive check that drains a healthy node: the default rate is an estimate (0.5 per 1,000 node-days); the
# aggressive multi-signal detector of "From Detection to Recovery: Operational Analysis on LLM Pre-training with 504
# GPUs" (Lablup, SKT, Upstage et al.) raised about 0.84 a day on 63 nodes, some 13 per 1,000 node-days: sweep 0-13.
FALSE_POSITIVE_RATE = 0.5
FALSE_POSITIVE_KMSG = "NVRM: Xid (PCI:0000:18:00): 119, pid=48213, name=python, Timeout after 6s of waiting for RPC " \
                      "response from GPU0 GSP!"


def _false_positive(d: dict, path: str) -> dict:
    """The fault-like record of a passive check's false alarm: a transient GSP timeout that the rules judge unhealthy
    (so the agent drains for it), on a node that is fine; the first repair step and its verification clear it."""
    _unknown(d, {"rate_per_1000_node_days", "kmsg"}, path)
    rate = _get(d, "rate_per_1000_node_days", path, float, FALSE_POSITIVE_RATE, _nonneg)
    kmsg = _kmsg(d, "kmsg", path) or [FALSE_POSITIVE_KMSG]
    return {"name": "false_positive", "category": "false_positive", "hardware": False, "scope": "node",
            "effect": "crash", "kmsg": kmsg, "visible": 1.0, "fixed_by": "reset_gpu", "lemon": False,
            "precursor": None, "per_node_h": rate / 1000.0 / 24.0, "rate_per_1000_node_days": rate}


def load(path: str | Path) -> dict:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(f"{p}: scenario file not found")
    except UnicodeDecodeError as e:
        raise SpecError(f"{p}: not UTF-8 text (byte {e.start}: {e.reason})")
    try:
        # no hang on deep [[[[ nesting, no crash on too deep or too long input (a ValueError naming the file)
        raw = safeyaml.load(text, str(p))
    except ValueError as e:
        raise SpecError(str(e))
    return validate(raw, source=p.name)


def override(raw: dict, assignments: dict) -> dict:
    """Return a copy of a raw scenario with dotted-path assignments applied (jobs[0].nodes=128)."""
    out = copy.deepcopy(raw)
    for path, value in assignments.items():
        cur: Any = out
        parts = _split(path)
        for i, k in enumerate(parts):
            where = path if i == len(parts) - 1 else _join(parts[:i + 1])
            if isinstance(k, int):
                if not isinstance(cur, list):
                    raise SpecError(f"{where}: {_join(parts[:i]) or 'the scenario'} is not a list")
                if not -len(cur) <= k < len(cur):
                    raise SpecError(f"{where}: index out of range ({_join(parts[:i])} has {len(cur)} entries)")
            elif not isinstance(cur, dict):
                raise SpecError(f"{where}: {_join(parts[:i])} is not a mapping")
            if i == len(parts) - 1:
                cur[k] = value
            else:
                cur = cur[k] if isinstance(k, int) else cur.setdefault(k, {})
    return out


def _join(parts: list) -> str:
    out = ""
    for k in parts:
        out += f"[{k}]" if isinstance(k, int) else (f".{k}" if out else k)
    return out


def _split(path: str) -> list:
    parts: list = []
    for seg in path.split("."):
        while "[" in seg:
            head, rest = seg.split("[", 1)
            if head:
                parts.append(head)
            idx, sep, seg = rest.partition("]")
            if not sep or not idx.strip().lstrip("-").isdigit():
                raise SpecError(f"{path}: expected a dotted field with integer indexes, e.g. jobs[0].nodes")
            parts.append(int(idx))
        if seg:
            parts.append(seg)
    return parts
