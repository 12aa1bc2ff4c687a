"""Where each input of a scenario comes from.

Every input of a scenario (a rate, a duration, a probability, a size, a price) says where it comes from, so that a
reader of the answer knows which parts are measured and which are guesses:

* a **paper** (a citation: the text, or ``{kind: paper, cite: ...}``);
* the **site**'s own records or configuration (``{kind: site, ...}``; ``gpufleet-sim calibrate`` writes these with
  their evidence: count, exposure, window);
* an **estimate**, with the plausible range it is believed to lie in (``{kind: estimate, low, high, why}``, or an
  entry of the scenario's ``estimates:`` section, which ``sensitivity`` then varies over that range).

A scenario says it in three places, the most specific first: its ``estimates:`` (one path each), its ``sources:``
section (paths with ``[*]`` for any fault, job or repair step; a path also covers everything under it), and a fault's
own ``source:`` (its rate). An input the scenario does not write takes the simulator's default, whose source is in
``DEFAULTS`` below. Whatever is left is *unsourced*: ``run`` names it, and the shipped scenarios have none (a test).
"""

from __future__ import annotations

import re
from typing import Any

from ansible_collections.gpufleet.reliability.plugins.module_utils import spec as checks

from .dists import SpecError

_FAIL = checks.raising(SpecError)

KINDS = ("paper", "site", "estimate", "base")

#: The inputs of a scenario: top-level and per-section fields (a fault's fields are the ones it writes, plus
#: FAULT_DEFAULTED; a repair step's are duration_min, success and then).
TOP = ("horizon_days", "price_per_gpu_hour", "spare_cost_per_gpu_hour")
CLUSTER = ("nodes", "gpus_per_node", "nodes_per_rack", "idle_nodes_fail")
JOB = ("nodes", "work_hours", "checkpoint_interval_min", "checkpoint_cost_min", "restart_min", "faults_while_down",
       "standbys")
FAULT_SKIP = ("name", "note", "source", "kmsg", "category", "hardware")  # labels and the captured log line
FAULT_DEFAULTED = ("job_detect_min",)
LEMONS = ("fraction", "multiplier", "cured_by", "cure_probability", "cure_probability_then")
REPAIR = ("human_response_min", "business_hours", "approval_delay_min", "hot_swap_min", "cold_swap_min",
          "verify_min", "rma_lead_days", "check_interval_min", "check_detect_min", "run_interval_min", "technicians")
ACTION = ("duration_min", "success")

