"""Outputs of `gpufleet-sim run`: a terminal table, CSV, JSON, PNG plots (matplotlib Agg) and an HTML report."""

from __future__ import annotations

import csv
import html
import io
import json
import os
from pathlib import Path

from ansible_collections.gpufleet.reliability.plugins.module_utils.fileutil import atomic_write

from .dists import neg_ci
from .runner import CAUSES, best_policy

CAUSE_LABEL = {"lost_work": "work lost since checkpoint", "detection": "detection + finding the node",
               "restart": "restart", "waiting": "waiting for a node", "checkpoint": "checkpoint stalls",
               "straggler": "slow nodes (stragglers)"}


def _umask_mode() -> int:
    """The mode open() gives a new file (0666 less the umask), as for the PNGs matplotlib writes."""
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def _atomic_write(path: Path, data: bytes) -> None:
    atomic_write(path, data, _umask_mode(), makedirs=True)


def _fmt(ci: dict, digits: int = 1, pct: bool = False) -> str:
    m, (lo, hi) = ci["mean"], ci["ci95"]
    if _ONE_SEED[0]:  # one seed: no confidence interval to show
        return f"{m * 100:.1f} %" if pct else f"{m:,.{digits}f}"
    if pct:
        return f"{m * 100:.1f} % ±{(hi - lo) / 2 * 100:.1f}"
    return f"{m:,.{digits}f} ±{(hi - lo) / 2:,.{digits}f}"


_ONE_SEED = [False]


def table(res: dict) -> str:
    _ONE_SEED[0] = res["seeds"] < 2
    hdr = ["policy", "job action", "evicted ckpt/requeue/kept", "ETTR", "crashes", "drains", "lost GPU-h", "cost $",
           "node MTTR h", "swap-ins", "peak out", "P(no spare)", "retired"]
    rows = []
    for name, p in res["policies"].items():
        ev = "/".join(f"{p[k]['mean']:.1f}" if k in p else "-"
                      for k in ("evict_checkpoint", "evict_requeue", "evict_waited"))
        rows.append([name, p.get("knobs", {}).get("jobs", "?"), ev, _fmt(p["ettr"], pct=True), _fmt(p["crashes"]),
                     _fmt(p["proactive_drains"]), _fmt(p["lost_gpu_hours"], 0), _fmt(p["cost_usd"], 0),
                     _fmt(p["mttr_hours"]),
                     _fmt(p["spare_swap_ins"]), _fmt(p["peak_spare_demand"]), _fmt(p["pool_ran_empty"], 2),
                     _fmt(p["nodes_retired"])])
    w = [max(len(str(r[i])) for r in rows + [hdr]) for i in range(len(hdr))]

    def line(r):
        return "  ".join(str(c).ljust(w[i]) if i == 0 else str(c).rjust(w[i]) for i, c in enumerate(r))

    what = "mean ±95 % CI half-width" if res["seeds"] > 1 else "one seed, no confidence interval (use --seeds)"
    out = [f"{res['scenario']}: {res['gpus']:,} GPUs, {res['seeds']} seeds, {what}, "
           f"${res['price_per_gpu_hour']:g}/GPU-h", line(hdr), line(["-" * x for x in w])]
    out += [line(r) for r in rows]
    top = best_policy(res["policies"])
    best = (top, res["policies"][top])
    worst = min(res["policies"].items(), key=lambda kv: kv[1]["ettr"]["mean"])
    saved = worst[1]["lost_gpu_hours"]["mean"] - best[1]["lost_gpu_hours"]["mean"]
    tied = _tied(res["policies"], best[0])
    if len(res["policies"]) > 1:
        out.append(f"best: {best[0]}" + (f" (tied within the 95 % CI with {', '.join(tied)})" if tied else "") +
                   f" — saves {saved:,.0f} GPU-hours (${saved * res['price_per_gpu_hour']:,.0f}) against {worst[0]}")
    out.append("crashes: job interruptions by a fault; drains: nodes taken out at a checkpoint on a warning")
    out.append("job action: the repair policy's jobs.action each policy ran with (plan() decides the job's fate on "
               "a node it drained); evicted: mean plan() evictions with a checkpoint / requeued without one / "
               "jobs that kept the drained node")
    out.append(LEGEND_SPARES)
    out.append("cost $: lost GPU-hours x the GPU-hour price, plus the spare nodes' GPU-hours x spare_cost_per_gpu_hour")
    out.append("")
    out += [f"{name}: {text}" for name, text in explain(res)]
    if res.get("knob_effects"):
        out += [""] + effects_text(res["knob_effects"])
    if res.get("factorial"):
        out += [""] + factorial_text(res["factorial"])
    return "\n".join(out)


