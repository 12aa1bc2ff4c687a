"""gpufleet-sim sensitivity: each estimate at the ends of its plausible range, the recommended policy's lead over its
closest rival paired by seed, the two inputs that move it most together, and a flip named when another policy does
better inside a range. Bad estimates are refused naming the field."""

import pytest

from gpufleet_sim import scenario as scn
from gpufleet_sim import validate as val
from gpufleet_sim.dists import SpecError
from gpufleet_sim.policies import resolve
from gpufleet_sim.sensitivity import run_sensitivity, text

FP = "false_positives.rate_per_1000_node_days"


def scenario(estimates, days=10, **over):
    raw = scn.load(val.SCENARIOS / "default-1k.yaml")["raw"]
    return scn.validate(scn.override(raw, {"horizon_days": days, "estimates": estimates, **over}))


# passive checks against reactive detection, every other knob the same (hot spares, automatic repair)
PASSIVE, REACTIVE = resolve("passive+auto-repair+hot-spares"), resolve(
    {"name": "reactive+hot-spares", "base": "passive+auto-repair+hot-spares", "detection": "reactive"})


@pytest.mark.slow
def test_false_alarms_at_the_high_end_flip_passive_checks_and_the_warning_names_the_input():
    # as shipped here no check ever drains a healthy node and fail-slow GPUs stay slow for days until a check sees
    # them, so passive checks are clearly recommended; at 400 false alarms per 1,000 node-days (a drain every half
    # hour on 125 nodes, each restarting the 116-node job) they lose, surely
    raw = scn.load(val.SCENARIOS / "default-1k.yaml")["raw"]
    slow = scn.resolve_names(raw, "faults[straggler]", "test")
    sc = scenario([{"path": FP, "low": 0, "high": 400, "source": "test range: a detector that cries wolf"}],
                  days=5, **{FP: 0, f"{slow}.visible": 1.0,
                             f"{slow}.episode_min": {"dist": "uniform", "low": 1440, "high": 4320}})
    res = run_sensitivity(sc, [PASSIVE, REACTIVE], seeds=8)
    assert res["recommended"] == PASSIVE["name"] and res["as_shipped"]["ettr"]["ci95"][0] > 0, res["as_shipped"]
    fp = res["inputs"][0]
    assert fp["at_high"]["best"] == REACTIVE["name"] and fp["at_high"]["ettr"]["ci95"][1] < 0, fp
    assert res["flips"] == [{"input": FP, "end": "high", "value": 400, "best": REACTIVE["name"], "certain": True}]
    out = text(res)
    assert f"WARNING: the recommendation flips: {REACTIVE['name']} does better than {PASSIVE['name']} at {FP} = 400," \
           in out and "test range: a detector that cries wolf" in out


def test_the_two_inputs_that_move_the_lead_most_are_varied_together_and_a_holding_answer_says_so():
    sc = scenario([{"path": "repair.cold_swap_min", "low": 10, "high": 20, "source": "test range"},
                   {"path": "faults[straggler].visible", "low": 0.5, "high": 0.7, "source": "test range"},
                   {"path": "faults[straggler].slowdown", "low": 0.2, "high": 0.3, "source": "test range"}], days=4)
    res = run_sensitivity(sc, [resolve("reactive-manual"), PASSIVE], seeds=2)
    assert res["recommended"] == PASSIVE["name"] and res["flips"] == []
    swings = [r["swing"] for r in res["inputs"]]
    assert swings == sorted(swings, reverse=True)
    top = [r["path"] for r in res["inputs"][:2]]
    assert [list(t["values"]) for t in res["together"]] == [top] * 4
    assert [list(t["values"].values()) for t in res["together"]] == [["low", "low"], ["low", "high"],
                                                                     ["high", "low"], ["high", "high"]]
    assert "stays the best policy over every estimate's plausible range" in text(res)


@pytest.mark.parametrize("estimates, match", [
    ([{"path": FP, "low": 0, "high": 1}], r"estimates\[0\]\.source: required field is missing"),
    ([{"path": FP, "low": 0, "source": "x"}], r"estimates\[0\]\.high: required field is missing"),
    ([{"path": FP, "low": 0, "high": 1, "source": "x", "guess": 2}],
     r"estimates\[0\]: unknown key\(s\) guess; expected some of high, low, path, source"),
    ("all of them", r"estimates: expected a list"),
])
def test_bad_estimates_name_the_field(estimates, match):
    with pytest.raises(SpecError, match=match):
        scenario(estimates)


