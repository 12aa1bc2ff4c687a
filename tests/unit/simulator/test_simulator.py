"""Simulator tests: the published cases are pass/fail here (real SimPy, real health rules, real repair policy)."""

import json
import subprocess
import sys

import pytest

from gpufleet_sim import scenario as scn
from gpufleet_sim import validate as val
from gpufleet_sim.dists import SpecError
from gpufleet_sim.policies import resolve
from gpufleet_sim.runner import run_one, run_scenario

# What each published case can show (validate.ROLES): a case whose inputs were fitted to its figure, or whose figure
# is arithmetic on inputs from the same source, must never be reported as a prediction.
ROLES = {
    "Daly": "predicts",
    "Llama 3 unexpected interruptions": "restates", "Llama 3 GPU share": "restates",
    "Llama 3 hardware share": "restates", "Llama 3 effective training time": "calibrates",
    "RSC-1 job MTTF": "restates", "Kokolis et al. held out": "predicts",
    "AIReSim default: failures": "restates", "AIReSim default: bad-server failures": "predicts",
    "AIReSim default: ETR": "restates",
}


def _check_roles(cases):
    for c in cases:
        want = [r for prefix, r in ROLES.items() if c["case"].startswith(prefix)]
        assert want and c["role"] == want[0] and c["why"], (c["case"], c["role"], c["why"])


def _check(cases):
    _check_roles(cases)
    bad = [c for c in cases if not c["pass"]]
    assert not bad, json.dumps(bad, indent=1, default=float)


# The published cases at the seeds of `gpufleet-sim validate --quick`: `slow` (13-26 s for Daly, 3-6 s each for the
# rest), so `make test` runs them and `make check` runs the few-seed smokes below instead.
@pytest.mark.slow
def test_daly_closed_form_and_optimal_interval():
    _check(val.daly_cases(seeds=200, sweep_seeds=40))


@pytest.mark.slow
def test_llama3_table5():
    _check(val.llama_cases(seeds=24))


@pytest.mark.slow
def test_rsc1_scaling():
    _check(val.rsc_cases(failures=3000, seeds=3))


@pytest.mark.slow
def test_kokolis_held_out_ettr():
    _check(val.kokolis_cases(seeds=4))


@pytest.mark.slow
def test_airesim_default():
    """No smoke of its own: one seed is the whole case (a single replication, ~11,000 failures); the fast tier runs
    airesim-default for 60 days in test_typed_records_decide_as_the_text_records_do. The bad-server failures are a
    mean over 10 seeds against AIReSim's own mean over 10 (run side by side, recorded in validate.py): within 3 %."""
    cases = val.airesim_cases(seeds=1)
    assert "against AIReSim run side by side" in cases[1]["case"] and cases[1]["tolerance"] == "±3 %", cases[1]
    _check(cases)


def _check_smoke(cases, tolerances):
    """A few-seed smoke of a published group: every case is judged against the tolerance given here for it
    ("rel": share of the expected value, "abs": in the case's unit, "min": measured >= expected - tol). The list
    must name every case of the group, in order, so that none is added or renamed without a smoke tolerance."""
    assert [c["case"] for c in cases] == list(tolerances)
    _check_roles(cases)
    bad = []
    for c in cases:
        kind, tol = tolerances[c["case"]]
        e, m = c["expected"], c["measured"]
        ok = {"rel": abs(m - e) <= tol * abs(e), "abs": abs(m - e) <= tol, "min": m >= e - tol}[kind]
        if not ok:
            bad.append(dict(c, smoke_tolerance=f"{kind} {tol:g}"))
    assert not bad, json.dumps(bad, indent=1, default=float)