#: The sources of the simulator's defaults (an input a scenario does not write).
DEFAULTS: dict[str, Any] = {
    "spare_cost_per_gpu_hour": {"kind": "estimate", "low": "0", "high": "price_per_gpu_hour",
                                "why": "an idle spare GPU-hour is paid for like a busy one (owned or rented)"},
    "cluster.gpus_per_node": {"kind": "site", "why": "the common 8-GPU server (HGX/DGX); a site sets its own"},
    "cluster.nodes_per_rack": {"kind": "site", "why": "16 nodes a rack; a site sets its own"},
    "cluster.idle_nodes_fail": {"kind": "estimate", "low": False, "high": True,
                                "why": "idle nodes fail at the same rate as busy ones"},
    "jobs[*].work_hours": {"kind": "site", "why": "none: the job runs for the whole horizon"},
    "jobs[*].checkpoint_interval_min": {"kind": "paper", "cite": "Young, 'A first order approximation to the "
                                        "optimum checkpoint interval' (CACM 1974): the interval rule"},
    "jobs[*].checkpoint_cost_min": {
        "kind": "estimate", "low": 0.2, "high": 10,
        "why": "a 1 min blocking save; asynchronous saves take seconds, a slow shared file system 10 min"},
    "jobs[*].restart_min": {"kind": "estimate", "low": 5, "high": 60,
                            "why": "lognormal median 10, p90 25 min: relaunch, NCCL init, checkpoint load"},
    "jobs[*].faults_while_down": {"kind": "site", "why": "nodes keep failing while the job is down"},
    "jobs[*].standbys": {"kind": "site", "why": "no warm standbys of the job's own"},
    "faults[*].job_detect_min": {"kind": "estimate", "low": 0.1, "high": 10,
                                 "why": "30 s: a crashed rank ends the job within a collective's timeout"},
    "lemons": {"kind": "estimate", "low": 0, "high": 0.05,
               "why": "no lemon nodes unless the scenario says so (Kokolis et al. found about 1.2-2 %)"},
    "repair.human_response_min": {"kind": "estimate", "low": 5, "high": 240,
                                  "why": "lognormal median 30, p90 120 min for an on-call person to act"},
    "repair.business_hours": {"kind": "site", "why": "hands-on work 9-17 on weekdays"},
    "repair.approval_delay_min": {"kind": "estimate", "low": 1, "high": 240,
                                  "why": "lognormal median 15, p90 60 min for an approval"},
    "repair.hot_swap_min": {"kind": "estimate", "low": 1, "high": 15, "why": "5 min to swap a ready spare in"},
    "repair.cold_swap_min": {"kind": "estimate", "low": 15, "high": 240,
                             "why": "lognormal median 45, p90 90 min to bring an idle node into the job"},
    "repair.verify_min": {"kind": "estimate", "low": 1, "high": 30, "why": "5 min of health checks after a step"},
    "repair.rma_lead_days": {"kind": "estimate", "low": 1, "high": 14,
                             "why": "lognormal median 3, p90 5 days for a replacement part"},
    "repair.check_interval_min": {"kind": "site", "why": "the agent's timer: every 5 min (the role's default)"},
    "repair.check_detect_min": {"kind": "estimate", "low": 0.1, "high": 5, "why": "30 s for a check to run"},
    "repair.run_interval_min": {"kind": "site", "why": "the repair run's timer: every 5 min (the role's default)"},
    "repair.technicians": {"kind": "site", "why": "as many people as the hands-on steps need"},
    "repair.actions[*]": {"kind": "estimate", "low": "half", "high": "twice",
                          "why": "each repair step's duration and success chance (docs/simulator.md, repair steps)"},
    "false_positives.rate_per_1000_node_days": {
        "kind": "estimate", "low": 0, "high": 13,
        "why": "0.5 per 1,000 node-days; 13 is the aggressive detector of 'From Detection to Recovery' (504 GPUs)"},
}


def check_source(v: Any, path: str, pattern_entry: bool = False) -> dict:
    """A source as a mapping with its kind; SpecError naming ``path`` when it is none of the accepted forms."""
    if isinstance(v, str):
        if not v.strip():
            raise SpecError(f"{path}: expected a citation (text) or a mapping with kind, got an empty string")
        return {"kind": "estimate" if v.strip().lower().startswith("estimate") else "paper", "cite": v}
    if not isinstance(v, dict) or v.get("kind") not in KINDS:
        raise SpecError(f"{path}: expected a citation (text) or a mapping with kind: one of {', '.join(KINDS)}, "
                        f"got {v!r}"[:300])
    if v["kind"] == "paper" and not str(v.get("cite") or "").strip():
        raise SpecError(f"{path}.cite: a paper source names the paper and the table or section it comes from")
    if v["kind"] == "estimate" and pattern_entry and (v.get("low") is None or v.get("high") is None):
        raise SpecError(f"{path}: an estimate says its plausible range (low and high), and why")
    return v


