"""The published cases: expected value, measured value, tolerance, pass/fail.

V1 Daly (2006) complete wall-time model and optimal interval; V3 Llama 3 Table 5; V4 Kokolis et al. RSC-1 scaling,
and two held-out predictions from the same paper (the ETTR of a 12,000-GPU job, which no input was set from);
V6 AIReSim's default case. Sources: Daly, "A higher order estimate of the optimum checkpoint interval for restart
dumps" (FGCS 2006); the Llama 3 paper ("The Llama 3 Herd of Models", 2024, Table 5); Kokolis et al., "Revisiting
Reliability in Large-Scale Machine Learning Research Clusters" (2024); AIReSim's own report. Derivations are in the
headers of the scenario files and in docs/simulator.md.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

from . import scenario as scn
from .dists import mean_ci
from .engine import daly, daly_wall, young
from .policies import resolve
from .runner import run_one

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"


def _load(name: str) -> dict:
    return scn.load(SCENARIOS / name)


#: What a case can show about the simulator (issue "validation says what it is"):
#: predicts - the figure is not an input and no input was set from it: a wrong engine fails the case;
#: calibrates - inputs were fitted to this very figure: passing shows the fit holds, not that the model predicts;
#: restates - the figure is arithmetic on inputs set from the same source (a rate times an exposure): passing shows
#: the fault sampling and the counting work, nothing about the policies.
ROLES = ("predicts", "calibrates", "restates")


def _case(name, expected, measured, tol, kind, unit="", note="", role="predicts", why=""):
    if role not in ROLES:
        raise ValueError(f"role: expected one of {', '.join(ROLES)}, got {role!r}")
    if kind == "rel":
        ok = abs(measured - expected) <= tol * abs(expected)
        tol_s = f"±{tol * 100:g} %"
    elif kind == "abs":
        ok = abs(measured - expected) <= tol
        tol_s = f"±{tol:g}{unit}"
    elif kind == "min":
        ok = measured >= expected
        tol_s = "at least"
    else:  # grid steps (log ratio)
        ok = abs(math.log(measured / expected)) <= math.log(tol) + 1e-9
        tol_s = f"one grid step (x{tol:g})"
    return {"case": name, "expected": expected, "measured": measured, "tolerance": tol_s, "pass": bool(ok),
            "unit": unit, "note": note, "role": role, "why": why}


DALY_ETTR = {24.0: 0.9126, 6.0: 0.8194, 0.25: 0.1997}  # Daly's complete model, T_s 500 h, delta 5 min, R 10 min
DALY_TAU = {24.0: 117.0, 6.0: 57.0, 0.25: 9.1}  # Daly's optimal interval (min)
DALY_WHY = ("the engine (failures striking work, checkpoints and restarts; rollback to the last checkpoint) against "
            "Daly's closed form, under the closed form's own assumptions (exponential failures, one job)")


def _daly() -> tuple:
    """The Daly scenario, its policy and its constants (delta, R, T_s in hours)."""
    return _load("daly.yaml"), resolve("reactive-auto"), 5 / 60, 10 / 60, 500.0


def _daly_label(m: float) -> str:
    return f"{m:g} h" if m >= 1 else f"{m * 60:g} min"


def daly_ettr_case(m: float, seeds: int) -> dict:
    """Daly's ETTR at job MTBF ``m`` hours: the mean over seeds 1..seeds against the closed form (1 % rel.)."""
    base, pol, delta, r, ts = _daly()
    sc = scn.validate(scn.override(base["raw"], {"faults[0].job_mtbf_h": m}))
    vals = [run_one(sc, pol, s)["ettr"] for s in range(1, seeds + 1)]
    return _case(f"Daly ETTR, M = {_daly_label(m)}", DALY_ETTR[m], sum(vals) / seeds, 0.01, "rel",
                 note=f"{seeds} seeds; closed form {ts / daly_wall(ts, daly(delta, m), delta, r, m):.4f}",
                 why=DALY_WHY)