# The smokes run the same case code on fewer seeds (fixed seeds, so each is as deterministic as the full case). Each
# tolerance is the published one where the smoke's seeds still resolve it, else the published one widened to about
# four standard errors of the smoke's mean; the per-seed spreads in the comments were measured on seeds 1-200 (Daly)
# and 1-24 (Llama 3). A smoke fails on an engine that is off by more than that: restarts or checkpoints not charged
# (Daly's ETTR), a fault rate in the wrong unit or a class counted in the wrong category (Llama 3), failures that do
# not scale with the job's size (RSC-1). Smaller errors are the full cases' to catch, in `make test`.
def test_daly_ettr_smoke():
    _check_smoke([val.daly_ettr_case(24.0, 40), val.daly_ettr_case(6.0, 40), val.daly_ettr_case(0.25, 4)], {
        "Daly ETTR, M = 24 h": ("rel", 0.01),  # published; per-seed sd 1.2 %, 40 seeds: 0.19 %
        "Daly ETTR, M = 6 h": ("rel", 0.01),  # published; per-seed sd 1.4 %, 40 seeds: 0.22 %
        "Daly ETTR, M = 15 min": ("rel", 0.03),  # published 1 %; per-seed sd 1.5 %, 4 seeds: 0.77 %
    })


def test_llama3_table5_smoke():
    _check_smoke(val.llama_cases(seeds=4), {
        # published 2 %; per-seed sd 4.3 %, 4 seeds: 2.1 %
        "Llama 3 unexpected interruptions (54 d, 16,384 GPUs)": ("rel", 0.09),
        "Llama 3 GPU share by counts": ("abs", 5.0),  # published; sd 2.1 pts, 4 seeds: 1.1 pts
        "Llama 3 hardware share by counts": ("abs", 5.0),  # published; sd 2.0 pts, 4 seeds: 1.0 pt
        # published: the CI's lower end >= 0.90; at 4 seeds that end sits 1.6 sd (0.0054) below a mean of ~0.908
        "Llama 3 effective training time (passive checks, auto-repair, hot spares)": ("min", 0.01),
    })


def test_kokolis_held_out_smoke():
    # published 0.02 abs; per-seed sd about 0.004 (seeds 1-8), 2 seeds: 0.003. An engine that does not charge the
    # checkpoint writes, the restart or the rolled-back work is off by 0.024 to 0.034 in the second alone.
    _check_smoke(val.kokolis_cases(seeds=2), {
        "Kokolis et al. held out: ETTR at 12,000 GPUs, r_f 1 per 1,000 node-days, 5 min checkpoint": ("abs", 0.02),
        "Kokolis et al. held out: ETTR at 12,000 GPUs, r_f 6.50, 10 s checkpoint": ("abs", 0.02),
    })


def test_rsc1_scaling_smoke():
    # published 5 % at 3,000 failures per size; at 1,200 the Poisson error is 2.9 %
    _check_smoke(val.rsc_cases(failures=1200, seeds=1), {
        "RSC-1 job MTTF at 4,096 GPUs": ("rel", 0.12),
        "RSC-1 job MTTF at 16,384 GPUs": ("rel", 0.12),
        "RSC-1 job MTTF at 131,072 GPUs": ("rel", 0.12),
    })


def test_scenario_errors_name_the_field():
    raw = scn.load(val.SCENARIOS / "default-1k.yaml")["raw"]
    bad = scn.override(raw, {"faults[0].rate_per_1000_node_days": "lots"})
    with pytest.raises(SpecError, match=r"faults\[0\]\.rate_per_1000_node_days: expected a number"):
        scn.validate(bad)
    with pytest.raises(SpecError, match=r"cluster\.nodes"):
        scn.validate(scn.override(raw, {"cluster.nodes": 3}))
    with pytest.raises(SpecError, match=r"policy: unknown policy"):
        resolve("nope")


def test_real_brain_decides_and_json_schema(tmp_path):
    sc = scn.load(val.SCENARIOS / "default-1k.yaml")
    res = run_scenario(sc, ["reactive-manual", "passive+auto-repair+hot-spares"], seeds=2)
    from gpufleet_sim.report import public_json, write_all

    j = public_json(res)
    assert "wall_s" in j
    for p in j["policies"].values():
        for k in ("ettr", "interruptions", "lost_gpu_hours", "mttr_hours", "cost_usd"):
            assert set(p[k]) == {"mean", "ci95"} and len(p[k]["ci95"]) == 2
        assert all(set(v) == {"mean", "ci95"} for v in p["interruptions_by_class"].values())
    # repair actions are the brain's vocabulary (reset_gpu/reboot/replace ...)
    acts = set(res["policies"]["passive+auto-repair+hot-spares"]["repair_actions"])
    assert acts and acts <= {"reset_gpu", "reboot", "reimage", "replace"}
    files = write_all(res, tmp_path)
    assert files["html"].exists() and all(p.stat().st_size > 10000 for p in files["pngs"])