def _verdict(ci: dict, seeds: int) -> str:
    if seeds < 2:
        return "one seed: run more seeds to know"
    if ci["ci95"][0] > 0:
        return "a gain"
    if ci["ci95"][1] < 0:
        return "a loss"
    return f"not distinguishable from zero over these {seeds} seeds"


def effects_text(eff: dict) -> list:
    """The knob-effects section: each knob's own paired effect around the anchor policy, and what passive health
    checks themselves are worth (their sign may be negative: false-positive drains cost restarts)."""
    n = eff["seeds"]
    _ONE_SEED[0] = n < 2
    out = [f"Each knob's own effect, around {eff['anchor']} (that knob changed, every other knob held, the same "
           f"{n} seed(s)); the best-against-worst saving above is all knobs together:"]
    rows = [["knob", "this policy", "instead", "ETTR (this - instead)", "lost GPU-h (this - instead)"]]
    for e in eff["effects"]:
        rows.append([e["knob"], e["anchor_level"], e["other_level"], _pts(e["ettr"]),
                     _pts(e["lost_gpu_hours"], 1.0, "", 0)])
    w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out += [("  " + "  ".join(c.ljust(w[i]) for i, c in enumerate(r))).rstrip() for r in rows]
    det = [e for e in eff["effects"] if e["knob"] == "detection"]
    if det:
        e = det[0]
        # passive minus reactive, whichever the anchor has
        d_ettr, d_lost = ((e["ettr"], e["lost_gpu_hours"]) if e["anchor_level"] == "passive"
                          else (neg_ci(e["ettr"]), neg_ci(e["lost_gpu_hours"])))
        held = ", ".join(dict.fromkeys(f"{x['knob']} {x['anchor_level']}" for x in eff["effects"]
                                       if x["knob"] != "detection"))
        out.append(f"Passive health checks themselves (against reactive detection, with {held} as in "
                   f"{eff['anchor']}): ETTR {_pts(d_ettr)}, lost GPU-hours {_pts(d_lost, 1.0, '', 0)}: "
                   f"{_verdict(d_ettr, n)}.")
    return out


def factorial_text(fx: dict) -> list:
    """The full design's main effects: each knob's own effect averaged over every combination of the others."""
    n = fx["seeds"]
    _ONE_SEED[0] = n < 2
    out = [f"The full design ({fx['cells']} combinations of {', '.join(fx['knobs'])}; identify {fx['identify']}; "
           f"the same {n} seed(s)): each knob's main effect, a level against the knob's first, averaged over every "
           "combination of the other knobs:"]
    rows = [["knob", "level", "against", "ETTR (level - against)", "lost GPU-h (level - against)"]]
    for e in fx["effects"]:
        rows.append([e["knob"], e["level"], e["vs"], _pts(e["ettr"]), _pts(e["lost_gpu_hours"], 1.0, "", 0)])
    w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out += [("  " + "  ".join(c.ljust(w[i]) for i, c in enumerate(r))).rstrip() for r in rows]
    det = next((e for e in fx["effects"] if e["knob"] == "detection"), None)
    if det is not None:
        out.append(f"Passive health checks, averaged over every spares, repair and job-action setting: ETTR "
                   f"{_pts(det['ettr'])}, lost GPU-hours {_pts(det['lost_gpu_hours'], 1.0, '', 0)}: "
                   f"{_verdict(det['ettr'], n)}.")
    b = fx["best"]
    out.append("Best cell of the design: " + ", ".join(f"{k} {b[k]}" for k in fx["knobs"]) +
               f" (ETTR {b['ettr'] * 100:.1f} %).")
    return out