def parse_section(raw: Any, source: str) -> list:
    """The scenario's ``sources:`` section: a list of ``{paths: [...], source: ...}``."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise SpecError(f"{source}.sources: expected a list of {{paths, source}} mappings")
    out = []
    for i, e in enumerate(raw):
        where = f"{source}.sources[{i}]"
        checks.mapping(e, where, ("paths", "source"), fail=_FAIL, none_ok=False)
        if "paths" not in e or "source" not in e:
            raise SpecError(f"{where}: expected a mapping with paths (a list of input paths) and source")
        paths = e["paths"]
        if isinstance(paths, str):
            paths = [paths]
        if not isinstance(paths, list) or not paths or not all(isinstance(p, str) and p.strip() for p in paths):
            raise SpecError(f"{where}.paths: expected a list of input paths, e.g. faults[*].rate_per_1000_node_days")
        src = check_source(e["source"], f"{where}.source", pattern_entry=True)
        out.append({"paths": [_pattern(p, f"{where}.paths") for p in paths], "source": src})
    return out


def _pattern(path: str, where: str) -> tuple:
    parts = []
    for seg in path.strip().split("."):
        m = re.fullmatch(r"([A-Za-z_]\w*)((?:\[[^\]]+\])*)", seg)
        if not m:
            raise SpecError(f"{where}: {path!r} is not an input path (fields joined by dots, [*] or [name] for an "
                            "entry of a list)")
        parts.append(m.group(1))
        parts += re.findall(r"\[([^\]]+)\]", m.group(2))
    return tuple(parts)


def inputs(raw: dict) -> list:
    """Every input of a validated scenario's raw mapping: (path parts with names for list entries, written?)."""
    out: list = [((k,), k in raw) for k in TOP if k != "horizon_days" or raw.get("horizon_days")]
    c = raw.get("cluster") or {}
    out += [(("cluster", k), k in c) for k in CLUSTER]
    for i, j in enumerate(raw.get("jobs") or []):
        name = str(j.get("name", f"job{i}"))
        out += [(("jobs", name, k), k in j) for k in JOB if k != "work_hours" or k in j]
    for f in raw.get("faults") or []:
        name = str(f.get("name"))
        keys = [k for k in f if k not in FAULT_SKIP] + [k for k in FAULT_DEFAULTED if k not in f]
        out += [(("faults", name, k), k in f) for k in keys]
    fp = raw.get("false_positives") or {}
    out.append((("false_positives", "rate_per_1000_node_days"), "rate_per_1000_node_days" in fp))
    lem = raw.get("lemons") or {}
    out += [(("lemons", k), k in lem) for k in LEMONS]
    rep = raw.get("repair") or {}
    out += [(("repair", k), k in rep) for k in REPAIR]
    for a, spec in sorted((rep.get("actions") or {}).items()):
        out += [(("repair", "actions", a, k), k in (spec or {})) for k in (*ACTION, "then") if k in (spec or {})]
    return out


def _matches(pattern: tuple, parts: tuple) -> bool:
    """A pattern covers a path when it is a prefix of it, segment by segment ('*' is any one segment; a list entry is
    named by its name or its index)."""
    if len(pattern) > len(parts):
        return False
    return all(p == "*" or p == q for p, q in zip(pattern, parts))


def _by_head(pairs: list) -> dict:
    """(pattern, source) pairs in order, grouped by the input section they can match (a pattern starting with
    ``*`` goes in every group and under ``*``): a path is compared with its own section's patterns only."""
    heads = {pat[0] for pat, _src in pairs}
    groups = {h: [ps for ps in pairs if ps[0][0] in (h, "*")] for h in heads if h != "*"}
    groups["*"] = [ps for ps in pairs if ps[0][0] == "*"]
    return groups


def _first(groups: dict, names: list) -> Any:
    """The source of the first pattern (in its group's order) that covers one of the path's names, or None."""
    for pat, src in groups.get(names[0][0], groups["*"]):
        if any(_matches(pat, n) for n in names):
            return src
    return None


#: DEFAULTS' paths, parsed once
_DEFAULT_PATTERNS = _by_head([(_pattern(key, "DEFAULTS"), src) for key, src in DEFAULTS.items()])


def _indexes(raw: dict) -> dict:
    """{"faults": {name: "index"}, "jobs": {...}}: a list entry named by its name or by its index."""
    out = {}
    for kind in ("faults", "jobs"):
        entries = raw.get(kind) or []
        out[kind] = {str(x.get("name", f"job{i}" if kind == "jobs" else "")): str(i) for i, x in enumerate(entries)}
    return out


def _named(parts: tuple, indexes: dict) -> list:
    """The path's names for matching: entries of faults/jobs by name and by index."""
    out = [parts]
    if len(parts) >= 2 and parts[0] in indexes and parts[1] in indexes[parts[0]]:
        out.append((parts[0], indexes[parts[0]][parts[1]], *parts[2:]))
    return out


