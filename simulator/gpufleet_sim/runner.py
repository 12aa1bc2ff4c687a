"""Run a scenario under one or more policies over several seeds; aggregate metrics with 95 % CIs."""

from __future__ import annotations

import time
from typing import Callable

from .dists import mean_ci
from .engine import Sim
from .policies import KNOBS, resolve

CAUSES = ("lost_work", "detection", "restart", "waiting", "checkpoint", "straggler")


def run_one(sc: dict, policy: dict, seed: int, brain=None, horizon_h: float | None = None) -> dict:
    """One seed of one policy: the per-seed metrics dict."""
    if brain is None:
        brain = _brain(sc, policy, {})
    sim = Sim(sc, policy, seed, brain, horizon_h=horizon_h)
    res = sim.run()
    jobs = res["jobs"]
    st = res["stats"]
    wall_gpu_h = sum(j["wall_h"] * j["gpus"] for j in jobs)
    work_gpu_h = sum(j["work_h"] * j["gpus"] for j in jobs)
    lost = {c: 0.0 for c in CAUSES}
    for j in jobs:
        lost["lost_work"] += j["lost_work_h"] * j["gpus"]
        for c in ("detection", "restart", "waiting", "checkpoint", "straggler"):
            lost[c] += j["buckets"][c] * j["gpus"]
    by_class: dict[str, int] = {}
    for j in jobs:
        for k, v in j["by_class"].items():
            by_class[k] = by_class.get(k, 0) + v
    planned: dict[str, int] = {}
    for j in jobs:
        for k, v in j["planned_by_class"].items():
            planned[k] = planned.get(k, 0) + v
    inter = sum(j["interruptions"] for j in jobs)
    lost_total = sum(lost.values())
    mttr = st["mttr"]
    job_wall = sum(j["wall_h"] for j in jobs)
    # spare capacity: the nodes kept beyond what the jobs need, paid for over the whole run
    spare_nodes = sc["cluster"]["nodes"] - sum(js["nodes"] for js in sc["jobs"])
    spare_gpu_h = spare_nodes * sc["cluster"]["gpus_per_node"] * max((j["wall_h"] for j in jobs), default=0.0)
    lost_cost = lost_total * sc["price_per_gpu_hour"]
    spare_cost = spare_gpu_h * sc["spare_cost_per_gpu_hour"]
    return {
        "seed": seed,
        "ettr": work_gpu_h / wall_gpu_h if wall_gpu_h else 0.0,
        "interruptions": inter,
        "interruptions_by_class": by_class,
        "planned_interruptions_by_class": planned,
        "crashes": inter - sum(planned.values()),
        "lost_gpu_hours": lost_total,
        "lost_gpu_hours_by_cause": lost,
        "mttr_hours": (sum(mttr) / len(mttr)) if mttr else 0.0,
        "spare_swap_ins": st["spares_used"],
        "peak_spare_demand": st["peak_out"],
        "pool_ran_empty": 1 if st["pool_empty"] else 0,
        "spare_nodes": spare_nodes,
        "spare_gpu_hours": spare_gpu_h,
        "nodes_retired": st["retired"],
        "proactive_drains": st["proactive_drains"],
        "evict_checkpoint": st["evict_checkpoint"],
        "evict_requeue": st["evict_requeue"],
        "evict_waited": st["evict_waited"],
        "repairs": st["repairs"],
        "repair_actions": dict(st["repair_actions"]),
        "lost_cost_usd": lost_cost,
        "spare_cost_usd": spare_cost,
        "cost_usd": lost_cost + spare_cost,
        "job_mttf_hours": (job_wall / inter) if inter else float("inf"),
        "wall_h": job_wall / max(1, len(jobs)),
        "useful_gpu_hours": work_gpu_h,
        "events": st["events"],
        "lemon_failures": st["lemon_faults"],
        "false_positives": st["false_positives"],
        "technician_wait_hours": st["technician_wait_h"],
    }