def test_cli_run_json_stdout(tmp_path):
    r = subprocess.run([sys.executable, "-m", "gpufleet_sim.cli", "run", str(val.SCENARIOS / "default-1k.yaml"),
                        "--seeds", "1", "--policy", "reactive-auto", "--json", "-"], capture_output=True, text=True,
                       check=False)
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert 0 < j["policies"]["reactive-auto"]["ettr"]["mean"] <= 1


def test_seeds_reproducible():
    sc = scn.load(val.SCENARIOS / "default-1k.yaml")
    a = run_one(sc, resolve("together-approval"), 7)
    b = run_one(sc, resolve("together-approval"), 7)
    assert a["ettr"] == b["ettr"] and a["interruptions"] == b["interruptions"]


class _TextChecked:
    """A brain that answers with the typed plan() the engine uses, and checks every answer against plan() on the
    text form a Slurm body reads (the history as the stored text, the node and the fleet as the dict records)."""

    def __init__(self, real):
        self.real, self.calls, self.checked = real, real.calls, 0

    def judge(self, lines):
        return self.real.judge(lines)

    def healthy_report(self):
        return self.real.healthy_report()

    def drain_rule(self, *args):
        return self.real.drain_rule(*args)

    def plan_run(self, nodes, fleet, now_h, approvals=(), breaker=None):
        from ansible_collections.gpufleet.reliability.plugins.module_utils.repair import dumps, plan
        from gpufleet_sim.brain import to_epoch

        histories_before = [None if n.history is None else dumps(n.history) for n in nodes]
        p = self.real.plan_run(nodes, fleet, now_h, approvals, breaker)
        # the engine's records are left as they were (plan() works on a copy of each history)
        assert [None if n.history is None else dumps(n.history) for n in nodes] == histories_before
        records = [{"name": n.name, "partition": n.partitions[0], "domains": dict(n.domains),
                    "state": "+".join([n.state.upper()] + sorted(n.flags)), "reason": n.reason,
                    "reason_user": n.reason_user, "reason_time": n.reason_time, "report": n.report,
                    "report_time": n.report_time, "history": h, "boot_time": n.boot_time,
                    "jobs": None if n.jobs is None else [
                        {"job_id": j.job_id, "state": j.state, "requeue": j.requeue, "comment": j.comment,
                         "qos": j.qos, "on_node": j.on_node} for j in n.jobs]}
                   for n, h in zip(nodes, histories_before)]
        counts = {"total": fleet.total,
                  "partitions": {p: {"total": c.total, "available": c.available, "unavailable": c.unavailable,
                                     "spares_idle": len(c.spares)} for p, c in fleet.partitions.items()},
                  "domains": {k: {name: {"total": c.total, "available": c.available, "unavailable": c.unavailable}
                                  for name, c in doms.items()} for k, doms in fleet.domains.items()}}
        text = plan(counts, records, self.real.repair_config, to_epoch(now_h), approvals=approvals,
                    breaker=None if breaker is None else breaker.to_dict())
        assert [d.to_dict() for d in text] == [d.to_dict() for d in p]
        assert text.breaker == p.breaker
        self.checked += len(p)
        return p


def test_typed_records_decide_as_the_text_records_do():
    """The engine keeps each node as a typed NodeState with its History object; every decision equals the one
    plan() gives on the text form a Slurm body reads (stored history text, dict records), and the engine's record
    is never changed by plan(). Covers approval mode, and lemons with incidents days old (AIReSim, 60 days)."""
    from gpufleet_sim.brain import default_brain

    sc = scn.load(val.SCENARIOS / "default-1k.yaml")
    for name in ("passive+auto-repair+hot-spares", "together-approval"):
        pol = resolve(name)
        mode = "approval" if pol["repair"] == "approval" else "automatic"
        checked = _TextChecked(default_brain(sc, mode))
        a = run_one(sc, pol, 1, checked)
        assert a == run_one(sc, pol, 1, default_brain(sc, mode))
        assert checked.checked >= checked.calls["plan"] > 50
    sc = scn.load(val.SCENARIOS / "airesim-default.yaml")
    checked = _TextChecked(default_brain(sc))
    run_one(sc, resolve("passive+auto-repair+hot-spares"), 1, checked, horizon_h=60 * 24.0)
    assert checked.checked > 500


