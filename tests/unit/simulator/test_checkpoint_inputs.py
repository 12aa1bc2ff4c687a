# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The checkpoint inputs say what they mean: a free checkpoint is a continuous one whatever the interval rule, an
interval of 0 (in memory every step) never costs minutes, and the MTBF behind Young's and Daly's intervals counts
only the faults that lose work (a straggler slows the job, it does not roll it back)."""
from __future__ import annotations

import copy
import math

import pytest
import yaml

from gpufleet_sim import scenario as scn
from gpufleet_sim import validate as val
from gpufleet_sim.brain import default_brain
from gpufleet_sim.dists import SpecError
from gpufleet_sim.engine import H, Sim, young
from gpufleet_sim.policies import resolve

SC = scn.load(val.SCENARIOS / "default-1k.yaml")


def sim_with(job_over=None, faults=None):
    sc = copy.deepcopy(SC)
    sc["jobs"][0].update(job_over or {})
    if faults is not None:
        sc["faults"] = [f for f in sc["faults"] if faults(f)]
    return Sim(sc, resolve("reactive-auto"), 1, default_brain(sc))


@pytest.mark.parametrize("rule", ["young", "daly"])
def test_a_free_checkpoint_is_continuous_whatever_the_interval_rule(rule):
    job = sim_with({"checkpoint_interval_min": rule, "checkpoint_cost_min": 0.0}).jobs[0]
    # before: a 1-hour interval, so a free checkpoint did worse than a cheap one
    assert job.continuous and job.tau == math.inf
    cheap = sim_with({"checkpoint_interval_min": rule, "checkpoint_cost_min": 0.5}).jobs[0]
    assert not cheap.continuous and 0 < cheap.tau < math.inf


def test_an_interval_of_zero_with_a_cost_is_refused(tmp_path):
    data = yaml.safe_load((val.SCENARIOS / "default-1k.yaml").read_text())
    data["jobs"][0]["checkpoint_interval_min"] = 0
    data["jobs"][0]["checkpoint_cost_min"] = 5
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError, match=r"jobs\[0\]\.checkpoint_interval_min: 0 means an in-memory checkpoint every "
                                        r"step, free; with checkpoint_cost_min 5"):
        scn.load(p)
    data["jobs"][0]["checkpoint_cost_min"] = 0
    p.write_text(yaml.safe_dump(data))
    assert scn.load(p)["jobs"][0]["checkpoint_interval_min"] == 0


def test_the_checkpoint_mtbf_counts_only_faults_that_lose_work():
    sim = sim_with({"checkpoint_interval_min": "young"})
    stragglers = [f for f in sim.sc["faults"] if f["effect"] == "straggler"]
    assert stragglers, "default-1k has a straggler class"
    without = sim_with({"checkpoint_interval_min": "young"}, faults=lambda f: f["effect"] != "straggler")
    spec = sim.jobs[0].spec
    assert without.job_rate(spec) > 0 and sim.job_rate(spec) == pytest.approx(without.job_rate(spec))
    assert sim.jobs[0].tau == pytest.approx(young(spec["checkpoint_cost_min"] * H, 1.0 / sim.job_rate(spec)))
    # only stragglers: nothing loses work, so no checkpoint is worth its cost
    only = sim_with({"checkpoint_interval_min": "young"}, faults=lambda f: f["effect"] == "straggler")
    assert only.job_rate(spec) == 0 and only.jobs[0].tau == math.inf
