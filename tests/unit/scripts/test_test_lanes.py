# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""scripts/test_lanes.py reads the counts of each pytest step from its closing line: a lost or miscounted lane must
show in make test's table."""
from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

from support.labs import dealt_away

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "test_lanes.py"
spec = importlib.util.spec_from_file_location("test_lanes", SCRIPT)
lanes = importlib.util.module_from_spec(spec)
sys.modules["test_lanes"] = lanes  # dataclasses look their module up there
spec.loader.exec_module(lanes)


def test_closing_lines_with_and_without_decoration():
    assert lanes.pytest_counts("....\n1 failed, 92 passed, 23 warnings in 1351.12s (0:22:31)\nmake: *** Error 1") == {
        "failed": 1, "passed": 92}
    assert lanes.pytest_counts("===== 1293 passed, 2 skipped in 25.70s =====") == {"passed": 1293, "skipped": 2}
    assert lanes.pytest_counts("= 3 errors, 1 deselected in 1.0s =") == {"errors": 3, "deselected": 1}


def test_the_last_closing_line_counts_and_other_lines_do_not():
    text = "12 passed in 1.0s\nthe test said: 99 passed in 3s is fake\n4 failed, 8 passed in 2.0s\n"
    assert lanes.pytest_counts(text) == {"failed": 4, "passed": 8}
    assert lanes.pytest_counts("no pytest here\n") == {}
    assert lanes.pytest_counts("no tests ran in 0.10s") == {}


def test_every_lane_names_make_targets_that_exist():
    makefile = (SCRIPT.parents[1] / "Makefile").read_text()
    for steps in lanes.LANES.values():
        for target in steps:
            assert f"\n{target}:" in makefile, target


def test_the_slurm_lanes_deal_the_scenarios_between_them_and_both_run_the_rest():
    ids = [(f"tests/integration/repair/test_x.py::test_{i}", 1.0) for i in range(7)]
    names = {t for t, _w in ids}
    shares = [v["LAB_SHARE"] for k, v in lanes.LANE_ENV.items() if k.startswith("slurm-")]
    assert sorted(shares) == ["1/2", "2/2"]
    kept = [names - dealt_away(ids, s) for s in shares]
    assert kept[0].isdisjoint(kept[1]) and kept[0] | kept[1] == names  # each scenario once, on one release
    assert {len(k) for k in kept} == {3, 4}
    assert dealt_away(ids, "") == set() and dealt_away(ids, "1/1") == set()
    for bad in ("3/2", "0/2", "1/0", "1/2 ", "half", "-1/2"):
        with pytest.raises(ValueError, match=r"LAB_SHARE: expected K/N.*" + re.escape(repr(bad))):
            dealt_away(ids, bad)


def test_the_heaviest_scenarios_go_to_different_lanes_and_the_loads_stay_close():
    """Dealt in turn, the two heaviest scenarios (the loop lab's and the repair lab's reset -> reboot, about three
    typical ones each) once fell to the same lane, which then ran 4.6 minutes longer than the other."""
    ids = [("a::light1", 1.0), ("b::heavy1", 3.0), ("c::light2", 1.0), ("d::heavy2", 3.0), ("e::mid", 2.0),
           ("f::light3", 1.0), ("g::light4", 1.0)]
    weight = dict(ids)
    loads = []
    for share in ("1/2", "2/2"):
        kept = {t for t, _w in ids} - dealt_away(ids, share)
        assert len({"b::heavy1", "d::heavy2"} & kept) == 1, kept
        loads.append(sum(weight[t] for t in kept))
    assert abs(loads[0] - loads[1]) <= 3.0 and sum(loads) == 12.0
    # the deal itself: heaviest first, each to the lighter share, a tie to the first share, equal weights in order
    assert dealt_away(ids, "2/2") == {"b::heavy1", "e::mid", "f::light3"}


def test_a_lane_passes_its_environment_to_its_steps(tmp_path, monkeypatch):
    show = "import os, sys\nprint(os.environ.get('LAB_SHARE', '-'))\nsys.exit(0)\n"
    monkeypatch.setattr(lanes, "MAKE", [sys.executable, "-c", show])
    monkeypatch.delenv("LAB_SHARE", raising=False)
    for name, want in (("slurm-24.11", "2/2"), ("unit", "-")):
        lane = lanes.Lane(name, [lanes.Step("target")], log=tmp_path / f"{name}.log")
        lanes.run_lane(lane)
        assert lane.ok and lane.log.read_text().splitlines()[-1] == want, lane.log.read_text()


def test_a_step_reports_its_status_tests_and_cpu_time(tmp_path, monkeypatch, capsys):
    burn = "import sys, time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n" \
           "print('2 passed, 1 failed in 0.3s')\nsys.exit(3)\n"
    monkeypatch.setattr(lanes, "MAKE", [sys.executable, "-c", burn])
    lane = lanes.Lane("x", [lanes.Step("target"), lanes.Step("never")], log=tmp_path / "x.log")
    lanes.run_lane(lane)
    step = lane.steps[0]
    assert step.rc == 3 and step.counts == {"passed": 2, "failed": 1} and 0.25 <= step.cpu < 5, step
    assert lane.steps[1].rc is None and not lane.ok  # a failed step ends the lane
    assert "make target: FAILED (rc 3)" in capsys.readouterr().out
    busy, total = lanes.machine_cpu()
    assert 0 < busy <= total
