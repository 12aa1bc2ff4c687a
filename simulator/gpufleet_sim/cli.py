"""gpufleet-sim: run | sweep | spares | sensitivity | calibrate | validate."""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from . import scenario as scn
from . import sources
from .dists import SpecError, mean_ci
from .policies import load_file, resolve


def _progress_factory(total_hint: int, unit: str = "run", **bar):
    """A progress bar on a terminal (nothing otherwise): (callback(done, total), bar). ``unit="B"`` with
    ``unit_scale=True`` counts bytes."""
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover
        return None, None
    progress_bar = tqdm(total=total_hint, unit=unit, file=sys.stderr, disable=None, leave=False, **bar)

    def cb(done, total):
        progress_bar.total = total
        progress_bar.n = done
        progress_bar.refresh()

    return cb, progress_bar


def _emit_json(target, data) -> None:
    """--json: the result as JSON on stdout (``-``) or written atomically to a path; nothing when not asked."""
    if not target:
        return
    from .report import _atomic_write

    text = json.dumps(data, indent=2, default=float)
    if target == "-":
        print(text)
    else:
        _atomic_write(Path(target), text.encode())


def _policies(args, sc) -> list:
    out = []
    for p in args.policy or []:
        if p.endswith((".yaml", ".yml")) and os.path.exists(p):
            out += load_file(p)
        else:
            out.append(resolve(p, f"--policy {p}"))
    return out or [resolve(p, f"policies[{i}]") for i, p in enumerate(sc["policies"])]


#: ``--factorial auto`` runs the design when nodes x days x 54 x seeds stays below this (default-1k: 1.6 million)
FACTORIAL_AUTO_NODE_DAYS = 5_000_000


def cmd_run(args) -> int:
    from .report import table, write_all, write_json
    from .runner import run_scenario

    sc = scn.load(args.scenario)
    pols = _policies(args, sc)
    seeds = args.seeds or sc["seeds"]
    cb, progress_bar = _progress_factory(len(pols) * seeds)
    res = run_scenario(sc, pols, seeds=seeds, progress=cb)
    res["input_sources"] = sc["input_sources"]
    if progress_bar is not None:
        progress_bar.close()
    if not args.no_effects:
        from .runner import best_policy, knob_effects

        # around the best policy: what each of its knobs is worth on its own
        best = best_policy(res["policies"])
        anchor = next(p for p in pols if p["name"] == best)
        cb, progress_bar = _progress_factory(1)
        res["knob_effects"] = knob_effects(sc, anchor, res["per_seed"][best], progress=cb)
        if progress_bar is not None:
            progress_bar.close()
    size = sc["cluster"]["nodes"] * (sc.get("horizon_days") or 365) * 54 * seeds
    if args.factorial == "on" or (args.factorial == "auto" and size <= FACTORIAL_AUTO_NODE_DAYS):
        from .runner import factorial_effects

        # the full design over the knobs, the same seeds: each knob's own effect over every other setting
        cb, progress_bar = _progress_factory(1)
        res["factorial"] = factorial_effects(sc, seeds, progress=cb)
        if progress_bar is not None:
            progress_bar.close()
    elif args.factorial == "auto":
        print(f"the full design over the knobs (54 combinations x {seeds} seeds of this size) was left out; "
              "--factorial on runs it", file=sys.stderr)
    sens = None
    if sc["estimates"] and len(pols) > 1 and not args.no_sensitivity:
        from .sensitivity import run_sensitivity, verdict

        # the same policies and seeds with each estimate at the ends of its plausible range
        cb, progress_bar = _progress_factory(2 * len(sc["estimates"]) + 5)
        sens = run_sensitivity(sc, pols, seeds, progress=cb, base=res)
        if progress_bar is not None:
            progress_bar.close()
        res["sensitivity"] = sens
    if args.out:
        files = write_all(res, Path(args.out))
        print(files["table"])
        print(f"wrote {files['html']}, {files['csv']}, " + ", ".join(str(p) for p in files["pngs"]))
    elif args.json != "-":
        print(table(res))
    if args.json != "-":
        print(sources.summary(sc["input_sources"]))
    if sens is not None and args.json != "-":
        names = ", ".join(e["name"] for e in sc["estimates"])
        print(f"This answer rests on {len(sc['estimates'])} estimates ({names}); each at the ends of its plausible "
              "range:")
        for line in verdict(sens):
            print(line)
        if args.out:
            print(f"the report's section 'Does the answer survive the scenario's estimates?' has them with a tornado "
                  f"plot; the table alone: {Path(args.out) / 'sensitivity.html'}")
    if args.json:
        write_json(res, args.json)
    if args.export_history:
        for path in export_runs(sc, pols[0], seeds, Path(args.export_history)):
            print(f"wrote {path}")
    return 0