def daly_interval_case(m: float, sweep_seeds: int) -> dict:
    """Daly's optimal interval at job MTBF ``m`` hours, found by sweep: a grid of intervals x1.25 around Young's,
    common seeds 1..sweep_seeds across the grid points; passes within one grid step."""
    base, pol, delta, _r, _ts = _daly()
    raw = scn.override(base["raw"], {"faults[0].job_mtbf_h": m})
    y = young(delta, m)
    grid = [y * 1.25 ** k for k in range(-5, 4)]
    best, best_w = None, math.inf
    for tau in grid:
        sc2 = scn.validate(scn.override(raw, {"jobs[0].checkpoint_interval_min": tau * 60}))
        w = sum(run_one(sc2, pol, s)["wall_h"] for s in range(1, sweep_seeds + 1)) / sweep_seeds
        if w < best_w:
            best, best_w = tau, w
    blind = abs(math.log(y / daly(delta, m))) <= math.log(1.25)
    return _case(f"Daly optimal interval, M = {_daly_label(m)}", DALY_TAU[m], best * 60, 1.25, "grid", " min",
                 note=f"grid x1.25 around Young's {y * 60:.1f} min, {sweep_seeds} seeds per point"
                 + ("; Young's interval is within one step here, so this case cannot tell Daly from Young"
                    if blind else ""), why=DALY_WHY)