def test_every_repair_decision_is_a_real_plan_call():
    """No cache around the policy: the engine's every decision is one plan() call."""
    from gpufleet_sim.brain import default_brain
    from gpufleet_sim.engine import Sim

    sc = scn.load(val.SCENARIOS / "default-1k.yaml")
    brain = default_brain(sc)
    sim = Sim(sc, resolve("passive+auto-repair+hot-spares"), 2, brain)
    sim.run()
    assert brain.calls["plan"] == sim.stats["brain_calls"] > 0
    assert set(brain.calls) == {"judge", "judge_cached", "plan", "drain_rule"}
    # every drain the agent makes is one call of its drain rule
    assert brain.calls["drain_rule"] == (sim.stats["agent_drains"] + sim.stats["agent_deferred"]
                                         + sim.stats["agent_no_drain"])


def test_user_policy_yaml_and_rack_outage(tmp_path):
    pfile = tmp_path / "mine.yaml"
    pfile.write_text("name: slow-approval\nbase: together-approval\napproval_delay_min: 240\nspares: cold\n")
    r = subprocess.run([sys.executable, "-m", "gpufleet_sim.cli", "run", str(val.SCENARIOS / "default-1k.yaml"),
                        "--seeds", "2", "--policy", str(pfile), "--json", "-"], capture_output=True, text=True,
                       check=False)
    assert r.returncode == 0, r.stderr
    pol = json.loads(r.stdout)["policies"]["slow-approval"]
    assert pol["knobs"] == {"detection": "passive", "repair": "approval", "spares": "cold", "identify": "auto",
                            "jobs": "checkpoint_requeue"}
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nspares: lukewarm\n")
    r = subprocess.run([sys.executable, "-m", "gpufleet_sim.cli", "run", str(val.SCENARIOS / "default-1k.yaml"),
                        "--policy", str(bad)], capture_output=True, text=True, check=False)
    assert r.returncode == 2 and "spares: expected one of ['none', 'cold', 'hot']" in r.stderr
    # a rack (ToR switch) outage interrupts the job once and takes all the rack's job nodes out
    sc = scn.load(val.SCENARIOS / "default-1k.yaml")
    raw = scn.override(sc["raw"], {"faults": [f for f in sc["raw"]["faults"] if f["name"] == "tor_switch"],
                                   "false_positives": {"rate_per_1000_node_days": 0}})
    raw["faults"][0]["rate_per_1000_node_days"] = 20.0
    res = run_one(scn.validate(raw), resolve("passive+auto-repair+hot-spares"), 3)
    assert res["interruptions"] == res["interruptions_by_class"]["tor_switch"] > 0
    assert res["lost_gpu_hours_by_cause"]["waiting"] > 0  # 16 nodes out at once, 9 spares: the job waits


def test_planned_straggler_drain_loses_no_work():
    """A straggler the passive check sees is drained as a planned stop: the job checkpoints on the way out and
    loses no work. (The straggler's rate change and the drain used to interrupt the job twice; the second
    interrupt landed in the exit checkpoint and rolled the job back to its previous checkpoint.)"""
    sc = scn.load(val.SCENARIOS / "default-1k.yaml")
    raw = scn.override(sc["raw"], {"faults": [f for f in sc["raw"]["faults"] if f["name"] == "straggler"],
                                   "false_positives": {"rate_per_1000_node_days": 0}})
    raw["faults"][0].update(visible=1.0, rate_per_1000_node_days=30.0)
    res = run_one(scn.validate(raw), resolve("passive+auto-repair"), 1)
    assert res["interruptions"] > 20  # every episode is seen and drained ...
    assert res["lost_gpu_hours_by_cause"]["lost_work"] == 0.0  # ... each after an exit checkpoint