def aggregate(per_seed: list[dict], classes: list[str]) -> dict:
    out: dict = {}
    for k in ("ettr", "interruptions", "crashes", "lost_gpu_hours", "mttr_hours", "cost_usd", "lost_cost_usd",
              "spare_cost_usd", "spare_swap_ins", "peak_spare_demand", "pool_ran_empty", "nodes_retired",
              "proactive_drains", "job_mttf_hours", "wall_h", "repairs", "evict_checkpoint", "evict_requeue",
              "evict_waited"):
        out[k] = mean_ci([float(r[k]) for r in per_seed])
    out["interruptions_by_class"] = {c: mean_ci([float(r["interruptions_by_class"].get(c, 0)) for r in per_seed])
                                     for c in classes}
    out["planned_interruptions_by_class"] = {
        c: mean_ci([float(r["planned_interruptions_by_class"].get(c, 0)) for r in per_seed]) for c in classes}
    out["lost_gpu_hours_by_cause"] = {c: mean_ci([r["lost_gpu_hours_by_cause"][c] for r in per_seed])
                                      for c in CAUSES}
    acts: dict[str, list] = {}
    for r in per_seed:
        for a in r["repair_actions"]:
            acts.setdefault(a, [])
    out["repair_actions"] = {a: mean_ci([float(r["repair_actions"].get(a, 0)) for r in per_seed]) for a in acts}
    out["seeds"] = len(per_seed)
    return out


def best_policy(policies: dict) -> str:
    """The policy with the highest mean ETTR (the first of equals), of a result's ``policies``."""
    return max(policies, key=lambda n: policies[n]["ettr"]["mean"])


def _brain(sc: dict, policy: dict, cache: dict):
    """The shipped brain a policy runs with (its repair mode and job action), one per kind in ``cache``."""
    from .brain import default_brain

    mode = "approval" if policy["repair"] == "approval" else "automatic"
    key = (mode, policy.get("jobs"))
    if key not in cache:
        cache[key] = default_brain(sc, mode, jobs_action=policy.get("jobs"))
    return cache[key]


def run_scenario(sc: dict, policies: list | None = None, seeds: int | None = None, brain=None,
                 progress: Callable[[int, int], None] | None = None, seed0: int = 1) -> dict:
    """All policies x seeds. Returns the JSON-ready result (schema in docs/simulator.md)."""
    t0 = time.perf_counter()
    pols = [resolve(p, f"policies[{i}]") if not isinstance(p, dict) or "detection" not in p else p
            for i, p in enumerate(policies or sc["policies"])]
    n = seeds or sc["seeds"]
    brains: dict = {}
    classes = [f["name"] for f in sc["faults"]]
    fp = sc.get("false_positive")
    if fp and fp["per_node_h"] > 0 and any(p["detection"] == "passive" for p in pols):
        classes.append(fp["name"])
    out = {"scenario": sc["name"], "seeds": n, "price_per_gpu_hour": sc["price_per_gpu_hour"],
           "gpus": sc["cluster"]["nodes"] * sc["cluster"]["gpus_per_node"], "policies": {}, "per_seed": {}}
    total = len(pols) * n
    done = 0
    for p in pols:
        rows = []
        b = brain or _brain(sc, p, brains)
        for s in range(seed0, seed0 + n):
            rows.append(run_one(sc, p, s, b))
            done += 1
            if progress:
                progress(done, total)
        agg = aggregate(rows, classes)
        agg["label"] = p.get("label", p["name"])
        agg["knobs"] = {k: p[k] for k in ("detection", "repair", "spares", "identify")}
        agg["knobs"]["jobs"] = p.get("jobs") or getattr(b.repair_config, "job_action", "?")
        out["policies"][p["name"]] = agg
        out["per_seed"][p["name"]] = rows
    out["paired"] = paired(out["per_seed"])
    out["wall_s"] = time.perf_counter() - t0
    return out


PAIRED = ("ettr", "lost_gpu_hours", "cost_usd") + tuple(f"lost:{c}" for c in CAUSES)


def paired(per_seed: dict, baseline: str | None = None, keys: tuple = PAIRED) -> dict:
    """Each policy against the baseline (the first policy), seed by seed.

    Every policy meets the same faults at the same times for a given seed (common random numbers), so the
    difference of two policies is measured per seed and its confidence interval is that of the mean difference,
    much narrower than the overlap of two unpaired intervals would suggest.
    """
    names = list(per_seed)
    if not names:
        return {}
    base = baseline or names[0]

    def val(r, k):
        return r["lost_gpu_hours_by_cause"][k[5:]] if k.startswith("lost:") else r[k]

    out = {"baseline": base, "policies": {}}
    b = {r["seed"]: r for r in per_seed[base]}
    for name in names:
        if name == base:
            continue
        rows = [(r, b[r["seed"]]) for r in per_seed[name] if r["seed"] in b]
        out["policies"][name] = {k: mean_ci([float(val(r, k) - val(q, k)) for r, q in rows]) for k in keys}
    return out


