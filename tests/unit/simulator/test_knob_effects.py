"""Each knob's own effect (the simulator's decision honesty): around a policy, one knob changed at a time on the same
seeds, every other knob held, so passive checks are never credited with what hot spares win."""

import json
import os
import subprocess
import sys

import pytest
import yaml

from gpufleet_sim import scenario as scn
from gpufleet_sim import validate as val
from gpufleet_sim.policies import resolve
from gpufleet_sim.report import effects_text, public_json
from gpufleet_sim.runner import knob_effects, run_one, run_scenario


@pytest.fixture(scope="module")
def short():
    raw = scn.load(val.SCENARIOS / "default-1k.yaml")["raw"]
    return scn.validate(scn.override(raw, {"horizon_days": 6}))


def effects_around(sc, name, seeds=2):
    res = run_scenario(sc, [name], seeds=seeds)
    return res, knob_effects(sc, resolve(name), res["per_seed"][name])


def test_every_other_level_of_every_knob_once_and_the_sign_is_anchor_minus_other(short):
    _res, eff = effects_around(short, "passive+auto-repair+hot-spares")
    assert eff["anchor"] == "passive+auto-repair+hot-spares" and eff["seeds"] == 2
    assert [(e["knob"], e["anchor_level"], e["other_level"]) for e in eff["effects"]] == [
        ("detection", "passive", "reactive"), ("spares", "hot", "none"), ("spares", "hot", "cold"),
        ("repair", "auto", "manual"), ("repair", "auto", "approval"),
        ("jobs", "checkpoint_requeue", "wait"), ("jobs", "checkpoint_requeue", "requeue")]
    # the detection row, recomputed seed by seed: anchor minus the same policy with reactive detection
    anchor = resolve("passive+auto-repair+hot-spares")
    other = dict(anchor, detection="reactive", name="x")
    diffs = [run_one(short, anchor, s)["ettr"] - run_one(short, other, s)["ettr"] for s in (1, 2)]
    assert eff["effects"][0]["ettr"]["mean"] == pytest.approx(sum(diffs) / 2)
    # hot spares against none: a job with no spare waits for its own node's repair
    spares_none = eff["effects"][1]
    assert spares_none["ettr"]["mean"] > 0 and spares_none["lost_gpu_hours"]["mean"] < 0


def test_the_passive_sentence_is_passive_minus_reactive_whichever_the_anchor_has(short):
    _res, eff = effects_around(short, "passive+auto-repair+hot-spares")
    text = "\n".join(effects_text(eff))
    assert "Passive health checks themselves (against reactive detection, with spares hot, repair auto, jobs " \
           "checkpoint_requeue as in passive+auto-repair+hot-spares)" in text
    p = eff["effects"][0]["ettr"]["mean"] * 100
    assert f"ETTR {p:+,.1f} pts" in text.splitlines()[-1]
    _res, eff_r = effects_around(short, "reactive-auto")
    r = eff_r["effects"][0]
    assert (r["anchor_level"], r["other_level"]) == ("reactive", "passive")
    line = effects_text(eff_r)[-1]
    assert f"ETTR {-r['ettr']['mean'] * 100:+,.1f} pts" in line  # negated: passive minus reactive
    assert "spares cold, repair auto, jobs checkpoint_requeue as in reactive-auto" in line


def test_one_seed_says_so_and_the_json_carries_the_effects(short):
    res, eff = effects_around(short, "passive+auto-repair", seeds=1)
    assert effects_text(eff)[-1].endswith("one seed: run more seeds to know.")
    res["knob_effects"] = eff
    j = json.loads(json.dumps(public_json(res), default=float))
    assert [e["other_level"] for e in j["knob_effects"]["effects"]][:1] == ["reactive"]