@pytest.mark.parametrize("assign, message", [
    ({"faults[0].rate_per_1000_node_days": float("inf")}, r"faults\[0\]\.rate_per_1000_node_days: expected a finite"),
    ({"faults[0].rate_per_1000_node_days": float("nan")}, r"faults\[0\]\.rate_per_1000_node_days: expected a finite"),
    ({"horizon_days": float("inf")}, r"horizon_days: expected a finite number"),
    ({"policies": ["reactive-auto", "nope"]}, r"policies\[1\]: unknown policy 'nope'"),
])
def test_scenario_refuses_non_finite_numbers_and_unknown_policies(assign, message):
    raw = scn.load(val.SCENARIOS / "default-1k.yaml")["raw"]
    with pytest.raises(SpecError, match=message):
        scn.validate(scn.override(raw, assign))


def test_straggler_slowdown_must_leave_some_speed():
    raw = scn.load(val.SCENARIOS / "default-1k.yaml")["raw"]
    i = next(i for i, f in enumerate(raw["faults"]) if f.get("effect") == "straggler")
    with pytest.raises(SpecError, match=rf"faults\[{i}\]\.slowdown: expected the share of speed lost"):
        scn.validate(scn.override(raw, {f"faults[{i}].slowdown": 1.0}))
    scn.validate(scn.override(raw, {f"faults[{i}].slowdown": 0.99}))  # control: a crawl is allowed


@pytest.mark.parametrize("param, message", [
    ("jobs[3].nodes", "jobs[3]: index out of range (jobs has 1 entries)"),
    ("jobs[x].nodes", "jobs[x].nodes: expected a dotted field with integer indexes"),
    ("cluster.nodes.x", "cluster.nodes.x: cluster.nodes is not a mapping"),
])
def test_sweep_bad_param_is_one_clear_line(param, message):
    r = subprocess.run([sys.executable, "-m", "gpufleet_sim.cli", "sweep", str(val.SCENARIOS / "default-1k.yaml"),
                        "--param", param, "--values", "1,2", "--seeds", "1"], capture_output=True, text=True,
                       check=False, timeout=120)
    assert r.returncode == 2 and r.stderr.startswith(f"gpufleet-sim: {message}"), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_spares_are_costed_and_counted():
    """Spare nodes cost their GPU-hours over the run; peak demand and an empty pool are reported per seed."""
    sc = scn.load(val.SCENARIOS / "default-1k.yaml")
    r = run_one(sc, resolve("passive+auto-repair+hot-spares"), 1)
    spare_nodes = sc["cluster"]["nodes"] - sum(j["nodes"] for j in sc["jobs"])
    assert r["spare_nodes"] == spare_nodes == 9
    assert r["spare_cost_usd"] == pytest.approx(9 * 8 * r["wall_h"] * sc["spare_cost_per_gpu_hour"])
    assert r["cost_usd"] == pytest.approx(r["lost_gpu_hours"] * sc["price_per_gpu_hour"] + r["spare_cost_usd"])
    assert r["peak_spare_demand"] >= 1 and r["pool_ran_empty"] in (0, 1)
    # with spares to spare the pool never runs dry; with none it always does
    many = run_one(scn.validate(scn.override(sc["raw"], {"cluster.nodes": 116 + 60})), resolve("reactive-auto"), 1)
    none = run_one(scn.validate(scn.override(sc["raw"], {"cluster.nodes": 116})), resolve("reactive-auto"), 1)
    assert many["pool_ran_empty"] == 0 and none["pool_ran_empty"] == 1
    free = scn.validate(scn.override(sc["raw"], {"spare_cost_per_gpu_hour": 0}))
    assert run_one(free, resolve("reactive-auto"), 1)["spare_cost_usd"] == 0