#: The knobs whose own effect knob_effects() measures (identify stays as the anchor has it: it is how a person finds
#: a node without automation, not a product choice).
EFFECT_KNOBS = ("detection", "spares", "repair", "jobs")


def knob_effects(sc: dict, anchor: dict, anchor_rows: list, progress: Callable[[int, int], None] | None = None) -> dict:
    """Each knob's own effect around ``anchor`` (a resolved policy and its per-seed rows): the anchor against the same
    policy with that one knob at each other level, on the same seeds (common random numbers), every other knob held.
    So no knob is credited with another's gain. A positive ETTR difference: the anchor's level is the better one."""
    seeds = [r["seed"] for r in anchor_rows]
    variants = [(k, level) for k in EFFECT_KNOBS for level in KNOBS[k] if level != anchor[k]]
    brains: dict = {}
    out = {"anchor": anchor["name"], "seeds": len(seeds), "effects": []}
    for i, (k, level) in enumerate(variants):
        var = dict(anchor, name=f"{anchor['name']} with {k} {level}")
        var[k] = level
        b = _brain(sc, var, brains)
        rows = [run_one(sc, var, s, b) for s in seeds]
        d = paired({var["name"]: rows, anchor["name"]: anchor_rows}, keys=("ettr", "lost_gpu_hours", "cost_usd"))
        eff = d["policies"][anchor["name"]]  # anchor minus variant, seed by seed
        out["effects"].append({"knob": k, "anchor_level": anchor[k], "other_level": level, **eff})
        if progress:
            progress(i + 1, len(variants))
    return out


def factorial_effects(sc: dict, seeds: int, identify: str = "auto",
                      progress: Callable[[int, int], None] | None = None) -> dict:
    """The full design over EFFECT_KNOBS (2 x 3 x 3 x 3 = 54 cells; ``identify`` held): every cell on the same seeds,
    and each knob's main effect per level against the knob's first level: per seed, the mean over every combination
    of the other knobs of (level - first level), then the CI over seeds (common random numbers). So an effect is the
    knob's own, averaged over the rest of the design, never a named policy's total. Also the best cell by ETTR."""
    import itertools

    cells = list(itertools.product(*(KNOBS[k] for k in EFFECT_KNOBS)))
    brains: dict = {}
    runs: dict = {}
    total = len(cells) * seeds
    for i, levels in enumerate(cells):
        pol = dict(zip(EFFECT_KNOBS, levels), identify=identify, name=" ".join(levels))
        pol["label"] = pol["name"]
        b = _brain(sc, pol, brains)
        runs[levels] = [run_one(sc, pol, s, b) for s in range(1, seeds + 1)]
        if progress:
            progress((i + 1) * seeds, total)
    effects = []
    for ki, k in enumerate(EFFECT_KNOBS):
        ref = KNOBS[k][0]
        for level in KNOBS[k][1:]:
            eff = {}
            for metric in ("ettr", "lost_gpu_hours"):
                per_seed = []
                for s in range(seeds):
                    diffs = [runs[c][s][metric] - runs[c[:ki] + (ref,) + c[ki + 1:]][s][metric]
                             for c in cells if c[ki] == level]
                    per_seed.append(sum(diffs) / len(diffs))
                eff[metric] = mean_ci(per_seed)
            effects.append({"knob": k, "level": level, "vs": ref, **eff})
    mean_ettr = {c: sum(r["ettr"] for r in rows) / seeds for c, rows in runs.items()}
    best = max(mean_ettr, key=mean_ettr.get)
    return {"knobs": list(EFFECT_KNOBS), "cells": len(cells), "seeds": seeds, "identify": identify,
            "effects": effects, "best": dict(zip(EFFECT_KNOBS, best), ettr=mean_ettr[best])}