def export_runs(sc: dict, policy: dict, seeds: int, out: Path) -> list:
    """--export-history: each seed of ``policy`` run again in this process (seeded: the same runs) and written
    as a real cluster's records (export.py) into OUT/<policy>/seed-<n>/."""
    from .engine import Sim
    from .export import export_history
    from .runner import _brain

    written = []
    for seed in range(1, seeds + 1):
        sim = Sim(sc, policy, seed, _brain(sc, policy, {}))
        sim.keep_records()
        sim.run()
        files = export_history(sim, out / policy["name"].replace("/", "_") / f"seed-{seed}")
        written += list(files.values())
    return written


def cmd_calibrate(args) -> int:
    from .brain import default_brain
    from .calibrate import CalibrationError, fit, holdout, holdout_cut, load_records, window_of
    from .repair_records import holdout_steps

    sc = scn.load(args.scenario)
    prom = args.prometheus or args.prometheus_file
    if not (args.events or args.sacct or args.nodes or prom):
        print("gpufleet-sim calibrate: give the site's records: --events (sacctmgr -P show event), --sacct "
              "(sacct --json), --nodes (scontrol show node --json: the repair histories) and/or --prometheus "
              "(the agent's series)", file=sys.stderr)
        return 2
    brain = default_brain(sc)
    repairs = None
    steps: list = []
    agent = None
    try:
        if args.prometheus and args.prometheus_file:
            raise CalibrationError("--prometheus and --prometheus-file: give one of them")
        if args.nodes:
            repairs, steps = _calibrate_repairs(args.nodes, args.history_field)
        if not (args.events or args.sacct or prom):
            if args.holdout:
                raise CalibrationError("--holdout: the held-out check predicts node events and interruptions; give "
                                       "--events, --sacct and/or --prometheus")
            return _write_calibrated(args, sc, None, repairs)

        reading = _progress_factory(0, unit="B", unit_scale=True, desc="reading")
        try:
            events, runs = load_records(args.events, args.sacct, progress=reading[0])
        finally:
            if reading[1] is not None:
                reading[1].close()
        span = window_of(events, runs) if (events or len(runs)) else None
        if prom:
            agent, span = _agent_records(args, span)
            if not args.events:  # the agent's episodes are the node events (a site without slurmdbd)
                events = agent["events"]
        t0, t1 = span
        if args.holdout:
            if not 0 < args.holdout < 1:
                raise CalibrationError(f"--holdout: expected a share of the window between 0 and 1, got {args.holdout}")
            rows = holdout(sc, brain, events, runs, t0, t1, args.holdout)
            rows += holdout_steps(steps, holdout_cut(t0, t1, args.holdout))
            print(f"held-out check: fitted on the first {1 - args.holdout:.0%} of the records, the last "
                  f"{args.holdout:.0%} predicted")
            print(f"{'what':<58} {'observed':>9} {'predicted':>10} {'95 % interval':>15}")
            for r in rows:
                lo, hi = r["interval"]
                flag = "" if lo <= r["observed"] <= hi else "  <- outside"
                print(f"{r['what'][:58]:<58} {r['observed']:>9g} {r['predicted']:>10.1f} {f'{lo:g}-{hi:g}':>15}{flag}")
            _emit_json(args.json, {"holdout": rows})
            return 0
        res = fit(sc, brain, events, runs, t0, t1)
    except CalibrationError as exc:
        print(f"gpufleet-sim calibrate: {exc}", file=sys.stderr)
        return 2
    days = (t1 - t0) / 86400
    print(f"{sc['name']}: {len(events):,} node events, {len(runs):,} job runs over {days:.1f} days; exposure "
          f"{res['exposure_node_days']:,.1f} {res['exposure']}")
    print(f"{'classes (event key)':<58} {'events':>7} {'rate':>9} {'95 % CI':>17} {'base':>8}")
    for key, g in res["groups"].items():
        lo, hi = g["ci95"]
        print(f"{('/'.join(g['classes']) + f' ({key})')[:58]:<58} {g['count']:>7} {g['rate']:>9.3f} "
              f"{f'{lo:.3f}-{hi:.3f}':>17} {g['base_rate']:>8.3f}")
    if res["unmatched"]:
        print("events no class of the scenario explains (left out): " +
              ", ".join(f"{k} x{n}" for k, n in sorted(res["unmatched"].items())))
    print("rates per 1,000 node-days; classes the records cannot tell apart share one rate")
    jobs = res["jobs"]
    if jobs["runs"]:
        shares = ", ".join(f"{k} nodes {v:.0%}" for k, v in jobs["node_days_share"].items())
        print(f"jobs: {jobs['runs']:,} runs, the largest on {jobs['largest_nodes']:,} nodes; node-days by job size: "
              f"{shares} (set the scenario's jobs from these; sacct shows no checkpoint settings)")
    if agent is not None:
        res["agent"] = {k: v for k, v in agent.items() if k != "events"}
        _print_agent(agent, bool(args.events))
    return _write_calibrated(args, sc, res, repairs)


