"""The cyclic collector during a run: collected less often (engine.few_collections), the process's own settings back
after it, whatever happens inside."""

import gc

import pytest

from gpufleet_sim import engine
from gpufleet_sim import scenario as scn
from gpufleet_sim import validate as val
from gpufleet_sim.brain import CollectionBrain, default_brain
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


@pytest.mark.parametrize("own", [(0, 10, 10), (500_000, 10, 10)], ids=["collection-off", "higher-own"])
def test_a_process_setting_of_its_own_is_kept(thresholds, own):
    gc.set_threshold(*own)
    with engine.few_collections():
        assert gc.get_threshold() == own
    assert gc.get_threshold() == own
