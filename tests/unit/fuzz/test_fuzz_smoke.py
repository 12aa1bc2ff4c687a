# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fuzz harnesses (tests/support/fuzz_targets.py, run in full by `make fuzz`) with a few hundred inputs each,
so they cannot rot: every parser still imports, its genuine inputs still pass as controls, and the first mutated
inputs find nothing. A finding prints the minimal input; make it a regression test next to the parser's tests."""
from __future__ import annotations

import pytest

from support import fuzz_engine as engine
from support import fuzz_targets as targets

SMOKE_N = 300


# the scenario harness takes ~3 s (300 inputs, each parsed as YAML and validated; the others < 1 s): make test only
HARNESSES = [pytest.param(m, id=m.__name__, marks=[pytest.mark.slow] if m.__name__ == "scenario_target" else [])
             for m in targets.ALL]


@pytest.mark.parametrize("make", HARNESSES)
def test_harness_smoke(make):
    target = make()
    assert target.seeds, "a harness without genuine inputs"
    # the genuine inputs first: each must pass through the parser without a finding (controls)
    res = engine.run_target(target, SMOKE_N, seed=1, deadline_s=10.0, minimize_budget_s=5.0, mem_every=50)
    assert res.inputs == SMOKE_N
    found = [f"{f.kind} {f.error} at {f.where or '?'}: minimal input {f.data[:200]!r}" for f in res.findings.values()]
    assert not found, "\n".join(found)


def test_a_finding_is_reported_with_its_minimal_input():
    """The engine itself: a parser that crashes on a byte is found and minimized (this test can fail)."""
    def run(data: bytes) -> None:
        if b"\x00" in data:
            raise KeyError("nul")
        if b"bad" in data:
            raise ValueError("documented")

    t = engine.Target("toy", run, [b"hello world, a bad line\n" * 4], expected=(ValueError,), tokens=[b"\x00"])
    res = engine.run_target(t, 400, deadline_s=5.0, minimize_budget_s=5.0)
    sigs = {f.signature: f for f in res.findings.values()}
    crash = [f for s, f in sigs.items() if s.startswith("KeyError")]
    assert crash, sigs
    assert crash[0].data == b"\x00"
    assert not [s for s in sigs if s.startswith("ValueError")]


def test_a_hang_is_a_finding():
    def run(data: bytes) -> None:
        if data.startswith(b"spin"):
            while True:
                pass

    t = engine.Target("spin", run, [b"spin", b"ok"])
    res = engine.run_target(t, 2, deadline_s=0.2, minimize_budget_s=1.0)
    assert [f.kind for f in res.findings.values()] == ["hang"]