def _agent_records(args, span):
    """--prometheus / --prometheus-file: the agent's episodes (as node events) and Xid lines, and the window."""
    from . import prom_records as pr
    from .calibrate import CalibrationError, _epoch, event_key

    if args.prometheus:
        t0 = _epoch(args.since, "--since") if args.since else (span[0] if span else None)
        t1 = _epoch(args.until, "--until") if args.until else (span[1] if span else time.time())
        if t0 is None:
            raise CalibrationError("--prometheus: give --since (YYYY-MM-DDTHH:MM:SS, UTC): the window to read")
        if t1 <= t0:
            raise CalibrationError(f"--until: expected a time after --since, got {args.until}")
        if not 0 < args.prometheus_step <= 86400:
            raise CalibrationError(f"--prometheus-step: expected seconds between 0 and 86400, got "
                                   f"{args.prometheus_step}")
        series = pr.load(args.prometheus, None, t0, t1, args.prometheus_step)
    else:
        series = pr.load(None, args.prometheus_file, 0.0, 0.0, 0.0)
        times = [t for s in series for t, _x in (s.values[:1] + s.values[-1:])]
        if not times and not span:
            raise CalibrationError(f"{args.prometheus_file}: no samples of the agent's series")
        t0, t1 = span if span else (min(times), max(times) + 1.0)
    events = pr.episodes(series)
    keys: dict = {}
    for e in events:
        if t0 <= e.start < t1:
            k = event_key(e.reason)
            keys[k] = keys.get(k, 0) + 1
    return {"events": events, "episodes": keys, "xid_lines": pr.xid_counts(series, t0, t1, 2 * args.prometheus_step),
            "detection": pr.detection(series, t0, t1), "series": len(series), "window": [t0, t1]}, (t0, t1)


def _print_agent(agent: dict, side_by_side: bool) -> None:
    eps = ", ".join(f"{k} x{n}" for k, n in sorted(agent["episodes"].items())) or "none"
    xids = ", ".join(f"Xid {k} x{n:g}" for k, n in sorted(agent["xid_lines"].items())) or "none"
    what = "beside Slurm's events (the rates above are Slurm's)" if side_by_side else "(the events above)"
    print(f"the agent's series ({agent['series']} series): unhealthy episodes {what}: {eps}; kernel-log Xid lines: "
          f"{xids}")
    det = agent["detection"]
    interval = f"every {det['interval_min']:.2f} min (median)" if det["interval_min"] else "interval: too few checks"
    took = (f"a check takes {det['duration_min']['median'] * 60:.1f} s (median; p90 "
            f"{det['duration_min']['p90'] * 60:.1f} s)" if det["duration_min"] else "run time: too few checks")
    print(f"the agent's checks: {det['checks']:,}; {interval}; {took}")