def daly_cases(seeds: int = 40, sweep_seeds: int = 16, fast: bool = False) -> list[dict]:
    base, pol, delta, r, ts = _daly()
    out = []
    for m in (24.0, 6.0, 0.25):
        # at M = 15 min a run has ~10,000 failures (~20 at 24 h): fewer seeds resolve it, and more would cost minutes
        out.append(daly_ettr_case(m, seeds if m > 1 else max(20, seeds // 10)))
        out.append(daly_interval_case(m, sweep_seeds if m > 1 else max(3, sweep_seeds // 12)))
    out.append(daly_vs_young(base, pol, delta, r, ts, seeds=max(20, seeds // 20)))
    return out


def daly_vs_young(base: dict, pol: dict, delta: float, r: float, ts: float, m: float = 0.25,
                  seeds: int = 20) -> dict:
    """Daly's interval against Young's where they differ (M = 15 min: 9.1 against 12.2 min), paired by seed.

    At M = 24 h the two intervals give wall times 0.003 % apart, which no simulation resolves; at 15 min Daly's
    closed form predicts Young's interval costs 2.77 % more wall time. Each seed runs both intervals on the same
    fault stream (common random numbers), and the case passes when the paired difference's 95 % CI excludes zero and
    its mean is within 1 point of the closed form.
    """
    raw = scn.override(base["raw"], {"faults[0].job_mtbf_h": m})
    ty, td = young(delta, m), daly(delta, m)
    expected = (daly_wall(ts, ty, delta, r, m) / daly_wall(ts, td, delta, r, m) - 1.0) * 100.0
    diffs = []
    for s in range(1, seeds + 1):
        w = [run_one(scn.validate(scn.override(raw, {"jobs[0].checkpoint_interval_min": tau * 60})), pol, s)["wall_h"]
             for tau in (ty, td)]
        diffs.append((w[0] / w[1] - 1.0) * 100.0)
    ci = mean_ci(diffs)
    case = _case("Daly beats Young, M = 15 min (extra wall time at Young's interval)", round(expected, 2),
                 ci["mean"], 1.0, "abs", " %",
                 note=f"{seeds} paired seeds, 95 % CI [{ci['ci95'][0]:.2f}, {ci['ci95'][1]:.2f}] %; "
                      f"Young {ty * 60:.1f} min, Daly {td * 60:.1f} min", why=DALY_WHY)
    case["pass"] = bool(case["pass"] and ci["ci95"][0] > 0)
    return case


def llama_cases(seeds: int = 30) -> list[dict]:
    sc = _load("llama3-405b-54d.yaml")
    pol = resolve("passive+auto-repair+hot-spares")
    cat = {f["name"]: f for f in sc["faults"]}
    tot = gpu = hw = 0
    ettr = []
    for s in range(1, seeds + 1):
        r = run_one(sc, pol, s)
        ettr.append(r["ettr"])
        for k, v in r["interruptions_by_class"].items():
            tot += v
            gpu += v if cat[k]["category"] == "gpu" else 0
            hw += v if cat[k]["hardware"] else 0
    return [
        _case("Llama 3 unexpected interruptions (54 d, 16,384 GPUs)", 419, tot / seeds, 0.02, "rel",
              note=f"mean of {seeds} seeds", role="restates", why="Table 5's counts are the scenario's rates"),
        _case("Llama 3 GPU share by counts", 64.0, 100.0 * gpu / tot, 5.0, "abs", " pts", role="restates",
              why="each class's category is an input from Table 5"),
        _case("Llama 3 hardware share by counts", 77.0, 100.0 * hw / tot, 5.0, "abs", " pts", role="restates",
              why="each class's hardware flag is an input from Table 5"),
        _case("Llama 3 effective training time (passive checks, auto-repair, hot spares)", 0.90,
              mean_ci(ettr)["ci95"][0], 0, "min",
              note=f"lower end of the 95 % CI over {seeds} seeds; mean {sum(ettr) / seeds:.4f}",
              role="calibrates",
              why="detection of silent corruption, the hot-spare swap time and the spare type were set after the "
                  "model gave 80.3 %"),
    ]


def rsc_cases(failures: int = 2000, seeds: int = 1) -> list[dict]:
    """Each size runs long enough for about `failures` job failures in all (Poisson error ~1/sqrt(failures))."""
    base = _load("rsc1-scaling.yaml")
    pol = resolve("passive+auto-repair+hot-spares")
    horizon_days = {n: failures / seeds / (n * 6.5 / 1000.0) for n in (512, 2048, 16384)}
    out = []
    for i, (nodes, exp) in enumerate(((512, 7.2), (2048, 1.80), (16384, 0.23))):
        raw = scn.override(base["raw"], {"jobs[0].nodes": nodes, "cluster.nodes": nodes + nodes // 8,
                                         "horizon_days": horizon_days[nodes]})
        sc = scn.validate(raw)
        # distinct seeds per size: the fault streams of the three sizes must not be the same draws
        rows = [run_one(sc, pol, 100 * i + s) for s in range(1, seeds + 1)]
        mttf = sum(r["wall_h"] for r in rows) / max(1, sum(r["interruptions"] for r in rows))
        out.append(_case(f"RSC-1 job MTTF at {nodes * 8:,} GPUs", exp, mttf, 0.05, "rel", " h",
                         note=f"{sum(r['interruptions'] for r in rows)} failures over {seeds} seeds",
                         role="restates", why="1 / (nodes x the RSC-1 rate, an input from the same paper)"))
    return out


#: Kokolis et al. (arXiv 2410.21680, section on ETTR): at about 12,000 GPUs on RSC-1 (r_f 6.50 failures per 1,000
#: node-days, 5 min restart, 5 min blocking checkpoint write, Young's interval) a job is well below 0.90 ETTR; it
#: reaches about 0.90 only if r_f falls to about 1 per 1,000 node-days, or the checkpoint write to about 10 s.
KOKOLIS_NODES = 1500  # 12,000 GPUs
KOKOLIS_CASES = (("r_f 1 per 1,000 node-days, 5 min checkpoint", 1.0, 5.0),
                 ("r_f 6.50, 10 s checkpoint", 6.5, 10.0 / 60.0))
KOKOLIS_WHY = ("no input was set from this figure: the fault rate is RSC-1's r_f or the paper's lowered one, the "
               "restart and checkpoint write times are the paper's stated assumptions, the interval is Young's; the "
               "engine adds what the paper's closed form leaves out (detection, the hot-spare swap, rollback drawn "
               "per failure), and the paper's own figure comes from that closed form (within about 5 % of its Monte "
               "Carlo), so a tolerance of 0.02 is the case's resolution")


def kokolis_cases(failures: int = 400, seeds: int = 4) -> list[dict]:
    """Held-out predictions: the ETTR of a 12,000-GPU job under the two changes Kokolis et al. name as reaching
    0.90. Each runs long enough for about ``failures`` job failures per seed."""
    base = _load("rsc1-scaling.yaml")
    pol = resolve("passive+auto-repair+hot-spares")
    restart = 5.0
    out = []
    for i, (label, rate, write) in enumerate(KOKOLIS_CASES):
        per_min = KOKOLIS_NODES * rate / 1000.0 / 1440.0
        interval = math.sqrt(2.0 * write / per_min)  # Young's, as the paper uses
        closed = (1.0 - per_min * (restart + interval / 2.0)) / (1.0 + write / interval)
        raw = scn.override(base["raw"], {
            "jobs[0].nodes": KOKOLIS_NODES, "cluster.nodes": KOKOLIS_NODES + KOKOLIS_NODES // 8,
            "horizon_days": failures / (KOKOLIS_NODES * rate / 1000.0), "faults[0].rate_per_1000_node_days": rate,
            "jobs[0].checkpoint_cost_min": write, "jobs[0].checkpoint_interval_min": interval,
            "jobs[0].restart_min": restart})
        sc = scn.validate(raw)
        vals = [run_one(sc, pol, 200 + 10 * i + s)["ettr"] for s in range(1, seeds + 1)]
        ci = mean_ci(vals)
        out.append(_case(f"Kokolis et al. held out: ETTR at 12,000 GPUs, {label}", 0.90, ci["mean"], 0.02, "abs",
                         note=f"{seeds} seeds, 95 % CI [{ci['ci95'][0]:.3f}, {ci['ci95'][1]:.3f}]; Young interval "
                              f"{interval:.1f} min; the paper's closed form gives {closed:.3f}",
                         why=KOKOLIS_WHY))
    return out


#: AIReSim 7b139c7 itself, run side by side on this project's machine (benchmarks/bench_simulator.py runs it again):
#: its default Params, seeds 1-10, systematic (bad-server) failures per replication.
AIRESIM_BAD_SERVER = (681, 696, 702, 702, 686, 702, 669, 699, 685, 693)
AIRESIM_SEEDS = len(AIRESIM_BAD_SERVER)


def airesim_cases(seeds: int = 1, bad_seeds: int = AIRESIM_SEEDS) -> list[dict]:
    """``seeds`` for the failure count and ETR; the bad-server failures are a mean over ``bad_seeds`` (>= 10 seeds
    against AIReSim's own mean over 10: within 3 %; fewer: within 10 % of its published 30-replication mean)."""
    sc = _load("airesim-default.yaml")
    pol = resolve("passive+auto-repair+hot-spares")
    rows = [run_one(sc, pol, s) for s in range(1, max(seeds, bad_seeds) + 1)]
    fails = sum(r["interruptions"] for r in rows[:seeds]) / seeds
    lemon = sum(r["lemon_failures"] for r in rows[:bad_seeds]) / bad_seeds
    etr = sum(r["ettr"] for r in rows[:seeds]) / seeds
    theirs = sum(AIRESIM_BAD_SERVER) / AIRESIM_SEEDS
    # AIReSim's docs/SIMULATION_REPORT.md, 30 replications: 11,145.6 +- 100.3 failures, 688.6 +- 15.4 of them
    # systematic (bad servers), ETR 0.6228
    if bad_seeds >= AIRESIM_SEEDS:
        bad = _case("AIReSim default: bad-server failures (against AIReSim run side by side)", theirs, lemon, 0.03,
                    "rel", note=f"means over {bad_seeds} seeds here and {AIRESIM_SEEDS} of AIReSim 7b139c7",
                    why="follows from the misdiagnosis rate, the repair time's shape, the stage-dependent cure, the "
                        "warm standbys and the pool dynamics; none is set from it")
    else:
        bad = _case("AIReSim default: bad-server failures", 688.6, lemon, 0.10, "rel", note=f"{bad_seeds} seed(s)",
                    why="follows from the misdiagnosis rate, the repair time's shape, the stage-dependent cure, the "
                        "warm standbys and the pool dynamics; none is set from it")
    return [_case("AIReSim default: failures", 11145.6, fails, 0.02, "rel", note=f"{seeds} seed(s)",
                  role="restates", why="AIReSim's failure rates and job size are the scenario's"),
            bad,
            _case("AIReSim default: ETR", 0.6228, etr, 0.01, "abs", role="restates",
                  why="with lost work and detection zero, ETR is 6144 / (6144 + failures x 20 min): it follows "
                      "from the failure count")]


def run_all(quick: bool = False, progress=None) -> dict:
    """Every published case; ``progress(done, total, name)`` is called as each group of cases finishes."""
    t0 = time.perf_counter()
    groups = [("Daly", lambda: daly_cases(seeds=200 if quick else 400, sweep_seeds=40 if quick else 80)),
              ("Llama 3", lambda: llama_cases(seeds=24 if quick else 40)),
              ("RSC-1", lambda: rsc_cases(failures=3000 if quick else 9000, seeds=3)),
              ("Kokolis et al.", lambda: kokolis_cases(failures=400, seeds=4 if quick else 8)),
              ("AIReSim", lambda: airesim_cases(seeds=1 if quick else 2, bad_seeds=2 if quick else AIRESIM_SEEDS))]
    cases = []
    for i, (name, run) in enumerate(groups):
        cases += run()
        if progress:
            progress(i + 1, len(groups), name)
    return {"cases": cases, "passed": all(c["pass"] for c in cases), "wall_s": time.perf_counter() - t0}
