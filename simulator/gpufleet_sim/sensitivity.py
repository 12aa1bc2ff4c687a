"""``gpufleet-sim sensitivity``: does the recommendation survive the scenario's own guesses?

The scenario's ``estimates:`` section names the inputs that are estimates, each with a plausible range and what the
range rests on. The recommended policy is the best one (by ETTR) as shipped. Each estimate is set to the low and
then the high end of its range, one at a time, every policy is run on the same seeds, and the recommended policy's
lead over its closest rival is measured seed by seed (common random numbers). The two estimates that move the lead
most are then varied together (the four corners). A point where another policy does better is a flip: the
recommendation does not hold there, and the input and value are named.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from . import scenario as scn
from .dists import SpecError, neg_ci
from .report import _atomic_write
from .runner import best_policy, paired, run_scenario


def _lead(res: dict, rec: str) -> dict:
    """The recommended policy against its closest rival at one point: ETTR difference (rec minus rival, paired by
    seed) with its CI, the rival, and the best policy there."""
    pol = res["policies"]
    best = best_policy(pol)
    rivals = [n for n in pol if n != rec]
    if not rivals:
        return {"best": best, "rival": None, "ettr": None}
    diffs = paired({rec: res["per_seed"][rec], **{n: res["per_seed"][n] for n in rivals}}, keys=("ettr",))
    # paired() gives each rival minus rec: the closest rival is the one with the largest difference
    rival = max(rivals, key=lambda n: diffs["policies"][n]["ettr"]["mean"])
    return {"best": best, "rival": rival, "ettr": neg_ci(diffs["policies"][rival]["ettr"])}


def run_sensitivity(sc: dict, policies: list, seeds: int,
                    progress: Callable[[int, int], None] | None = None, base: dict | None = None) -> dict:
    """``base``: the scenario as shipped already run with these policies and seeds (``gpufleet-sim run`` passes
    its own result: the runs are seeded, so it is the same result, not run twice)."""
    if not sc["estimates"]:
        raise SpecError(f"{sc['name']}: the scenario has no estimates: section (inputs with a plausible range)")
    ests = [dict(e, path=scn.resolve_names(sc["raw"], e["name"], e["where"])) for e in sc["estimates"]]
    points: list = [("as shipped", {})]
    points += [(f"{e['name']} = {end}", {e["path"]: e[end]}) for e in ests for end in ("low", "high")]
    checked = {}
    for label, assign in points:  # every single-estimate point is validated before anything runs
        checked[label] = scn.validate(scn.override(sc["raw"], assign), source=f"sensitivity: {label}")
    total = len(points) + (4 if len(ests) >= 2 else 0)  # the two that move the lead most, at four corners
    done = [0]

    def run(s2: dict) -> dict:
        res = run_scenario(s2, policies, seeds=seeds)
        done[0] += 1
        if progress:
            progress(done[0], total)
        return res

    if base is None:
        base = run(checked["as shipped"])
    else:
        done[0] += 1
    rec = best_policy(base["policies"])
    out: dict = {"scenario": sc["name"], "seeds": seeds, "recommended": rec, "as_shipped": _lead(base, rec),
                 "inputs": [], "together": [], "flips": []}
    for e in ests:
        row = {"path": e["name"], "source": e["source"], "low": e["low"], "high": e["high"]}
        for end in ("low", "high"):
            row[f"at_{end}"] = _lead(run(checked[f"{e['name']} = {end}"]), rec)
        ends = [row["at_low"]["ettr"], row["at_high"]["ettr"]]
        row["swing"] = abs(ends[1]["mean"] - ends[0]["mean"]) if all(ends) else 0.0
        out["inputs"].append(row)
    out["inputs"].sort(key=lambda r: -r["swing"])
    top = out["inputs"][:2]
    if len(top) == 2:
        by = {e["name"]: e for e in ests}
        for a_end in ("low", "high"):
            for b_end in ("low", "high"):
                a, b = by[top[0]["path"]], by[top[1]["path"]]
                s2 = scn.validate(scn.override(sc["raw"], {a["path"]: a[a_end], b["path"]: b[b_end]}),
                                  source=f"sensitivity: {a['name']} = {a_end}, {b['name']} = {b_end}")
                out["together"].append({"values": {a["name"]: a_end, b["name"]: b_end}, **_lead(run(s2), rec)})
    for row in out["inputs"]:
        for end in ("low", "high"):
            at = row[f"at_{end}"]
            if at["best"] != rec:
                out["flips"].append({"input": row["path"], "end": end, "value": row[end], "best": at["best"],
                                     "certain": bool(at["ettr"] and at["ettr"]["ci95"][1] < 0)})
    for t in out["together"]:
        if t["best"] != rec:
            out["flips"].append({"input": " and ".join(f"{k} = {v}" for k, v in t["values"].items()), "end": "both",
                                 "value": None, "best": t["best"],
                                 "certain": bool(t["ettr"] and t["ettr"]["ci95"][1] < 0)})
    return out


def spare_jobs(sc: dict, policy: str, counts: list, seeds: int) -> tuple[list, list]:
    """The spares search again with each estimate at each end of its range, for the cheapest policy only: the sweep
    points ``(raw, assign, policy, seeds, count)`` as ``gpufleet-sim spares`` runs them, and for each point the
    (estimate, end) it belongs to."""
    job_nodes = sum(j["nodes"] for j in sc["jobs"])
    jobs, where = [], []
    for e in sc["estimates"]:
        path = scn.resolve_names(sc["raw"], e["name"], e["where"])
        for end in ("low", "high"):
            raw = scn.override(sc["raw"], {path: e[end]})
            scn.validate(raw, source=f"spares: {e['name']} = {end}")
            for k in counts:
                jobs.append((raw, {"cluster.nodes": job_nodes + k}, policy, seeds, k))
                where.append((e, end))
    return jobs, where


def spare_flips(best_count: int, results: list, where: list) -> list:
    """Where the cheapest spare count is another one than ``best_count``: per (estimate, end), the count with the
    lowest mean total cost, and whether its lead over ``best_count`` is separated from zero (paired by seed)."""
    groups: dict = {}
    for res, (e, end) in zip(results, where):
        groups.setdefault((e["name"], end), (e, end, []))[2].append(res)
    flips = []
    for e, end, pts in groups.values():
        cheapest = min(pts, key=lambda r: r["cost_usd"]["mean"])
        if cheapest["value"] == best_count:
            continue
        ours = next((r for r in pts if r["value"] == best_count), None)
        certain = False
        if ours is not None:
            d = paired({"ours": ours["per_seed"], "there": cheapest["per_seed"]}, "ours", ("cost_usd",))
            certain = bool(d["policies"]["there"]["cost_usd"]["ci95"][1] < 0)
        flips.append({"input": e["name"], "end": end, "value": e[end], "spares": cheapest["value"],
                      "certain": certain})
    return flips


def spare_verdict(best_count: int, flips: list, policy: str) -> list:
    """The lines ``gpufleet-sim spares`` prints: a WARNING for each estimate whose range moves the cheapest spare
    count (the input, the value, the count there), or one line that the count holds."""
    out = []
    for f in flips:
        out.append(f"WARNING: the recommended spare count flips: {f['spares']} spare nodes cost less than "
                   f"{best_count} for {policy} at {f['input']} = {_short(f['value'])}, inside the plausible range"
                   + ("" if f["certain"] else " (within noise over these seeds)")
                   + ": the count depends on that estimate; find the site's own value.")
    if not flips:
        out.append(f"{best_count} spare nodes stay the cheapest for {policy} at both ends of every estimate's "
                   "plausible range (one at a time).")
    return out


def _pts(ci: dict | None) -> str:
    if not ci:
        return "-"
    return f"{ci['mean'] * 100:+.2f} pts ({ci['ci95'][0] * 100:+.2f} to {ci['ci95'][1] * 100:+.2f})"


def _short(v) -> str:
    """A value as a person writes it: a distribution by its parameters (uniform 5-60, lognormal median 15 p90 30)."""
    if isinstance(v, dict) and "dist" in v:
        if {"low", "high"} <= set(v):
            return f"{v['dist']} {v['low']:g}-{v['high']:g}"
        return " ".join([str(v["dist"])] + [f"{k} {x:g}" if isinstance(x, (int, float)) else f"{k} {x}"
                                            for k, x in v.items() if k != "dist"])
    text = f"{v:g}" if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)
    return text if len(text) <= 40 else text[:37] + "..."


def text(res: dict) -> str:
    rec, n = res["recommended"], res["seeds"]
    a = res["as_shipped"]
    out = [f"{res['scenario']}: recommended as shipped: {rec} (ahead of {a['rival']} by {_pts(a['ettr'])} ETTR, "
           f"paired over {n} seeds)",
           "Its lead over the closest rival with each estimate at the ends of its plausible range (largest swing "
           "first):"]
    rows = [["input", "end", "value", "lead of the recommended policy", "best there"]]
    for r in res["inputs"]:
        for end in ("low", "high"):
            at = r[f"at_{end}"]
            rows.append([r["path"], end, _short(r[end]), _pts(at["ettr"]), at["best"]])
    for t in res["together"]:
        rows.append([" + ".join(t["values"]), "/".join(t["values"].values()), "", _pts(t["ettr"]), t["best"]])
    w = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    out += [("  " + "  ".join(str(c).ljust(w[i]) for i, c in enumerate(r))).rstrip() for r in rows]
    out.append("What each range rests on:")
    out += [f"  {r['path']}: {r['source']}" for r in res["inputs"]]
    out += verdict(res)
    return "\n".join(out)


def verdict(res: dict) -> list:
    """The lines that say whether the recommendation holds: a WARNING for each flip (the input and the value), or
    one line that it holds. ``gpufleet-sim run`` prints these too."""
    rec = res["recommended"]
    out = []
    for f in res["flips"]:
        where = f"{f['input']} = {_short(f['value'])}" if f["end"] != "both" else f["input"]
        out.append(f"WARNING: the recommendation flips: {f['best']} does better than {rec} at {where}, inside the "
                   "plausible range" + ("" if f["certain"] else " (within noise over these seeds)")
                   + ": the answer depends on that estimate; find the site's own value.")
    if not res["flips"]:
        out.append(f"{rec} stays the best policy over every estimate's plausible range (one at a time, and the two "
                   "that move it most together).")
    return out


def tornado(res: dict, path) -> None:
    """The tornado plot: for each estimate (largest swing on top) a bar from the recommended policy's lead at the
    low end of its range to its lead at the high end, in ETTR points, with the lead as shipped and zero (where
    another policy takes over) marked. Written atomically as PNG."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in res["inputs"] if r["at_low"]["ettr"] and r["at_high"]["ettr"]][::-1]
    fig, ax = plt.subplots(figsize=(10, 1.8 + 0.6 * max(1, len(rows))))
    for y, r in enumerate(rows):
        lo, hi = r["at_low"]["ettr"]["mean"] * 100, r["at_high"]["ettr"]["mean"] * 100
        ax.barh(y, hi - lo, left=lo, height=0.5, color="#2980b9" if hi >= lo else "#e67e22")
        left, right = sorted([(lo, "low", r["low"]), (hi, "high", r["high"])], key=lambda t: t[0])
        ax.text(left[0], y, f"{left[1]} {_short(left[2])}  ", fontsize=8, ha="right", va="center")
        ax.text(right[0], y, f"  {right[1]} {_short(right[2])}", fontsize=8, ha="left", va="center")
    ax.axvline(0, color="#c0392b", lw=1.5, label="no lead (another policy does as well)")
    if res["as_shipped"]["ettr"]:
        ax.axvline(res["as_shipped"]["ettr"]["mean"] * 100, color="#7f8c8d", ls="--", label="lead as shipped")
    ax.set_yticks(range(len(rows)), [r["path"] for r in rows], fontsize=9)
    ax.set_xlabel(f"lead of {res['recommended']} over its closest rival (ETTR points, mean of {res['seeds']} seeds)")
    ax.set_title(f"{res['scenario']}: which estimate moves the answer (each at the ends of its plausible range)")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2)
    ax.margins(x=0.45)  # room for the end labels
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    _atomic_write(Path(path), buf.getvalue())


def write_all(res: dict, out) -> dict:
    """``--out DIR``: sensitivity.txt (the table), tornado.png and sensitivity.html (both, for a person); returns
    the paths written."""
    import html

    out = Path(out)
    body = text(res)
    files = {"text": out / "sensitivity.txt", "tornado": out / "tornado.png", "html": out / "sensitivity.html"}
    _atomic_write(files["text"], (body + "\n").encode())
    tornado(res, files["tornado"])
    doc = (f"<!doctype html><html><head><meta charset=utf-8><title>{html.escape(res['scenario'])}: sensitivity"
           f"</title></head><body><h1>{html.escape(res['scenario'])}: does the recommendation survive the "
           f"scenario's estimates?</h1><img src=tornado.png alt='tornado plot'><pre>{html.escape(body)}</pre>"
           "</body></html>\n")
    _atomic_write(files["html"], doc.encode())
    return files