LEGEND_SPARES = ("swap-ins: times a spare node took a failed node's place in a job (one node can be swapped in many "
                 "times); peak out: most nodes out of service at once, the spare capacity that would have covered "
                 "every failure; P(no spare): share of seeds in which a job found the spare pool empty and waited")


def _pts(ci: dict, scale: float = 100.0, unit: str = " pts", digits: int = 1) -> str:
    m, (lo, hi) = ci["mean"] * scale, (ci["ci95"][0] * scale, ci["ci95"][1] * scale)
    if _ONE_SEED[0]:
        return f"{m:+,.{digits}f}{unit}"
    return f"{m:+,.{digits}f}{unit} (95 % CI {lo:+,.{digits}f} to {hi:+,.{digits}f})"


def explain(res: dict) -> list:
    """Each policy's result by cause, in words an operator reads: where its time goes, and, paired seed by seed,
    what it wins or loses against the best policy (the best against the runner-up) and through which causes."""
    from .runner import paired

    pol = res["policies"]
    _ONE_SEED[0] = res["seeds"] < 2
    ranked = sorted(pol, key=lambda n: -pol[n]["ettr"]["mean"])
    out = []
    for name, p in pol.items():
        gpu_h = sum(p["lost_gpu_hours_by_cause"][c]["mean"] for c in CAUSES)
        causes = sorted(CAUSES, key=lambda c: -p["lost_gpu_hours_by_cause"][c]["mean"])
        share = [(c, p["lost_gpu_hours_by_cause"][c]["mean"] / gpu_h) for c in causes[:3]
                 if gpu_h > 0 and p["lost_gpu_hours_by_cause"][c]["mean"] > 0]
        text = (f"trains {p['ettr']['mean'] * 100:.1f} % of the time over {p['wall_h']['mean']:,.0f} h; of the "
                "GPU-hours lost, " + (", ".join(f"{x * 100:.0f} % {CAUSE_LABEL[c]}" for c, x in share) or "none") + ".")
        other = (ranked[1] if name == ranked[0] else ranked[0]) if len(ranked) > 1 else None
        if len(ranked) > 1 and name in res.get("per_seed", {}):
            d = paired({other: res["per_seed"][other], name: res["per_seed"][name]})["policies"][name]
            win = d["ettr"]["mean"] >= 0
            sig = not _ONE_SEED[0] and (d["ettr"]["ci95"][0] > 0 or d["ettr"]["ci95"][1] < 0)
            # the causes that moved most in the direction of the result
            moved = sorted((c for c in CAUSES if (d[f"lost:{c}"]["mean"] < 0) == win and d[f"lost:{c}"]["mean"]),
                           key=lambda c: -abs(d[f"lost:{c}"]["mean"]))[:2]
            why = " and ".join(f"{CAUSE_LABEL[c]} ({d[f'lost:{c}']['mean']:+,.0f} GPU-h)" for c in moved)
            text += (f" Against {other}, seed by seed: ETTR {_pts(d['ettr'])}, "
                     f"cost {_pts(d['cost_usd'], 1.0, ' USD', 0)}"
                     f": it {'wins' if win else 'loses'}"
                     + ("" if sig else " (one seed: run more seeds to know)" if _ONE_SEED[0]
                        else " (not significant over these seeds: run more seeds)")
                     + (f", mostly through {why}." if why else "."))
        out.append((name, text))
    return out


