"""The cyclic collector during a run: collected less often (engine.few_collections), the process's own settings back
after it, whatever happens inside; and why that is safe: a run makes no reference cycles while it runs."""

import gc

import pytest

from gpufleet_sim import engine
from gpufleet_sim import scenario as scn
from gpufleet_sim import validate as val
from gpufleet_sim.brain import CollectionBrain, default_brain
from gpufleet_sim.engine import Sim
from gpufleet_sim.policies import resolve
from gpufleet_sim.runner import run_one


@pytest.fixture
def thresholds():
    before = gc.get_threshold()
    yield before
    gc.set_threshold(*before)


def test_a_run_collects_less_often_and_restores_the_thresholds(thresholds):
    gc.set_threshold(700, 10, 10)
    seen = []

    class Watch(CollectionBrain):
        def plan_run(self, *a, **kw):
            seen.append(gc.get_threshold())
            return super().plan_run(*a, **kw)

    raw = scn.load(val.SCENARIOS / "default-1k.yaml")["raw"]
    sc = scn.validate(scn.override(raw, {"horizon_days": 5}))
    run_one(sc, resolve("passive+auto-repair+hot-spares"), 1, default_brain(sc, cls=Watch))
    assert seen and set(seen) == {(engine.GC_YOUNG, 10, 10)}
    assert gc.get_threshold() == (700, 10, 10)


def test_the_thresholds_come_back_after_an_error(thresholds):
    gc.set_threshold(700, 5, 7)
    with pytest.raises(RuntimeError, match="inside"), engine.few_collections():
        assert gc.get_threshold() == (engine.GC_YOUNG, 5, 7)
        raise RuntimeError("inside")
    assert gc.get_threshold() == (700, 5, 7)


@pytest.mark.parametrize("own", [(0, 10, 10), (5_000_000, 10, 10)], ids=["collection-off", "higher-own"])
def test_a_process_setting_of_its_own_is_kept(thresholds, own):
    gc.set_threshold(*own)
    with engine.few_collections():
        assert gc.get_threshold() == own
    assert gc.get_threshold() == own


@pytest.mark.parametrize("name, over, policy", [
    ("default-1k.yaml", {"horizon_days": 30}, "passive+auto-repair+hot-spares"),
    ("default-1k.yaml", {"horizon_days": 30}, "together-approval"),
    ("default-1k.yaml", {"horizon_days": 30}, "reactive-manual"),
    ("airesim-default.yaml", {"horizon_days": 60}, "passive+auto-repair+hot-spares"),
], ids=["default-hot-spares", "default-approval", "default-manual", "airesim"])
def test_a_run_makes_no_cyclic_garbage_while_it_runs(thresholds, name, over, policy):
    """What makes a rare collection safe: every object a run drops is freed by its reference count (the cluster
    itself, dropped after the run, is one cycle). A change that makes cycles per event fails here, and then the
    collector's threshold bounds them."""
    sc = scn.validate(scn.override(scn.load(val.SCENARIOS / name)["raw"], over))
    sim = Sim(sc, resolve(policy), 1, default_brain(sc))
    gc.collect()
    gc.disable()
    try:
        result = sim.run()
        found = gc.collect()
    finally:
        gc.enable()
    assert result["jobs"] and sim.stats["repairs"] > 0  # a run with repairs, evictions and jobs restarted
    assert found == 0, f"{found} objects in reference cycles made during the run"
