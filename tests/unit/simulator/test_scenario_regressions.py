# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Scenario loader regressions found by the fuzz campaign (tests/fuzz): one clear SpecError line each."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpufleet_sim import scenario
from gpufleet_sim.dists import SpecError

DALY = Path(__file__).resolve().parents[3] / "simulator" / "scenarios" / "daly.yaml"


def _load(tmp_path, data: bytes):
    p = tmp_path / "s.yaml"
    p.write_bytes(data)
    with pytest.raises(SpecError) as exc:
        scenario.load(p)
    msg = str(exc.value)
    assert "\n" not in msg.split("not valid YAML:", maxsplit=1)[0]
    return msg


def test_not_utf8(tmp_path):
    # was UnicodeDecodeError
    assert "not UTF-8" in _load(tmp_path, b"\xaf")


def test_deep_nesting(tmp_path):
    # was RecursionError (and seconds of quadratic scanning for 5000 levels)
    assert "not valid YAML" in _load(tmp_path, b"a: " + b"{a: " * 5000)
    assert "not valid YAML" in _load(tmp_path, b"a: " + b"[" * 100000)


def test_integer_too_long(tmp_path):
    # was ValueError: Exceeds the limit (4300 digits) for integer string conversion
    assert "not valid YAML" in _load(tmp_path, b"seeds: " + b"2" * 5000 + b"\n")


def test_repair_action_not_a_mapping_names_the_field(tmp_path):
    # was ValueError: dictionary update sequence element #0 has length 1; 2 is required
    raw = yaml.safe_load(DALY.read_text(encoding="utf-8"))
    raw["repair"]["actions"] = {"reboot": ["x"]}
    msg = _load(tmp_path, yaml.safe_dump(raw).encode())
    assert "repair.actions.reboot" in msg and "mapping" in msg


def test_genuine_scenario_still_loads():
    assert scenario.load(DALY)["jobs"][0]["name"] == "solver"


def test_duration_dist_not_a_name_names_the_field(tmp_path):
    # fuzz finding (full campaign): dist: {..} was TypeError: unhashable type: 'dict'
    raw = yaml.safe_load(DALY.read_text(encoding="utf-8"))
    raw["repair"]["hot_swap_min"] = {"dist": {"x": 1}}
    msg = _load(tmp_path, yaml.safe_dump(raw).encode())
    assert "repair.hot_swap_min.dist" in msg


@pytest.mark.parametrize("edit, field", [
    (lambda raw: raw.update({True: 1, "x": 2}), "unknown key"),  # was TypeError in sorted()
    (lambda raw: raw["jobs"][0].__setitem__("checkpoint_cost_min", 10 ** 400), "checkpoint_cost_min"),  # OverflowError
    (lambda raw: raw["repair"].__setitem__("hot_swap_min", {"dist": "lognormal", "median": 1e-300, "p90": 1e300}),
     "hot_swap_min"),                                                                   # math range error
    (lambda raw: raw["repair"].__setitem__("hot_swap_min", {"dist": "weibull", "shape": 1e-5, "scale": 5}),
     "hot_swap_min"),
    (lambda raw: raw["repair"].__setitem__("hot_swap_min", 10 ** 400), "hot_swap_min"),
])
def test_numbers_out_of_range_name_the_field(tmp_path, edit, field):
    # fuzz findings (full campaign, inputs 52,656 to 100,000)
    raw = yaml.safe_load(DALY.read_text(encoding="utf-8"))
    edit(raw)
    assert field in _load(tmp_path, yaml.safe_dump(raw).encode())


@pytest.mark.parametrize("old, new, field", [
    ("checkpoint_cost_min: 5", "checkpoint_cost_min: 0x" + "f" * 4000, "checkpoint_cost_min"),
    ("  business_hours: null", "  business_hours: null\n  hot_swap_min: 0x" + "f" * 4000, "hot_swap_min"),
])
def test_integer_of_more_than_4300_digits_in_the_message(tmp_path, old, new, field):
    # fuzz finding (third scenario run): the error message's repr() of the number raised ValueError
    text = DALY.read_text(encoding="utf-8")
    assert old in text
    msg = _load(tmp_path, text.replace(old, new).encode())
    assert field in msg and "an integer of" in msg


def test_airesim_mechanics_are_scenario_options_that_are_checked():
    """AIReSim's repair shape (a second stage for a share of the steps), its stage-dependent cure and its warm
    standbys: each is validated by name, and a run with them keeps the standby list as AIReSim does (first in,
    first out; refilled by repaired nodes, never beyond its size)."""
    from gpufleet_sim import validate as val
    from gpufleet_sim.brain import default_brain
    from gpufleet_sim.engine import Sim
    from gpufleet_sim.policies import resolve

    scn = scenario
    raw = scn.load(val.SCENARIOS / "airesim-default.yaml")["raw"]
    for path, bad, match in (("jobs[0].standbys", -1, "standbys: expected an integer >= 0"),
                             ("repair.actions.reboot.then", {"probability": 2, "duration_min": 5}, "probability"),
                             ("repair.actions.reboot.then", {"chance": 0.5}, "unknown"),
                             ("lemons.cure_probability_then", 1.5, "cure_probability_then")):
        with pytest.raises(SpecError, match=match):
            scn.validate(scn.override(raw, {path: bad}))
    sc = scn.validate(scn.override(raw, {"horizon_days": 20}))
    assert sc["jobs"][0]["standbys"] == 16 and sc["repair"]["actions"]["reboot"]["then"]["probability"] == 0.8
    sim = Sim(sc, resolve("passive+auto-repair+hot-spares"), 1, default_brain(sc))
    job = sim.jobs[0]
    first = list(job.standby)
    assert len(first) == 16 and all(sim.owner[n] == -1 for n in first)
    sim.run()
    assert len(job.standby) <= 16 and len(set(job.standby)) == len(job.standby)
    assert all(sim.owner[n] == -1 for n in job.standby)  # standbys are idle nodes kept for the job
    assert set(first) - set(job.standby)  # the first ones were taken in; repaired nodes took their places