def public_json(res: dict) -> dict:
    """The documented JSON: wall_s and policies.<name>.{ettr, interruptions, ...} as {mean, ci95}."""
    pols = {}
    for name, p in res["policies"].items():
        pols[name] = {k: p[k] for k in ("ettr", "interruptions", "crashes", "interruptions_by_class",
                                        "planned_interruptions_by_class", "lost_gpu_hours",
                                        "lost_gpu_hours_by_cause", "mttr_hours", "cost_usd", "lost_cost_usd",
                                        "spare_cost_usd", "spare_swap_ins", "peak_spare_demand", "pool_ran_empty",
                                        "nodes_retired", "proactive_drains", "repair_actions")}
        for k in ("evict_checkpoint", "evict_requeue", "evict_waited"):
            if k in p:
                pols[name][k] = p[k]
        pols[name]["label"] = p["label"]
        pols[name]["knobs"] = p["knobs"]
    out = {"scenario": res["scenario"], "gpus": res["gpus"], "seeds": res["seeds"],
           "price_per_gpu_hour": res["price_per_gpu_hour"], "wall_s": res["wall_s"], "policies": pols,
           "paired": res.get("paired", {})}
    if "knob_effects" in res:
        out["knob_effects"] = res["knob_effects"]
    if "factorial" in res:
        out["factorial"] = res["factorial"]
    if "sensitivity" in res:
        out["sensitivity"] = res["sensitivity"]
    if "input_sources" in res:
        out["input_sources"] = res["input_sources"]
    return out


def write_json(res: dict, target: str) -> None:
    data = json.dumps(public_json(res), indent=2, default=float)
    if target == "-":
        print(data)
    else:
        _atomic_write(Path(target), data.encode())


def write_csv(res: dict, out: Path) -> Path:
    buf = io.StringIO()
    w = csv.writer(buf)
    classes = sorted({c for p in res["policies"].values() for c in p["interruptions_by_class"]})
    w.writerow(["policy", "seed", "ettr", "interruptions", "lost_gpu_hours"] + [f"lost_{c}" for c in CAUSES] +
               ["mttr_hours", "cost_usd", "spare_cost_usd", "spare_swap_ins", "peak_spare_demand", "pool_ran_empty",
                "nodes_retired", "proactive_drains"] +
               [f"int_{c}" for c in classes])
    for name, rows in res["per_seed"].items():
        for r in rows:
            w.writerow([name, r["seed"], f"{r['ettr']:.5f}", r["interruptions"], f"{r['lost_gpu_hours']:.1f}"] +
                       [f"{r['lost_gpu_hours_by_cause'][c]:.1f}" for c in CAUSES] +
                       [f"{r['mttr_hours']:.2f}", f"{r['cost_usd']:.0f}", f"{r['spare_cost_usd']:.0f}",
                        r["spare_swap_ins"], r["peak_spare_demand"], r["pool_ran_empty"], r["nodes_retired"],
                        r["proactive_drains"]] + [r["interruptions_by_class"].get(c, 0) for c in classes])
    p = out / "results.csv"
    _atomic_write(p, buf.getvalue().encode())
    return p


