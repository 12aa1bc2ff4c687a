# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The job on a node the policy drained: plan() decides its fate (jobs.action), the engine carries it out."""

from gpufleet_sim import scenario as scn
from gpufleet_sim import validate as val
from gpufleet_sim.policies import BUILTIN, resolve
from gpufleet_sim.runner import run_one


def test_every_builtin_policy_sets_the_job_action():
    assert all(p.get("jobs") in ("wait", "requeue", "checkpoint_requeue") for p in BUILTIN.values())


def test_wait_and_checkpoint_requeue_differ_for_the_reason_they_should():
    """Seed 2 of the default scenario: under wait the warned nodes keep the job until the fault strikes it (more
    crashes, more work lost since the checkpoint); under checkpoint_requeue plan() evicts at a checkpoint (no
    lost work from those); under requeue the evictions lose the work since the checkpoint."""
    sc = scn.load(val.SCENARIOS / "default-1k.yaml")
    wait = run_one(sc, resolve("passive-wait"), 2)
    ckpt = run_one(sc, resolve("passive+auto-repair"), 2)
    req = run_one(sc, resolve({"name": "passive-requeue", "base": "passive+auto-repair", "jobs": "requeue"}), 2)
    assert wait["evict_waited"] > 0 and wait["evict_checkpoint"] == wait["evict_requeue"] == 0
    assert wait["proactive_drains"] == 0
    assert ckpt["evict_checkpoint"] > 0 and ckpt["evict_waited"] == ckpt["evict_requeue"] == 0
    assert ckpt["proactive_drains"] == ckpt["evict_checkpoint"]  # every checkpointed eviction is a planned stop
    assert wait["crashes"] > ckpt["crashes"]
    # by cause: a warned node (a fault class with a precursor) crashes the job under wait; under
    # checkpoint_requeue some of those are planned stops at a checkpoint instead, and stragglers are evicted
    precursors = [f["name"] for f in sc["faults"] if f.get("precursor")]

    def crashed(r):
        return sum(r["interruptions_by_class"].get(c, 0) - r["planned_interruptions_by_class"].get(c, 0)
                   for c in precursors)

    def planned(r):
        return sum(r["planned_interruptions_by_class"].get(c, 0) for c in precursors)

    assert planned(wait) == 0 and planned(ckpt) > 0 and crashed(wait) > crashed(ckpt)
    assert wait["planned_interruptions_by_class"] == {} and ckpt["planned_interruptions_by_class"].get("straggler")
    assert req["evict_requeue"] > 0 and req["evict_checkpoint"] == 0
    assert req["proactive_drains"] == 0 and req["crashes"] > ckpt["crashes"]


def test_a_released_node_with_an_open_eviction_is_repaired_not_held_for_ever():
    """Found at 1,000,000 GPUs: a node that kept its job (its record's jobs None, "not read") and then crashed still
    had an eviction under way in its history; the repair run waited for the evicted jobs ("evicting") at every run
    until the engine gave up after 200 decisions. Slurm shows no job on a crashed node: the engine says so."""
    from ansible_collections.gpufleet.reliability.plugins.module_utils.repair.history import Eviction, History
    from gpufleet_sim import scenario as scn
    from gpufleet_sim import validate as val
    from gpufleet_sim.brain import default_brain, to_epoch
    from gpufleet_sim.engine import Failure, Sim
    from gpufleet_sim.policies import resolve

    raw = scn.load(val.SCENARIOS / "default-1k.yaml")["raw"]
    sc = scn.validate(scn.override(raw, {"horizon_days": 3, "false_positives.rate_per_1000_node_days": 0}))
    sc["faults"] = [f for f in sc["faults"] if f["name"] == "faulty_gpu"]
    sc["faults"][0].update(per_node_h=0.0, fixed_by="reboot")  # no fault of its own: the test drives one
    sim = Sim(sc, resolve("passive+auto-repair+hot-spares"), 1, default_brain(sc))
    n = 3
    sl = sim._slurm(n)
    h = History()
    inc = h.open("gpu_lost", "xid79", 3, to_epoch(0.0))
    inc.eviction = Eviction(to_epoch(0.0), "checkpoint_requeue", ("1",), None)
    sim.vslurm.history(sl, h)
    sim.vslurm.jobs(sl, None)  # as _release leaves it
    f = sc["faults"][0]

    def strike():
        yield sim.env.timeout(1.0)
        rec = sim._rec(n)
        rec.state, rec.fault, rec.since = "failed", f, sim.env.now
        sim.remove_from_job(sim.jobs[0], n, Failure(n, f, sim.env.now, sim.env.now, False, True))

    sim.env.process(strike())
    sim.run()
    assert sim.stats["repairs"] == 1 and sim.owner[n] != -2


def test_a_straggler_requeued_waits_for_its_swap_before_the_restart():
    """A straggler's node evicted under jobs.action requeue: the job's rate changes and the job is stopped at the
    same instant (two wake-ups). The job must still wait for the hot spare's swap before its restart; a second
    interrupt at that instant used to cut the swap short (seen as 'waiting' 0 with a spare swapped in)."""
    from gpufleet_sim.brain import default_brain
    from gpufleet_sim.engine import Sim
    from gpufleet_sim.records import JOB_REQUEUE

    raw = scn.load(val.SCENARIOS / "default-1k.yaml")["raw"]
    sc = scn.validate(scn.override(raw, {"horizon_days": 1, "false_positives.rate_per_1000_node_days": 0}))
    f = next(x for x in sc["faults"] if x["effect"] == "straggler")
    sc["faults"] = []  # the test drives the one event
    sim = Sim(sc, resolve("passive+auto-repair+hot-spares"), 1, default_brain(sc))
    job, n = sim.jobs[0], 5

    def straggler_evicted():
        yield sim.env.timeout(1.0)
        job.slow[n] = 0.3
        job.set_rate()
        yield sim.env.timeout(1.0)
        job.slow.pop(n)  # what _straggle_end does when plan() evicts: the rate back, then the eviction
        job.set_rate()
        sim._evict(job, n, f, JOB_REQUEUE)

    sim.env.process(straggler_evicted())
    sim.env.run(until=3.0)
    assert sim.stats["evict_requeue"] == 1 and sim.stats["spares_used"] == 1
    assert job.buckets["waiting"] > 0 and job.downtimes, (job.buckets, job.downtimes)
    assert job.downtimes[0] > job.buckets["waiting"]  # the restart's own time came after the swap