def _calibrate_repairs(paths: list, field: str) -> tuple:
    """--nodes: the repair steps the nodes' histories show, fitted and printed; (the fit, the steps)."""
    from .repair_records import fit_steps, load_node_dumps, window_of_steps

    steps, problems = load_node_dumps(paths, field)
    fitted = fit_steps(steps)
    fitted["window"] = window_of_steps(steps)
    fitted["unreadable"] = problems
    print(f"repair histories: {len(steps):,} repair steps in {fitted['incidents']:,} incidents"
          + (f" ({fitted['window'][0]} to {fitted['window'][1]})" if fitted["window"] else ""))
    print(f"{'step':<10} {'steps':>6} {'cured':>6} {'failed':>7} {'pending':>8} {'success':>8} {'95 % CI':>12} "
          f"{'durations':>10} {'median min':>11} {'p90 min':>8}")
    for action, row in fitted["actions"].items():
        ci = f"{row['ci95'][0]:.2f}-{row['ci95'][1]:.2f}" if row["ci95"] else "-"
        ok = f"{row['success']:.3f}" if row["success"] is not None else "-"
        d = row.get("duration_min") or {"median": float("nan"), "p90": float("nan")}
        print(f"{action:<10} {row['steps']:>6} {row['cured']:>6} {row['failed']:>7} {row['pending']:>8} {ok:>8} "
              f"{ci:>12} {row['durations']:>10} {d['median']:>11.1f} {d['p90']:>8.1f}")
    if fitted["need"]:
        print("the lowest step that cured each class: " + ", ".join(f"{c} {a}" for c, a in fitted["need"].items()))
    if problems:
        print(f"{len(problems)} node histories could not be read (left out); the first: {problems[0]}")
    return fitted, steps


def _write_calibrated(args, sc: dict, res: dict | None, repairs: dict | None) -> int:
    import copy

    from .calibrate import calibrated_raw
    from .repair_records import calibrated_repairs

    if args.out:
        import yaml

        from .report import _atomic_write

        doc = calibrated_raw(sc, res) if res is not None else copy.deepcopy(sc["raw"])
        if repairs is not None:
            calibrated_repairs(doc, repairs, repairs["window"])
        if res is not None and res.get("agent"):
            from .prom_records import calibrated_detection

            window = [time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t)) for t in res["agent"]["window"]]
            calibrated_detection(doc, res["agent"]["detection"], window)
        scn.validate(doc, args.out)  # what is written loads
        _atomic_write(Path(args.out), yaml.safe_dump(doc, sort_keys=False, width=118).encode())
        print(f"wrote {args.out}")
    out = dict(res or {})
    if repairs is not None:
        out["repairs"] = repairs
    _emit_json(args.json, out)
    return 0


def _sweep_point(job):
    raw, assign, policy, seeds, value = job
    from .runner import run_one

    sc = scn.validate(scn.override(raw, assign))
    pol = resolve(policy) if isinstance(policy, str) else policy
    rows = [run_one(sc, pol, s) for s in range(1, seeds + 1)]
    keep = ("ettr", "lost_gpu_hours", "cost_usd", "lost_cost_usd", "spare_cost_usd", "pool_ran_empty",
            "peak_spare_demand")
    return {"assign": assign, "value": value, "policy": pol["name"],
            **{k: mean_ci([float(r[k]) for r in rows]) for k in keep},
            "per_seed": [{"seed": r["seed"], **{k: r[k] for k in keep}} for r in rows]}


def _parse_value(v: str):
    try:
        return json.loads(v)
    except ValueError:
        return v


def cmd_sweep(args) -> int:
    sc = scn.load(args.scenario)
    sw = sc["sweep"]
    param = args.param or sw.get("param")
    if not param:
        raise SpecError("--param: expected a dotted scenario field (or sweep.param in the scenario)")
    values = [_parse_value(v) for v in args.values.split(",")] if args.values else sw.get("values")
    if not values:
        raise SpecError("--values: expected comma-separated values (or sweep.values in the scenario)")
    policy = args.policy or sw.get("policy") or (sc["policies"][0])
    seeds = args.seeds or sc["seeds"]
    jobs = []
    for v in values:
        assign = {param: v}
        if param.endswith("approval_delay_min") and isinstance(v, (int, float)) and v == 0:
            assign = {param: {"dist": "fixed", "value": 0}}
        scn.validate(scn.override(sc["raw"], assign), source=f"{param}={json.dumps(v)}")  # every point, up front
        jobs.append((sc["raw"], assign, policy, seeds, v))
    resolve(policy, "--policy" if args.policy else "sweep.policy")
    results = _run_points(args, jobs, "sweep")
    if isinstance(results, int):
        return results
    return _sweep_report(args, param, results)