def plots(res: dict, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(res["policies"])
    pol = res["policies"]
    labels = [pol[n]["label"] for n in names]
    short = [n.replace("+", "+\n") for n in names]
    files = []
    colors = ["#c0392b", "#e67e22", "#2980b9", "#27ae60", "#8e44ad", "#7f8c8d", "#16a085"]

    # 1. ETTR with CI
    fig, ax = plt.subplots(figsize=(9, 4.8))
    m = [pol[n]["ettr"]["mean"] * 100 for n in names]
    err = [(pol[n]["ettr"]["ci95"][1] - pol[n]["ettr"]["ci95"][0]) / 2 * 100 for n in names]
    bars = ax.bar(range(len(names)), m, yerr=err, capsize=6, color=colors[:len(names)])
    lo = max(0.0, min(m) - 10)
    for b, v in zip(bars, m):
        ax.text(b.get_x() + b.get_width() * 0.5, lo + 1.0, f"{v:.1f} %", ha="center", va="bottom", fontsize=11,
                color="white", fontweight="bold")
    ax.set_xticks(range(len(names)), short, fontsize=9)
    lo = max(0.0, min(m) - 10)
    ax.set_ylim(lo, 100)
    ax.set_ylabel(f"ETTR: useful training / wall time (%)\n(axis starts at {lo:.0f} %)")
    ax.set_title(f"{res['scenario']}: effective training time ratio per policy\n"
                 f"({res['gpus']:,} GPUs, mean of {res['seeds']} seeds, bars = 95 % CI; higher is better)")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    p = out / "ettr.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    files.append(p)

    # 2. lost GPU-hours by cause, stacked, with $ on a second axis
    fig, ax = plt.subplots(figsize=(9, 5))
    bottom = [0.0] * len(names)
    ccol = {"lost_work": "#c0392b", "detection": "#e67e22", "restart": "#f1c40f", "waiting": "#8e44ad",
            "checkpoint": "#3498db", "straggler": "#95a5a6"}
    for c in CAUSES:
        vals = [pol[n]["lost_gpu_hours_by_cause"][c]["mean"] / 1000 for n in names]
        if not any(vals):
            continue
        ax.bar(range(len(names)), vals, bottom=bottom, label=CAUSE_LABEL[c], color=ccol[c])
        bottom = [b + v for b, v in zip(bottom, vals)]
    price = res["price_per_gpu_hour"]
    for i, tot in enumerate(bottom):
        ax.text(i, tot * 1.01, f"{tot:,.1f}k GPU-h\n${tot * 1000 * price / 1e6:,.2f} M", ha="center",
                va="bottom", fontsize=9)
    ax.set_xticks(range(len(names)), short, fontsize=9)
    ax.set_ylabel("lost GPU-hours (thousands)")
    ax.set_ylim(0, max(bottom) * 1.25 if max(bottom) > 0 else 1)
    ax.set_title(f"Where the GPU-hours go, per policy (at ${price:g}/GPU-hour; lower is better)")
    ax.legend(fontsize=9, loc="upper right")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    p = out / "lost_gpu_hours.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    files.append(p)

    # 3. interruptions by class (top classes), grouped
    classes = sorted({c for n in names for c in pol[n]["interruptions_by_class"]},
                     key=lambda c: -max(pol[n]["interruptions_by_class"][c]["mean"] for n in names))[:8]
    fig, ax = plt.subplots(figsize=(10, 5))
    width = 0.8 / len(names)
    for i, n in enumerate(names):
        allv = [pol[n]["interruptions_by_class"][c]["mean"] for c in classes]
        plan = [pol[n]["planned_interruptions_by_class"][c]["mean"] for c in classes]
        crash = [a - b for a, b in zip(allv, plan)]
        xs = [k + i * width for k in range(len(classes))]
        ax.bar(xs, crash, width, label=labels[i], color=colors[i])
        ax.bar(xs, plan, width, bottom=crash, color="white", edgecolor=colors[i], hatch="///", linewidth=0.8)
    from matplotlib.patches import Patch

    handles, _l = ax.get_legend_handles_labels()
    handles.append(Patch(facecolor="white", edgecolor="#555", hatch="///",
                         label="hatched: drained at a checkpoint on a warning (no crash, no lost work)"))
    ax.set_xticks([k + 0.4 - width / 2 for k in range(len(classes))], [c.replace("_", " ") for c in classes],
                  rotation=20, ha="right", fontsize=9)
    top = max((pol[n]["interruptions_by_class"][c]["mean"] for n in names for c in classes), default=1.0)
    ax.set_ylim(0, top * 1.35 + 0.1)  # room for the legend above the tallest bar
    ax.set_ylabel("job interruptions per run (mean)")
    ax.set_title("Job interruptions by fault class: crashes (solid) and proactive drains (hatched)")
    ax.legend(handles=handles, fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    p = out / "interruptions_by_class.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    files.append(p)
    return files


def _tied(pol: dict, best: str) -> list:
    lo, hi = pol[best]["ettr"]["ci95"]
    return [n for n, p in pol.items() if n != best and p["ettr"]["ci95"][1] >= lo]


def _sensitivity_html(res: dict, tornado: Path | None) -> str:
    """The report's section on the scenario's estimates: the verdict (each flip, or that the answer holds), the
    tornado plot and the table of ``gpufleet-sim sensitivity``; empty without a sensitivity result."""
    sens = res.get("sensitivity")
    if not sens:
        return ""
    from .sensitivity import text, verdict

    e = html.escape
    names = ", ".join(e(str(x.get("path"))) for x in sens.get("inputs", ())) or "none"
    lines = "".join(f"<li>{e(ln)}</li>" for ln in verdict(sens))
    img = f'<figure><img src="{e(tornado.name)}" alt="tornado plot"></figure>' if tornado is not None else ""
    return (f"<h2>Does the answer survive the scenario's estimates?</h2>\n<p>This answer rests on estimates "
            f"({names}); each was run at the ends of its plausible range with the same policies and seeds.</p>\n"
            f"<ul>{lines}</ul>\n{img}\n<pre>{e(text(sens))}</pre>\n")


def _sources_html(res: dict) -> str:
    """The report's section on where each input comes from: the counts by kind, any input that says nowhere, and the
    table (folded)."""
    rows = res.get("input_sources")
    if not rows:
        return ""
    from .sources import describe, summary

    e = html.escape
    body = "".join(f"<tr><td><code>{e(r['path'])}</code></td><td>{e(str(r['kind'] or 'none'))}</td>"
                   f"<td>{e(describe(r['source']))}</td></tr>" for r in rows)
    return (f"<h2>Where the inputs come from</h2>\n<p>{e(summary(rows))}.</p>\n<details><summary>Every input and "
            f"its source</summary><table><tr><th>input</th><th>kind</th><th>source</th></tr>{body}</table>"
            "</details>\n")


def write_html(res: dict, out: Path, pngs: list[Path], table_text: str, tornado: Path | None = None) -> Path:
    _ONE_SEED[0] = res["seeds"] < 2
    pol = res["policies"]
    top = best_policy(pol)
    best = (top, pol[top])
    worst = min(pol.items(), key=lambda kv: kv[1]["ettr"]["mean"])
    price = res["price_per_gpu_hour"]
    saved = worst[1]["lost_gpu_hours"]["mean"] - best[1]["lost_gpu_hours"]["mean"]
    e = html.escape
    tied = _tied(pol, best[0])
    hidden = " hidden" if len(pol) < 2 else ""
    tie = (" Within the 95 % confidence interval it is tied with " + ", ".join(f"<b>{e(t)}</b>" for t in tied) +
           "; more seeds (<code>--seeds</code>) would separate them.") if tied else ""
    rows = []
    for name, p in pol.items():
        lost = p["lost_gpu_hours"]["mean"]
        top = max(CAUSES, key=lambda c: p["lost_gpu_hours_by_cause"][c]["mean"])
        rows.append(
            f"<tr{' class=best' if name == best[0] else ''}><td><b>{e(name)}</b><br><small>{e(p['label'])}</small></td>"
            f"<td>{_fmt(p['ettr'], pct=True)}</td><td>{_fmt(p['crashes'])}</td><td>{_fmt(p['proactive_drains'])}</td>"
            f"<td>{lost:,.0f}</td><td>${p['cost_usd']['mean']:,.0f}</td><td>{e(CAUSE_LABEL[top])}</td>"
            f"<td>{_fmt(p['mttr_hours'])}</td><td>{_fmt(p['spare_swap_ins'])}</td>"
            f"<td>{_fmt(p['peak_spare_demand'])}</td><td>{_fmt(p['pool_ran_empty'], 2)}</td></tr>")
    knobs = "".join(
        f"<tr><td>{e(n)}</td><td>{e(p['knobs']['detection'])}</td><td>{e(p['knobs']['repair'])}</td>"
        f"<td>{e(p['knobs']['spares'])}</td><td>{e(p['knobs']['identify'])}</td>"
        f"<td>{e(p['knobs'].get('jobs', '?'))}</td></tr>" for n, p in pol.items())
    imgs = "".join(f'<figure><img src="{e(p.name)}" alt="{e(p.stem)}"></figure>' for p in pngs)
    doc = f"""<!doctype html><html><head><meta charset="utf-8"><title>gpufleet-sim: {e(res['scenario'])}</title>
<style>body{{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;color:#222;line-height:1.45}}
table{{border-collapse:collapse;margin:1em 0}}td,th{{border:1px solid #ccc;padding:.35em .6em;text-align:right}}
td:first-child,th:first-child{{text-align:left}}th{{background:#f3f3f3}}tr.best{{background:#eafaf1}}
.key{{font-size:1.15em;background:#f7f9fc;border-left:4px solid #2980b9;padding:.6em 1em}}
img{{max-width:100%;border:1px solid #ddd}}figure{{margin:1em 0}}small{{color:#666}}
pre{{background:#f7f7f7;padding:.5em}}</style>
</head><body>
<h1>Which repair policy saves the most GPU-hours?</h1>
<p>Scenario <b>{e(res['scenario'])}</b>: {res['gpus']:,} GPUs, {res['seeds']} seeds per policy,
GPU-hour price ${price:g}. Every number is a mean over seeds; ± is the half-width of its 95 % confidence interval.</p>
<p class="key"{hidden}><b>{e(best[0])}</b> keeps the job training {best[1]['ettr']['mean'] * 100:.1f} % of the time and
saves <b>{saved:,.0f} GPU-hours (${saved * price:,.0f})</b> against <b>{e(worst[0])}</b>
({worst[1]['ettr']['mean'] * 100:.1f} %).{tie}</p>
<table><tr><th>policy</th><th>ETTR</th><th>job crashes</th><th>proactive drains</th><th>lost GPU-hours</th>
<th>cost (lost time + spares)</th><th>largest loss</th><th>node MTTR (h)</th><th>spare swap-ins</th>
<th>peak nodes out</th><th>P(no spare)</th></tr>{''.join(rows)}</table>
<p><small>ETTR = useful training time / wall time of the job. Lost GPU-hours = job GPUs x hours not spent on useful work
(work redone after a failure, detection and finding the bad node, restart, waiting for a replacement node, checkpoint
stalls, slow nodes). Job crashes = interruptions by a fault. Proactive drains = nodes the passive checks took out on a
warning (a precursor, or a slow GPU) at a checkpoint: the job restarts without losing work. Node MTTR = time from a
node's fault until it is back in service. {e(LEGEND_SPARES)}.</small></p>
<h2>Why each policy ends where it does</h2>
<ul>{"".join(f"<li><b>{e(n)}</b>: {e(t)}</li>" for n, t in explain(res))}</ul>
{imgs}
<h2>What the policies are</h2>
<table><tr><th>policy</th><th>detection</th><th>repair</th><th>spares</th><th>bad node found by</th>
<th>job action</th></tr>{knobs}</table>
<p><small>Which symptom is unhealthy and which repair step comes next are decided by the collection's own health rules
(<code>plugins/module_utils/health</code>) and repair policy (<code>plugins/module_utils/repair</code>); a policy only
sets who acts and how fast. Per-seed numbers: <a href="results.csv">results.csv</a>; all metrics:
<a href="results.json">results.json</a>.</small></p>
<pre>{e(table_text)}</pre>
{_sensitivity_html(res, tornado)}{_sources_html(res)}
<p><small>Run time {res['wall_s']:.1f} s.</small></p></body></html>"""
    p = out / "report.html"
    _atomic_write(p, doc.encode())
    return p


def write_all(res: dict, out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    t = table(res)
    csvp = write_csv(res, out)
    write_json(res, str(out / "results.json"))
    pngs = plots(res, out)
    files: dict = {}
    if res.get("sensitivity"):
        from .sensitivity import write_all as write_sensitivity

        files = write_sensitivity(res["sensitivity"], out)  # tornado.png, sensitivity.txt and .html beside
    htmlp = write_html(res, out, pngs, t, files.get("tornado"))
    return {"table": t, "csv": csvp, "pngs": pngs, "html": htmlp, "sensitivity": files}
