"""SimPy's queue during a run: a timeout its process was interrupted out of leaves the queue (engine.Env.abandon),
and the live events still come out in the same order, so seeded results do not move."""

import random

import simpy

from gpufleet_sim import scenario as scn
from gpufleet_sim import validate as val
from gpufleet_sim.brain import default_brain
from gpufleet_sim.engine import Env, Sim
from gpufleet_sim.policies import resolve


def _queue_sizes(env) -> list:
    """The queue's size at every step of ``env`` from now on (the list fills as the run goes)."""
    sizes = []
    step = env.step

    def counted():
        sizes.append(len(env._queue))
        step()

    env.step = counted
    return sizes


def _world(env, abandon):
    """Sleepers that an interrupter cuts short at random; each logs when it wakes and why. Returns the log and the
    queue's size at every step."""
    rng = random.Random(7)
    log = []

    def sleeper(i):
        while True:
            t = env.timeout(rng.expovariate(0.01))
            try:
                yield t
                log.append((round(env.now, 9), i, "woke"))
            except simpy.Interrupt:
                abandon(t)
                log.append((round(env.now, 9), i, "cut"))

    procs = [env.process(sleeper(i)) for i in range(40)]

    def interrupter():
        while True:
            yield env.timeout(rng.expovariate(5.0))
            procs[rng.randrange(len(procs))].interrupt()

    env.process(interrupter())
    sizes = _queue_sizes(env)
    env.run(until=200)
    return log, sizes


def test_abandoned_timeouts_leave_the_queue_and_the_rest_keep_their_order():
    plain, plain_sizes = _world(simpy.Environment(), lambda t: None)
    env = Env()
    ours, our_sizes = _world(env, env.abandon)
    assert ours == plain and len(plain) > 1000  # the same wakes and cuts, at the same times, in the same order
    assert max(plain_sizes) > 300 and max(our_sizes) < 100, (max(plain_sizes), max(our_sizes))


def test_a_timeout_someone_waits_for_stays():
    env = Env()
    t = env.timeout(5)
    got = []
    t.callbacks.append(lambda ev: got.append(env.now))
    env.abandon(t)
    env.run()
    assert got == [5]
    assert not hasattr(t, "abandoned") and env._abandoned == 0  # not marked: a rebuild would have dropped it
    done = env.timeout(1)
    env.run()
    env.abandon(done)  # already processed: nothing to take out, nothing counted
    assert done.processed and not hasattr(done, "abandoned") and env._abandoned == 0


def test_a_run_keeps_simpys_queue_near_its_live_events():
    """The AIReSim case's job checkpoints every step and sleeps until its work is done; each of its interrupts left
    that sleep's timeout in the queue (about 3,700 of them, 7,200 at the peak, over the whole run)."""
    sc = scn.load(val.SCENARIOS / "airesim-default.yaml")
    sim = Sim(sc, resolve("passive+auto-repair+hot-spares"), 1, default_brain(sc), horizon_h=24.0 * 60)
    sizes = _queue_sizes(sim.env)
    sim.run()
    assert len(sizes) > 15_000 and max(sizes) < 400, (len(sizes), max(sizes))


def test_env_keeps_simpys_early_binding():
    """SimPy binds its event classes to a plain Environment once (env.timeout is then a stored bound method); a
    subclass loses that unless it binds them itself: each env.timeout would make a new bound method."""
    plain, ours = simpy.Environment(), Env()
    bound = sorted(k for k, v in vars(plain).items() if callable(v) and getattr(v, "__self__", None) is plain)
    assert {"timeout", "event", "process", "all_of", "any_of"} <= set(bound)
    for name in bound:
        assert name in vars(ours) and getattr(ours, name) is getattr(ours, name), name
        assert getattr(ours, name).__func__ is getattr(plain, name).__func__, name
    t = ours.timeout(2.0, "v")
    ours.run()
    assert ours.now == 2.0 and t.value == "v"