def _run_points(args, jobs: list, command: str):
    """Run sweep points on all cores (a progress bar on a terminal), or one of them inside a Slurm array task, or
    all of them as a Slurm job array. Returns the points' results, or an exit code."""
    if args.task is not None:  # one point, inside a Slurm array task
        res = _sweep_point(jobs[args.task])
        Path(args.out).mkdir(parents=True, exist_ok=True)
        tmp = Path(args.out) / f".point-{args.task}.json"
        tmp.write_text(json.dumps(res, default=float))
        os.replace(tmp, Path(args.out) / f"point-{args.task}.json")
        return 0
    if args.slurm:
        return _sweep_slurm(args, len(jobs), command)
    cb, pbar = _progress_factory(len(jobs))
    results: list = [None] * len(jobs)
    with mp.Pool(args.jobs or os.cpu_count() or 1) as pool:
        for i, res in enumerate(pool.imap(_sweep_point, jobs)):
            results[i] = res
            if cb:
                cb(i + 1, len(jobs))
    if pbar is not None:
        pbar.close()
    return results


def cmd_sensitivity(args) -> int:
    from .sensitivity import run_sensitivity, text, write_all

    sc = scn.load(args.scenario)
    pols = _policies(args, sc)
    seeds = args.seeds or sc["seeds"]
    cb, progress_bar = _progress_factory(2 * len(sc["estimates"]) + 5)
    res = run_sensitivity(sc, pols, seeds, progress=cb)
    if progress_bar is not None:
        progress_bar.close()
    if args.json != "-":
        print(text(res))
    if args.out:
        files = write_all(res, args.out)
        if args.json != "-":
            print(f"wrote {files['html']} (tornado plot {files['tornado']})")
    _emit_json(args.json, res)
    return 0