def test_paired_comparison_and_explanation():
    """Policies meet the same faults per seed, so their difference is measured per seed; the report says in words
    why each policy ends where it does."""
    from gpufleet_sim.report import explain, public_json

    sc = scn.load(val.SCENARIOS / "default-1k.yaml")
    res = run_scenario(sc, ["reactive-manual", "passive+auto-repair+hot-spares"], seeds=3)
    d = res["paired"]["policies"]["passive+auto-repair+hot-spares"]
    a = [r["ettr"] for r in res["per_seed"]["passive+auto-repair+hot-spares"]]
    b = [r["ettr"] for r in res["per_seed"]["reactive-manual"]]
    assert d["ettr"]["mean"] == pytest.approx(sum(x - y for x, y in zip(a, b)) / 3)
    assert res["paired"]["baseline"] == "reactive-manual" and public_json(res)["paired"] == res["paired"]
    text = dict(explain(res))
    assert "Against passive+auto-repair+hot-spares, seed by seed" in text["reactive-manual"]
    assert "it loses" in text["reactive-manual"] and "detection + finding the node" in text["reactive-manual"]
    assert "it wins" in text["passive+auto-repair+hot-spares"]


def test_spares_command_finds_the_cheapest(tmp_path):
    r = subprocess.run([sys.executable, "-m", "gpufleet_sim.cli", "spares", str(val.SCENARIOS / "default-1k.yaml"),
                        "--seeds", "2", "--spares", "0,9", "--policy", "reactive-auto", "--jobs", "1",
                        "--no-sensitivity", "--json", "-"], capture_output=True, text=True, check=False, timeout=300)
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["best"]["policy"] == "reactive-auto" and j["best"]["spares"] == 9  # no spares: the job waits for repairs
    # two seeds show the sign, not its certainty: a job without spares waits for approved replacements
    extra = j["runner_up"]["extra_cost_usd_paired"]
    assert j["runner_up"]["spares"] == 0 and extra["mean"] > 0 and extra["ci95"][0] < extra["mean"] < extra["ci95"][1]
    bad = subprocess.run([sys.executable, "-m", "gpufleet_sim.cli", "spares", str(val.SCENARIOS / "default-1k.yaml"),
                          "--spares", "2,x"], capture_output=True, text=True, check=False, timeout=60)
    assert bad.returncode == 2 and "--spares: expected comma-separated whole numbers" in bad.stderr


def test_false_positives_drain_healthy_nodes_without_losing_work():
    """A passive check that calls a healthy node sick drains it: the job checkpoints out (no lost work), the node
    goes through one repair step and comes back. Only passive detection raises them."""
    sc = scn.load(val.SCENARIOS / "default-1k.yaml")
    raw = scn.override(sc["raw"], {"faults": [f for f in sc["raw"]["faults"] if f["name"] == "tor_switch"],
                                   "false_positives": {"rate_per_1000_node_days": 50}})
    raw["faults"][0]["rate_per_1000_node_days"] = 0.0
    s2 = scn.validate(raw)
    res = run_one(s2, resolve("passive+auto-repair+hot-spares"), 1)
    n = res["interruptions_by_class"]["false_positive"]
    assert n == res["planned_interruptions_by_class"]["false_positive"] > 50  # all planned drains
    assert res["false_positives"] >= n and res["crashes"] == 0
    assert res["lost_gpu_hours_by_cause"]["lost_work"] == 0.0
    acts = res["repair_actions"]  # the ladder starts at a GPU reset (a node drained often enough is a lemon)
    assert max(acts, key=acts.get) == "reset_gpu" and acts["reset_gpu"] >= 0.9 * res["repairs"]
    reactive = run_one(s2, resolve("reactive-auto"), 1)
    assert reactive["false_positives"] == 0 and reactive["interruptions"] == 0
    with pytest.raises(SpecError, match=r"false_positives\.rate_per_1000_node_days: expected a value >= 0"):
        scn.validate(scn.override(raw, {"false_positives": {"rate_per_1000_node_days": -1}}))


def test_technicians_are_a_queue():
    """With one technician, hands-on repairs wait for each other; with as many as needed nobody waits. The same
    seed meets the same faults, so fewer hands can only make nodes come back later."""
    sc = scn.load(val.SCENARIOS / "default-1k.yaml")
    pol = resolve("reactive-manual")  # every step by hand
    many = run_one(sc, pol, 2)
    one = run_one(scn.validate(scn.override(sc["raw"], {"repair.technicians": 1})), pol, 2)
    assert many["technician_wait_hours"] == 0.0
    assert one["technician_wait_hours"] > 0 and one["mttr_hours"] > many["mttr_hours"]
    with pytest.raises(SpecError, match=r"repair\.technicians: expected an integer >= 1"):
        scn.validate(scn.override(sc["raw"], {"repair.technicians": 0}))