def show(parts: tuple) -> str:
    """("faults", "straggler", "visible") -> faults[straggler].visible."""
    if parts[0] in ("faults", "jobs") and len(parts) > 1:
        return f"{parts[0]}[{parts[1]}]" + "".join(f".{p}" for p in parts[2:])
    return ".".join(parts)


def resolve(raw: dict, section: list, estimates: list) -> list:
    """Each input with its source: ``{path, kind, source, how}``; ``how`` says which statement gave it (estimate,
    sources, fault, default) or ``unsourced``."""
    est = {}
    for e in estimates:
        est[_pattern(e["name"], e["where"])] = e
    rows = []
    faults = {str(f.get("name")): f for f in raw.get("faults") or []}
    indexes = _indexes(raw)
    # the section's paths, most specific first (longer, then named over [*]; ties keep the scenario's order)
    ranked = _by_head(sorted(((pat, entry["source"]) for entry in section for pat in entry["paths"]),
                             key=lambda ps: (-len(ps[0]), ps[0].count("*"))))
    for parts, written in inputs(raw):
        names = _named(parts, indexes)
        row = None
        for n in names:
            if n in est:
                e = est[n]
                row = {"kind": "estimate", "source": {"kind": "estimate", "low": e["low"], "high": e["high"],
                                                      "why": e["source"]}, "how": "estimates"}
        if row is None and parts[0] == "faults" and parts[2] in ("rate_per_1000_node_days", "rate_per_gpu_year",
                                                                 "job_mtbf_h", "weibull_shape"):
            own = faults.get(parts[1], {}).get("source")
            if own is not None and not (isinstance(own, dict) and own.get("kind") == "base"):
                src = check_source(own, f"faults[{parts[1]}].source")
                row = {"kind": src["kind"], "source": src, "how": "fault"}
        if row is None:
            src = _first(ranked, names)
            if src is not None:
                row = {"kind": src["kind"], "source": src, "how": "sources"}
        if row is None and not written:
            src = _first(_DEFAULT_PATTERNS, names)
            if src is not None:
                row = {"kind": src["kind"], "source": src, "how": "default"}
        rows.append({"path": show(parts), **(row or {"kind": None, "source": None, "how": "unsourced"})})
    return rows


def summary(rows: list) -> str:
    """One line: how many inputs of each kind, and the unsourced ones by name."""
    counts = {k: sum(1 for r in rows if r["kind"] == k) for k in ("paper", "site", "estimate")}
    line = (f"Inputs: {len(rows)}; {counts['paper']} from papers, {counts['site']} the site's own, "
            f"{counts['estimate']} estimates with a plausible range")
    missing = [r["path"] for r in rows if r["how"] == "unsourced"]
    if missing:
        line += (f"; {len(missing)} say nowhere where they come from: " + ", ".join(missing[:8])
                 + (" ..." if len(missing) > 8 else "") + " (give each a source: docs/simulator.md, 'Sources')")
    return line


def describe(src: dict | None) -> str:
    """A source as one line of text: the citation, the site's note, or the estimate's range and why."""
    if not src:
        return "nowhere"
    kind = src.get("kind")
    if kind == "estimate":
        rng = f"{_brief(src['low'])} to {_brief(src['high'])}" if "low" in src and "high" in src else "no range"
        return f"estimate, plausible {rng}: {src.get('why') or src.get('cite') or ''}".rstrip(": ")
    if kind == "paper":
        return str(src.get("cite") or "")
    if kind == "site":
        ev = [f"{k} {src[k]}" for k in ("count", "exposure_node_days") if k in src]
        return "the site's own" + (f" ({', '.join(ev)})" if ev else "") + (f": {src['why']}" if src.get("why") else "")
    return str(src.get("note") or kind)


def _brief(v: Any) -> str:
    if isinstance(v, dict) and "dist" in v:
        return " ".join(f"{k} {x}" for k, x in v.items())
    return str(v)