@pytest.mark.slow
def test_run_prints_the_effects_by_default_and_not_with_no_effects(tmp_path):
    code = "import sys; from gpufleet_sim.cli import main; sys.exit(main(sys.argv[1:]))"
    scen = tmp_path / "s.yaml"
    raw = scn.load(val.SCENARIOS / "default-1k.yaml")["raw"]
    scen.write_text(yaml.safe_dump(dict(raw, horizon_days=3)))
    args = [sys.executable, "-c", code, "run", str(scen), "--seeds", "1", "--policy", "reactive-auto",
            "passive+auto-repair+hot-spares"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run(args, capture_output=True, text=True, timeout=600, check=False, env=env)
    assert r.returncode == 0, r.stderr
    assert "Each knob's own effect, around" in r.stdout and "Passive health checks themselves" in r.stdout
    r = subprocess.run(args + ["--no-effects"], capture_output=True, text=True, timeout=600, check=False, env=env)
    assert r.returncode == 0 and "Each knob's own effect" not in r.stdout, r.stderr


def test_the_full_design_gives_each_knob_its_main_effect_over_every_other_setting(short):
    """factorial_effects runs all 54 combinations on the same seeds; a main effect is, seed by seed, the mean over the
    other knobs' combinations of (level - first level). Recomputed here from plain run_one() calls for one level."""
    import itertools

    from gpufleet_sim.report import factorial_text
    from gpufleet_sim.runner import EFFECT_KNOBS, factorial_effects

    fx = factorial_effects(short, 2)
    assert fx["cells"] == 2 * 3 * 3 * 3 and fx["seeds"] == 2
    assert [(e["knob"], e["level"], e["vs"]) for e in fx["effects"]] == [
        ("detection", "passive", "reactive"), ("spares", "cold", "none"), ("spares", "hot", "none"),
        ("repair", "auto", "manual"), ("repair", "approval", "manual"), ("jobs", "requeue", "wait"),
        ("jobs", "checkpoint_requeue", "wait")]
    # detection: passive minus reactive, averaged over the 27 settings of the others, seed by seed
    per_seed = []
    for seed in (1, 2):
        diffs = []
        for spares, repair, jobs in itertools.product(("none", "cold", "hot"), ("manual", "auto", "approval"),
                                                      ("wait", "requeue", "checkpoint_requeue")):
            pol = {"spares": spares, "repair": repair, "jobs": jobs, "identify": "auto"}
            ettr = {d: run_one(short, dict(pol, detection=d, name=d, label=d), seed)["ettr"]
                    for d in ("passive", "reactive")}
            diffs.append(ettr["passive"] - ettr["reactive"])
        per_seed.append(sum(diffs) / len(diffs))
    assert fx["effects"][0]["ettr"]["mean"] == pytest.approx(sum(per_seed) / 2, abs=1e-12)
    assert set(fx["best"]) == set(EFFECT_KNOBS) | {"ettr"}
    text = "\n".join(factorial_text(fx))
    assert "Passive health checks, averaged over every spares, repair and job-action setting" in text


def test_run_has_the_full_design_by_default_when_it_is_small(tmp_path):
    cmd = [sys.executable, "-m", "gpufleet_sim.cli", "run", "--seeds", "1", "--no-effects", "--no-sensitivity"]
    r = subprocess.run(cmd + [str(val.SCENARIOS / "default-1k.yaml"), "--json", str(tmp_path / "a.json")],
                       capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stderr
    assert "The full design (54 combinations" in r.stdout
    assert json.loads((tmp_path / "a.json").read_text())["factorial"]["cells"] == 54
    r = subprocess.run(cmd + [str(val.SCENARIOS / "default-1k.yaml"), "--factorial", "off"], capture_output=True,
                       text=True, timeout=600, check=False)
    assert r.returncode == 0 and "The full design" not in r.stdout, r.stderr
    r = subprocess.run(cmd + [str(val.SCENARIOS / "airesim-default.yaml")], capture_output=True, text=True,
                       timeout=600, check=False)
    assert r.returncode == 0 and "The full design" not in r.stdout, r.stderr
    assert "--factorial on runs it" in r.stderr