def test_a_range_end_the_scenario_refuses_is_named_before_anything_runs():
    sc = scenario([{"path": "faults[straggler].visible", "low": 0, "high": 2, "source": "x"}])
    with pytest.raises(SpecError, match=r"sensitivity: faults\[straggler\]\.visible = high"):
        run_sensitivity(sc, [resolve("reactive-auto")], seeds=1)
    sc = scenario([{"path": "faults[nope].visible", "low": 0, "high": 1, "source": "x"}])
    with pytest.raises(SpecError, match=r"estimates\[0\]\.path: no faults entry named 'nope'"):
        run_sensitivity(sc, [resolve("reactive-auto")], seeds=1)


def test_a_scenario_derived_with_other_faults_stays_valid():
    """The shipped estimates name the straggler fault; an override that keeps other faults is still a scenario."""
    raw = scn.load(val.SCENARIOS / "default-1k.yaml")["raw"]
    sc = scn.validate(scn.override(raw, {"faults": [raw["faults"][0]]}))
    assert [f["name"] for f in sc["faults"]] == [raw["faults"][0]["name"]] and sc["estimates"]
    with pytest.raises(SpecError, match="no estimates: section"):
        run_sensitivity(scenario(None), [resolve("reactive-auto")], seeds=1)


def test_the_tornado_plot_and_page_show_each_estimate_between_its_ends(tmp_path):
    """--out: the table as text, a tornado plot (a PNG) and a page with both; written from a result, no run."""
    from gpufleet_sim.sensitivity import write_all

    def lead(mean):
        return {"mean": mean, "ci95": [mean - 0.004, mean + 0.004]}

    shipped = {"best": "a", "rival": "b", "ettr": lead(0.01)}
    res = {"scenario": "t", "seeds": 4, "recommended": "a", "as_shipped": shipped,
           "inputs": [{"path": "x.rate", "source": "estimate", "low": 0, "high": 9, "swing": 0.03,
                       "at_low": {"best": "a", "rival": "b", "ettr": lead(0.02)},
                       "at_high": {"best": "b", "rival": "b", "ettr": lead(-0.01)}},
                      {"path": "y.minutes", "source": "estimate", "low": 5, "high": 60, "swing": 0.0,
                       "at_low": {"best": "a", "rival": "b", "ettr": lead(0.01)},
                       "at_high": {"best": "a", "rival": "b", "ettr": lead(0.01)}}],
           "together": [], "flips": [{"input": "x.rate", "end": "high", "value": 9, "best": "b", "certain": True}]}
    files = write_all(res, tmp_path / "out")
    assert files["tornado"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and files["tornado"].stat().st_size > 5000
    page = files["html"].read_text()
    assert "<img src=tornado.png" in page and "WARNING: the recommendation flips: b does better than a" in page
    assert files["text"].read_text().startswith("t: recommended as shipped: a")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["sensitivity.html", "sensitivity.txt",
                                                                    "tornado.png"]


def test_run_itself_says_whether_the_answer_holds_over_the_estimates(tmp_path):
    """`gpufleet-sim run` on a scenario with estimates runs them at the ends of their ranges (the same policies and
    seeds) and prints each flip by input and value, or that the answer holds; --no-sensitivity skips it."""
    import html
    import json
    import subprocess
    import sys

    argv = [sys.executable, "-m", "gpufleet_sim.cli", "run", str(val.SCENARIOS / "default-1k.yaml"), "--seeds", "2",
            "--no-effects", "--policy", "passive+auto-repair+hot-spares", "together-approval"]
    r = subprocess.run(argv + ["--out", str(tmp_path / "out"), "--json", str(tmp_path / "r.json")],
                       capture_output=True, text=True, check=False, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "This answer rests on 4 estimates (false_positives.rate_per_1000_node_days, " in r.stdout, r.stdout
    sens = json.loads((tmp_path / "r.json").read_text())["sensitivity"]
    said = [ln for ln in r.stdout.splitlines() if ln.startswith("WARNING: the recommendation flips")
            or "stays the best policy over every estimate's plausible range" in ln]
    assert len(said) == max(1, len(sens["flips"])), r.stdout
    for flip in sens["flips"]:
        assert any(flip["input"] in ln for ln in said), (flip, said)
    assert (tmp_path / "out" / "tornado.png").exists() and (tmp_path / "out" / "sensitivity.html").exists()
    report = (tmp_path / "out" / "report.html").read_text()  # the tornado plot and the verdict inside the report
    assert "Does the answer survive the scenario's estimates?" in report and '<img src="tornado.png"' in report
    assert "false_positives.rate_per_1000_node_days" in report.split("This answer rests on estimates (", 1)[1]
    assert all(html.escape(ln) in report for ln in said), said
    quiet = subprocess.run(argv + ["--no-sensitivity"], capture_output=True, text=True, check=False, timeout=600)
    assert quiet.returncode == 0 and "This answer rests on" not in quiet.stdout, quiet.stderr
