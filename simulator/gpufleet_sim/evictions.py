"""Evictions: what ``plan()`` decides for a job still running on a node drained by us, and carrying it out."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ansible_collections.gpufleet.reliability.plugins.module_utils.repair.state import JobInfo

from .brain import to_hours
from .records import _KEPT_BY, ACT_EVICT, ACT_WAIT, JOB_CHECKPOINT_REQUEUE, KEPT, Failure, H, JobAction

if TYPE_CHECKING:  # pragma: no cover - types only
    from .jobs import Job


class Evictions:
    """The job action of one simulated cluster (a part of ``engine.Sim``)."""

    def _job_action(self, n: int, job: Job, deadline: float, alive):
        """The node was just drained by us with ``job`` still on it: the next repair run (the shipped loop follows a
        drain up about a minute later) plans it drained and busy, and plan() decides the job's fate. Returns the
        JobStep action of an ``evict`` decision (``checkpoint_requeue`` / ``requeue``), ``KEPT`` when the job keeps
        the node (``wait`` draining / job_kept, ``hold`` eviction_limit), or None when ``deadline`` or ``alive()``
        came first. The engine adds no rule of its own: every job action is one plan() decision."""
        env = self.env
        sl = self._slurm(n)
        self.vslurm.job_started(sl)  # drained by us with the job still on it
        self.vslurm.jobs(sl, (JobInfo(str(job.idx + 1), "RUNNING"),))
        d = yield from self._plan_until(n, sl, self.next_run(env.now + H), deadline, alive, ACT_EVICT,
                                        self._job_retry)
        if d is None:
            return None
        if d.action == ACT_EVICT:
            self.job_actions.append(JobAction(env.now, d.node, d.action, d.rule, d.jobs.action))
            # d.spare (a hot spare brought in first): the job's empty slot is filled from the idle pool as every
            # swap is (fill_slots), the spare's GPU-hours already counted
            return d.jobs.action
        if (d.action, d.rule) in _KEPT_BY:
            self.job_actions.append(JobAction(env.now, d.node, d.action, d.rule, None))
            self.stats["evict_waited"] += 1
        return KEPT  # the job keeps the node; anything else (a person's call) does nothing to the job either

    def _job_retry(self, d) -> float | None:
        """A wait of plan()'s own before it decides the job action (the TTL, a limit) is asked again at its time;
        the job keeping the node (draining, job_kept, eviction_limit) ends the asking."""
        if d.action == ACT_WAIT and (d.action, d.rule) not in _KEPT_BY:
            return max(to_hours(d.earliest), self.env.now + H)
        return None

    def _evict(self, job: Job, n: int, f: dict, act: str) -> None:
        """Carry out plan()'s eviction: checkpoint_requeue checkpoints on the way out (no lost work); requeue
        stops the job at once, losing the work since its last checkpoint."""
        now = self.env.now
        if act == JOB_CHECKPOINT_REQUEUE:
            self.stats["evict_checkpoint"] += 1
            self.stats["proactive_drains"] += 1
            self._count(job, f, planned=True)
            job.interrupt(Failure(n, f, now, now, False, remove=True, planned=True))
        else:
            self.stats["evict_requeue"] += 1
            self._count(job, f)
            job.interrupt(Failure(n, f, now, now, False, remove=True, planned=False))

    def _release(self, n: int) -> None:
        """A drained node that kept its job and is no longer sick: back to an in-service record (the simulator
        does not model the drain outliving the episode; see docs/simulator.md)."""
        rec = self.recs.get(n)
        sl = rec.slurm if rec is not None else None
        if sl is not None and self.owner[n] != -2:
            self.vslurm.resume((sl.name,))
            self.vslurm.job_started(sl)
            self.vslurm.jobs(sl, None)