def test_frontier_scenario_runs_at_a_sensible_operating_point():
    sc = scn.load(val.SCENARIOS / "frontier-100k.yaml")
    assert sc["cluster"]["nodes"] * sc["cluster"]["gpus_per_node"] == 100_000
    r = run_one(sc, resolve("passive+auto-repair+hot-spares"), 1, horizon_h=48.0)
    assert r["interruptions"] > 50 and r["ettr"] > 0.6  # a blocking save every Young interval would give ~0.06


def test_million_gpu_scenario_runs_at_a_sensible_operating_point():
    """frontier-1m (the million-GPU benchmark case): ten frontier jobs train most of the time and the spare pool
    holds; the same fleet as one synchronous job (the header's reason for ten) hardly trains."""
    sc = scn.load(val.SCENARIOS / "frontier-1m.yaml")
    assert sc["cluster"]["nodes"] * sc["cluster"]["gpus_per_node"] == 1_000_000
    assert [j["nodes"] for j in sc["jobs"]] == [12_000] * 10
    pol = resolve("passive+auto-repair+hot-spares")
    r = run_one(sc, pol, 1, horizon_h=24.0)
    assert r["interruptions"] > 300 and r["ettr"] > 0.6 and r["pool_ran_empty"] == 0
    one = scn.override(sc["raw"], {"jobs": [dict(sc["raw"]["jobs"][0], nodes=120_000)]})
    r1 = run_one(scn.validate(one), pol, 1, horizon_h=24.0)
    assert r1["ettr"] < 0.2, r1["ettr"]


@pytest.mark.slow  # a fresh interpreter runs two seeds and renders the PNG report (~2 s)
def test_one_policy_run_has_a_report(tmp_path):
    r = subprocess.run([sys.executable, "-m", "gpufleet_sim.cli", "run", str(val.SCENARIOS / "default-1k.yaml"),
                        "--seeds", "2", "--policy", "reactive-auto", "--out", str(tmp_path)], capture_output=True,
                       text=True, check=False, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "reactive-auto: trains" in r.stdout


@pytest.mark.slow
def test_spares_warns_when_an_estimate_moves_the_cheapest_count(tmp_path):
    """`spares` searches the spare count again at both ends of each estimate's range and names the estimate and the
    value where another count is cheapest (issue: the spare count, not only the policy, may hang on a guess)."""
    import yaml

    raw = scn.load(val.SCENARIOS / "default-1k.yaml")["raw"]
    raw["estimates"] = [{"path": "spare_cost_per_gpu_hour", "low": 0.5, "high": 500,
                         "source": "estimate; a test range, from a spare idle for free to one at 500 $ an hour"}]
    path = tmp_path / "one-estimate.yaml"
    path.write_text(yaml.safe_dump(raw))
    cmd = [sys.executable, "-m", "gpufleet_sim.cli", "spares", str(path), "--seeds", "2", "--spares", "0,9",
           "--policy", "reactive-auto", "--jobs", "1"]
    r = subprocess.run(cmd + ["--json", str(tmp_path / "out.json")], capture_output=True, text=True, check=False,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    j = json.loads((tmp_path / "out.json").read_text())
    assert j["best"]["spares"] == 9
    # at 500 $ a spare GPU-hour nine idle nodes cost 500 x 72 x 24 x 30 = 26 M$ a month: none is cheaper; at 0.5 $ the
    # count holds
    assert j["spare_flips"] == [{"input": "spare_cost_per_gpu_hour", "end": "high", "value": 500, "spares": 0,
                                 "certain": True}], j["spare_flips"]
    assert ("WARNING: the recommended spare count flips: 0 spare nodes cost less than 9 for reactive-auto at "
            "spare_cost_per_gpu_hour = 500, inside the plausible range") in r.stdout, r.stdout
    quiet = subprocess.run(cmd + ["--no-sensitivity", "--json", "-"], capture_output=True, text=True, check=False,
                           timeout=300)
    assert quiet.returncode == 0 and "spare_flips" not in json.loads(quiet.stdout), quiet.stderr