def cmd_spares(args) -> int:
    """Which policy and how many spare nodes minimise the total cost: lost GPU-hours x price + the spares' cost."""
    sc = scn.load(args.scenario)
    job_nodes = sum(j["nodes"] for j in sc["jobs"])
    have = sc["cluster"]["nodes"] - job_nodes
    if args.spares:
        try:
            counts = sorted({int(v) for v in args.spares.split(",")})
        except ValueError:
            raise SpecError(f"--spares: expected comma-separated whole numbers of spare nodes, got {args.spares!r}")
        if counts[0] < 0:
            raise SpecError(f"--spares: expected counts >= 0, got {counts[0]}")
    else:
        counts = sorted({0, max(1, have // 4), max(1, have // 2), have, 2 * have, 3 * have})
    pols = _policies(args, sc)
    seeds = args.seeds or sc["seeds"]
    jobs = []
    for pol in pols:
        for k in counts:
            assign = {"cluster.nodes": job_nodes + k}
            scn.validate(scn.override(sc["raw"], assign), source=f"spares {k}")
            jobs.append((sc["raw"], assign, pol, seeds, k))
    results = _run_points(args, jobs, "spares")
    if isinstance(results, int):
        return results
    flips = None
    if sc["estimates"] and not args.no_sensitivity and args.slurm:
        print("the spare count at the ends of the estimates' ranges is not searched under --slurm (the array's "
              "tasks run the points above); run `gpufleet-sim spares` without --slurm for it", file=sys.stderr)
    elif sc["estimates"] and not args.no_sensitivity:
        from .sensitivity import spare_flips, spare_jobs

        best = min(results, key=lambda r: r["cost_usd"]["mean"])
        more, where = spare_jobs(sc, best["policy"], counts, seeds)
        at_ends = _run_points(args, more, "spares")
        if isinstance(at_ends, int):
            return at_ends
        flips = spare_flips(best["value"], at_ends, where)
    return _spares_report(args, sc, results, flips)


def _spares_report(args, sc: dict, results: list, flips: list | None = None) -> int:
    from .runner import paired
    from .sensitivity import spare_verdict

    best = min(results, key=lambda r: r["cost_usd"]["mean"])
    rivals = sorted((r for r in results if r is not best), key=lambda r: r["cost_usd"]["mean"])
    out = {"scenario": sc["name"], "price_per_gpu_hour": sc["price_per_gpu_hour"],
           "spare_cost_per_gpu_hour": sc["spare_cost_per_gpu_hour"],
           "points": [{k: v for k, v in r.items() if k != "per_seed"} for r in results],
           "best": {"policy": best["policy"], "spares": best["value"], "cost_usd": best["cost_usd"]}}
    if rivals:
        nxt = rivals[0]
        d = paired({"best": best["per_seed"], "next": nxt["per_seed"]}, "best", ("cost_usd",))["policies"]["next"][
            "cost_usd"]
        out["runner_up"] = {"policy": nxt["policy"], "spares": nxt["value"], "cost_usd": nxt["cost_usd"],
                            "extra_cost_usd_paired": d}
    if args.json != "-":
        print(f"{sc['name']}: total cost = lost GPU-h x ${sc['price_per_gpu_hour']:g} + spare GPU-h x "
              f"${sc['spare_cost_per_gpu_hour']:g}; mean over seeds, 95 % CI")
        print(f"{'policy':<32} {'spares':>6} {'ETTR':>8} {'lost $':>14} {'spares $':>12} {'total $':>26} "
              f"{'P(no spare)':>11}")
        for r in results:
            c = r["cost_usd"]
            print(f"{r['policy']:<32} {r['value']:>6} {r['ettr']['mean'] * 100:>7.2f}% "
                  f"{r['lost_cost_usd']['mean']:>14,.0f} {r['spare_cost_usd']['mean']:>12,.0f} "
                  f"{c['mean']:>12,.0f} [{c['ci95'][0]:,.0f}, {c['ci95'][1]:,.0f}] "
                  f"{r['pool_ran_empty']['mean']:>11.2f}")
        line = f"cheapest: {best['policy']} with {best['value']} spare nodes, ${best['cost_usd']['mean']:,.0f}"
        if rivals:
            d = out["runner_up"]["extra_cost_usd_paired"]
            line += (f"; next: {nxt['policy']} with {nxt['value']} spares costs ${d['mean']:+,.0f} more, paired "
                     f"95 % CI [{d['ci95'][0]:+,.0f}, {d['ci95'][1]:+,.0f}]"
                     + ("" if d["ci95"][0] > 0 else " (not separated: run more seeds)"))
        print(line)
    if flips is not None:
        out["spare_flips"] = flips
        if args.json != "-":
            print("\n".join(spare_verdict(best["value"], flips, best["policy"])))
    _emit_json(args.json, out)
    return 0


def _sweep_report(args, param, results) -> int:
    best = max(results, key=lambda r: r["ettr"]["mean"])
    out = {"param": param, "points": results, "best": best}
    for r in results:
        v = r["value"]
        print(f"{param} = {json.dumps(v)}: ETTR {r['ettr']['mean'] * 100:.2f} %, lost GPU-h "
              f"{r['lost_gpu_hours']['mean']:,.0f}, cost ${r['cost_usd']['mean']:,.0f}")
    print(f"best: {param} = {json.dumps(best['value'])}")
    _emit_json(args.json, out)
    return 0


def _sweep_slurm(args, n: int, command: str = "sweep"):
    """Submit the points as one Slurm job array (sbatch --wait), then collect them (or return an exit code)."""
    out = Path(args.out or f"out/{command}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "gpufleet_sim.cli", command, os.path.abspath(args.scenario), "--out", str(out),
            "--task", "$SLURM_ARRAY_TASK_ID"]
    for k in ("param", "values", "policy", "spares"):
        v = getattr(args, k, None)
        for one in (v if isinstance(v, list) else [v] if v else []):
            argv += [f"--{k}", str(one)]
    if args.seeds:
        argv += ["--seeds", str(args.seeds)]
    cmd = " ".join(shlex.quote(a) if not a.startswith("$") else f'"{a}"' for a in argv)
    script = out / "sweep.sbatch"
    script.write_text("#!/usr/bin/env bash\n#SBATCH --job-name=gpufleet-sweep\n"
                      f"#SBATCH --array=0-{n - 1}\n#SBATCH --output={out}/slurm-%A_%a.out\n"
                      f"export PYTHONPATH={shlex.quote(os.pathsep.join(sys.path[1:]))}\n{cmd}\n")
    sb = [args.sbatch or "sbatch", "--wait", "--parsable"] + (shlex.split(args.slurm_args) if args.slurm_args else [])
    r = subprocess.run(sb + [str(script)], capture_output=True, text=True, check=False)
    if r.returncode != 0:
        print(f"sbatch failed ({r.returncode}): {r.stderr.strip()}", file=sys.stderr)
        return 2
    job_id = r.stdout.strip().split(";")[0]
    print(f"Slurm array job {job_id}: {n} tasks done")
    results = []
    for i in range(n):
        p = out / f"point-{i}.json"
        if not p.exists():
            print(f"array task {i} wrote no result ({p})", file=sys.stderr)
            return 2
        results.append(json.loads(p.read_text()))
    return results


def cmd_validate(args) -> int:
    from .validate import ROLES, run_all

    cb, pbar = _progress_factory(4)
    res = run_all(quick=args.quick, progress=(lambda done, total, _name: cb(done, total)) if cb else None)
    if pbar is not None:
        pbar.close()
    w = max(len(c["case"]) for c in res["cases"])
    if args.json != "-":
        print(f"{'case'.ljust(w)}  {'expected':>10}  {'measured':>10}  {'tolerance':>22}  result  role")
        for c in res["cases"]:
            print(f"{c['case'].ljust(w)}  {c['expected']:>10.4g}  {c['measured']:>10.4g}  {c['tolerance']:>22}  "
                  f"{'PASS' if c['pass'] else 'FAIL':<6}  {c['role']}")
        print(f"{'all passed' if res['passed'] else 'FAILED'} in {res['wall_s']:.1f} s")
        counts = {r: sum(c["role"] == r for c in res["cases"]) for r in ROLES}
        print(f"{counts['predicts']} case(s) predict (no input set from the figure), {counts['calibrates']} "
              f"calibrate (inputs fitted to it), {counts['restates']} restate (arithmetic on inputs); why, case by "
              "case: --json")
    _emit_json(args.json, res)
    return 0 if res["passed"] else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="gpufleet-sim", description="Fault-injection simulator for GPU fleets: "
                                 "which repair policy saves the most GPU-hours")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run a scenario under one or more policies")
    r.add_argument("scenario")
    r.add_argument("--policy", action="extend", nargs="+",
                   help="built-in policy names or policy YAML files (several, and/or repeat the option)")
    r.add_argument("--seeds", type=int)
    r.add_argument("--no-sensitivity", action="store_true",
                   help="skip running the scenario's estimates at the ends of their ranges (gpufleet-sim sensitivity)")
    r.add_argument("--no-effects", action="store_true",
                   help="skip each knob's own effect around the best policy (one run per other knob level)")
    r.add_argument("--factorial", choices=("auto", "on", "off"), default="auto",
                   help="the full design over detection, spares, repair and job action (54 combinations, each "
                        "knob's main effect); auto: when the runs are small (default-1k: about 4 s)")
    r.add_argument("--out", help="directory for the table, CSV, JSON, PNG plots and HTML report")
    r.add_argument("--json", help="write the JSON result to PATH, or - for stdout")
    r.add_argument("--export-history", metavar="DIR",
                   help="also write each seed of the first policy as a cluster's records (sacctmgr events, sacct "
                        "JSON, node dumps with the repair histories, the agent's series) into "
                        "DIR/<policy>/seed-<n>/, for gpufleet-sim calibrate")
    r.set_defaults(fn=cmd_run)
    c = sub.add_parser("calibrate", help="fit the scenario's failure rates to the site's own Slurm records")
    c.add_argument("scenario", help="the base scenario (classes, their kernel-log lines, the fleet's size)")
    c.add_argument("--events", help="sacctmgr -P show event format=Cluster,NodeName,TimeStart,TimeEnd,State,"
                                    "Reason,User (a file)")
    c.add_argument("--sacct", help="sacct --json, or sacct -P -X --format=JobID,State,NNodes,Start,End (a file)")
    c.add_argument("--nodes", action="append", metavar="FILE",
                   help="Slurm's node records holding the repair histories: scontrol show node --json (one document, "
                        "or one a line: dumps taken over time), sinfo --json (22.05) or scontrol -o show node; "
                        "repeat for more files")
    c.add_argument("--history-field", choices=("extra", "comment"), default="extra",
                   help="the node field the repair history is kept in (node_repair's history_field; default extra)")
    c.add_argument("--prometheus", metavar="URL",
                   help="a Prometheus server holding the agent's series (http://host:9090): its unhealthy episodes "
                        "are the node events when --events is not given, and are printed beside them when it is")
    c.add_argument("--prometheus-file", metavar="FILE",
                   help="the same from saved query_range answers (JSON lines; run --export-history writes one)")
    c.add_argument("--since", help="--prometheus: the window's start, YYYY-MM-DDTHH:MM:SS UTC (default: the "
                                   "Slurm records' first)")
    c.add_argument("--until", help="--prometheus: the window's end (default: the Slurm records' last, else now)")
    c.add_argument("--prometheus-step", type=float, default=60.0,
                   help="--prometheus: seconds between samples asked for (default 60; the agent's timer is 5 min)")
    c.add_argument("--holdout", type=float, help="fit on the earlier records, predict the last share (e.g. 0.33)")
    c.add_argument("--out", help="write the calibrated scenario (YAML) here")
    c.add_argument("--json", help="write the fit as JSON to PATH, or - for stdout")
    c.set_defaults(fn=cmd_calibrate)
    s = sub.add_parser("sweep", help="vary one scenario parameter and report the best setting")
    s.add_argument("scenario")
    s.add_argument("--param", help="dotted scenario field, e.g. jobs[0].checkpoint_interval_min")
    s.add_argument("--values", help="comma-separated values (JSON each)")
    s.add_argument("--policy")
    s.add_argument("--seeds", type=int)
    s.add_argument("--jobs", type=int, help="local worker processes (default: all cores)")
    s.add_argument("--slurm", action="store_true", help="run the points as a Slurm job array")
    s.add_argument("--sbatch", help="sbatch command (default: sbatch on PATH)")
    s.add_argument("--slurm-args", help="extra sbatch arguments, e.g. '--partition=debug'")
    s.add_argument("--task", type=int, help=argparse.SUPPRESS)
    s.add_argument("--out")
    s.add_argument("--json")
    s.set_defaults(fn=cmd_sweep)
    sp = sub.add_parser("spares", help="which policy and how many spare nodes minimise lost time + spare cost")
    sp.add_argument("scenario")
    sp.add_argument("--spares", help="comma-separated spare-node counts (default: 0 to 3x the scenario's)")
    sp.add_argument("--policy", action="extend", nargs="+", help="policies to compare (default: the scenario's)")
    sp.add_argument("--seeds", type=int)
    sp.add_argument("--jobs", type=int, help="local worker processes (default: all cores)")
    sp.add_argument("--slurm", action="store_true", help="run the points as a Slurm job array")
    sp.add_argument("--sbatch", help="sbatch command (default: sbatch on PATH)")
    sp.add_argument("--slurm-args", help="extra sbatch arguments, e.g. '--partition=debug'")
    sp.add_argument("--task", type=int, help=argparse.SUPPRESS)
    sp.add_argument("--out")
    sp.add_argument("--json")
    sp.add_argument("--no-sensitivity", action="store_true",
                    help="skip the search again at the ends of each estimate's plausible range")
    sp.set_defaults(fn=cmd_spares)
    se = sub.add_parser("sensitivity", help="does the recommended policy hold over each estimate's plausible range?")
    se.add_argument("scenario")
    se.add_argument("--policy", action="extend", nargs="+", help="policies to compare (default: the scenario's)")
    se.add_argument("--seeds", type=int)
    se.add_argument("--json", help="write the JSON result to PATH, or - for stdout")
    se.add_argument("--out", help="also write sensitivity.txt, tornado.png and sensitivity.html into this directory")
    se.set_defaults(fn=cmd_sensitivity)
    v = sub.add_parser("validate", help="run the published validation cases; exit 0 only if all pass")
    v.add_argument("--json")
    v.add_argument("--quick", action="store_true", help="fewer seeds (the tolerances still hold)")
    v.set_defaults(fn=cmd_validate)
    args = ap.parse_args(argv)
    try:
        return args.fn(args)
    except SpecError as e:
        print(f"gpufleet-sim: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
