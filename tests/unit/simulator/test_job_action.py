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
    assert wait["lost_gpu_hours_by_cause"]["lost_work"] > ckpt["lost_gpu_hours_by_cause"]["lost_work"]
    assert req["evict_requeue"] > 0 and req["evict_checkpoint"] == 0
    assert req["proactive_drains"] == 0 and req["crashes"] > ckpt["crashes"]
