"""The event-driven fleet model (SimPy).

Cost grows with the number of events (faults, checks on sick nodes, repairs, checkpoints, restarts), never with
GPUs x ticks:

* faults for the whole fleet come from one SimPy process per fault class, drawn from the class's aggregate rate
  (exponential, or a Weibull fleet-age hazard by inverting the cumulative hazard), then thinned: a draw that lands on
  a node that cannot fail right now (in repair, retired, idle when idle nodes do not fail) is dropped, which keeps the
  process exact without re-drawing on every state change;
* per-node records exist only for nodes that are not healthy (a precursor, a fault, in repair) and for the hidden
  lemon nodes; a healthy node is just an integer in a job's slot list or in the idle pool;
* health checks are not ticked on every node: a sick node's next check comes at a uniformly random phase within
  the check interval.

Time is in hours throughout.

A run allocates millions of objects and makes no reference cycles while it runs (tests/unit/simulator/
test_engine_gc.py holds that for the shipped scenarios), so the cyclic garbage collector finds nothing to free; it
still walks every young object each time it runs, which with Python's default threshold (a collection every 700
allocations) took a quarter of a 1,000,000-GPU run, and with 100,000 about 8 % of it. During a run the youngest
generation is collected every ``GC_YOUNG`` allocations (net of frees); cyclic garbage, should a change make some,
stays bounded by that. The thresholds before the run are restored after it.
"""

from __future__ import annotations

import contextlib
import gc
import math
import random
import zlib
from heapq import heapify

import simpy
from simpy.core import BoundClass

from ansible_collections.gpufleet.reliability.plugins.module_utils.repair import BreakerState, Counts, FleetSummary

from .brain import PARTITION, to_epoch
from .evictions import Evictions
from .faults import FaultProcesses
from .jobs import Job
from .people import People
from .records import Failure, H, JobAction, NodeRec
from .repairs import RepairRuns
from .vslurm import VirtualSlurm

__all__ = ["H", "Env", "Failure", "Job", "NodeRec", "Sim", "daly", "daly_wall", "young"]


class Env(simpy.Environment):
    """SimPy's environment, with a way to take a timeout nobody waits for any more out of its queue.

    An interrupt that ends a job's sleep leaves the sleep's timeout in SimPy's queue until its time comes (a job
    that checkpoints every step sleeps until its work is done), where every push and pop of the heap sifts past it:
    in the AIReSim case about 3,700 such timeouts on average against about 40 live events. ``abandon`` marks one;
    when the marked ones could be half of the queue, the queue is rebuilt without them. The queue is ordered by
    (time, priority, a unique event number), a total order, so the live events come out in the same order as before
    and seeded results do not move. This reads SimPy 4's queue (``_queue``, a heap of (time, priority, number,
    event)); the version is pinned, and tests/unit/simulator/test_engine_queue.py fails if that changes."""

    def __init__(self) -> None:
        super().__init__()
        self._abandoned = 0
        # SimPy binds its event classes (timeout, event, process...) to the instance once, for speed, but only those
        # of the instance's own class (BoundClass.bind_early reads type(self).__dict__): a subclass would make a
        # bound method at every env.timeout. Bind Environment's here as SimPy does for its own.
        for name, obj in vars(simpy.Environment).items():
            if isinstance(obj, BoundClass):
                setattr(self, name, getattr(self, name))

    def abandon(self, ev: simpy.Event) -> None:
        """Nobody waits for ``ev`` (a timeout its process was interrupted out of): it may leave the queue."""
        if ev.callbacks is None or ev.callbacks:
            return  # already processed, or someone still waits for it
        ev.abandoned = True  # type: ignore[attr-defined]
        self._abandoned += 1
        q = self._queue
        if self._abandoned * 2 > len(q):
            q[:] = [e for e in q if not getattr(e[3], "abandoned", False)]
            heapify(q)
            self._abandoned = 0


class Sim(FaultProcesses, RepairRuns, Evictions, People):
    """One simulated cluster: its fleet (jobs' slots, the idle pool, nodes out of service), its SimPy environment
    and its virtual Slurm. The processes live in files of their own: faults.py (what strikes the fleet), jobs.py
    (a training job), repairs.py (the agent's drain rule and the repair runs' plan()), evictions.py (the job
    action), people.py (business hours, approvals, technicians)."""

    def __init__(self, sc: dict, policy: dict, seed: int, brain, horizon_h: float | None = None):
        self.sc, self.policy, self.brain = sc, policy, brain
        self.seed = seed
        self.rng = random.Random(seed)
        # common random numbers: fault arrivals and the properties of each fault come from their own streams, so
        # every policy run with the same seed meets the same faults at the same times (sharper comparisons)
        self.frng = {f["name"]: self.stream("fault:" + f["name"]) for f in sc["faults"]}
        self.env = Env()
        self.vslurm = VirtualSlurm(lambda: float(to_epoch(self.env.now)))
        cl = sc["cluster"]
        self.N = cl["nodes"]
        self.gpn = cl["gpus_per_node"]
        self.rack = cl["nodes_per_rack"]
        #: each rack's name (``r12``), the one place the simulator names its racks
        self.rack_names = [f"r{r}" for r in range((self.N + self.rack - 1) // self.rack)]
        self.horizon = horizon_h if horizon_h is not None else (
            sc["horizon_days"] * 24.0 if sc["horizon_days"] else None)
        self.rep = sc["repair"]
        self.check_interval = policy.get("check_interval_min", self.rep["check_interval_min"]) * H
        self.run_interval = self.rep["run_interval_min"] * H
        self._in_service: list | None = None  # every node's Slurm record while in service (built on first use)
        self.owner = [-1] * self.N  # job index, -1 idle, -2 out of service
        self.slot = [0] * self.N
        self.recs: dict[int, NodeRec] = {}
        self.idle: list[int] = []
        self.idle_pos: dict[int, int] = {}
        self.lemons_initial: list[int] = []
        self.stats = {"spares_used": 0, "retired": 0, "repairs": 0, "repair_actions": {}, "mttr": [],
                      "proactive_drains": 0, "escalations": 0, "faults": 0, "faults_idle": 0, "brain_calls": 0,
                      "approvals": 0, "lemon_faults": 0, "peak_out": 0, "pool_empty": 0, "false_positives": 0,
                      "technician_wait_h": 0.0,
                      "agent_drains": 0, "agent_deferred": 0, "agent_no_drain": 0, "plan_drains": 0, "decisions": 0,
                      "peak_run": 0,
                      "breaker_trips": 0, "evict_checkpoint": 0, "evict_requeue": 0, "evict_waited": 0,
                      "events": 0}
        self.waiting_jobs: list[Job] = []
        self.out_count = 0
        self.out_nodes: set[int] = set()  # the nodes out of service (owner -2)
        self.rack_out: dict[int, int] = {}
        self.breaker: BreakerState | None = None  # the circuit breaker's state, persisted from run to run
        # repair run time -> (its event, {node: (record, approvals)}, {node: the run's Decision} once it ran)
        self._runs: dict[float, tuple] = {}
        self.job_actions: list[JobAction] = []  # what the engine did to jobs, each on one plan() decision
        techs = self.rep.get("technicians")
        self.techs = simpy.Resource(self.env, capacity=techs) if techs else None
        nid = 0
        self.jobs: list[Job] = []
        for i, js in enumerate(sc["jobs"]):
            ids = list(range(nid, nid + js["nodes"]))
            for k, n in enumerate(ids):
                self.owner[n], self.slot[n] = i, k
            nid += js["nodes"]
            self.jobs.append(None)  # type: ignore[arg-type]
            self.jobs[i] = Job(self, i, js, ids)
        for n in range(nid, self.N):
            self._idle_add(n)
        self.standby_of: dict[int, int] = {}  # idle node -> the job it is a warm standby of
        for job in self.jobs:
            for n in self.idle:
                if len(job.standby) >= job.spec["standbys"]:
                    break
                if n not in self.standby_of:
                    job.standby.append(n)
                    self.standby_of[n] = job.idx
        lf = sc["lemons"]["fraction"]
        if lf > 0:
            k = int(round(lf * self.N))
            for n in self.stream("lemon-pick").sample(range(self.N), k):
                self.recs[n] = NodeRec(n, lemon=True)
                self.lemons_initial.append(n)
        self.jobs_left = len(self.jobs)
        self.all_done = self.env.event()
        for f in sc["faults"]:
            self.env.process(self._fault_process(f))
        fp = sc.get("false_positive")
        if fp and fp["per_node_h"] > 0 and self.policy["detection"] == "passive":
            self.env.process(self._false_positive_process(fp))
        lem_classes = [f for f in sc["faults"] if f["lemon"] and f["scope"] == "node" and f["per_node_h"]]
        if self.lemons_initial and lem_classes:
            self.env.process(self._lemon_process(lem_classes))

    # --- checkpoint interval -------------------------------------------------------------------------------------
    def job_rate(self, job_spec: dict) -> float:
        """The rate of faults that interrupt the job and lose its work (crashes, and silent errors found later),
        per hour: the MTBF Young's and Daly's intervals take. A straggler slows the job and loses no work."""
        n = job_spec["nodes"]
        r = 0.0
        for f in self.sc["faults"]:
            if f["effect"] == "straggler":
                continue
            if f["scope"] == "job" and f.get("job_mtbf_h"):
                r += 1.0 / f["job_mtbf_h"]
            elif f["per_node_h"]:
                r += f["per_node_h"] * n
                if f["lemon"] and f["scope"] == "node":
                    r += f["per_node_h"] * n * self.sc["lemons"]["fraction"] * (self.sc["lemons"]["multiplier"] - 1)
        return r

    def checkpoint_interval(self, job: Job) -> float:
        ci = job.spec["checkpoint_interval_min"]
        if not isinstance(ci, str):
            return ci * H
        delta = job.spec["checkpoint_cost_min"] * H
        lam = self.job_rate(job.spec)
        if lam <= 0:
            return math.inf  # nothing to lose work to: checkpoint never (a cost of 0 is continuous, see Job)
        m = 1.0 / lam
        return young(delta, m) if ci == "young" else daly(delta, m)

    # --- pools -----------------------------------------------------------------------------------------------------
    def _idle_add(self, n: int) -> None:
        self.owner[n] = -1
        self.idle_pos[n] = len(self.idle)
        self.idle.append(n)

    def _idle_remove(self, n: int) -> None:
        i = self.idle_pos.pop(n)
        last = self.idle.pop()
        if last != n:
            self.idle[i] = last
            self.idle_pos[last] = i

    def remove_from_job(self, job: Job, n: int, f: Failure) -> None:
        if self.owner[n] != job.idx:
            return
        s = self.slot[n]
        job.nodes[s] = -1
        job.missing.append(s)
        if self.policy["spares"] == "none":
            job.reserved[s] = n
        self._take_out(n)
        job.slow.pop(n, None)
        self.start_repair(n, f)

    def fill_slots(self, job: Job) -> float:
        """Put nodes into the job's empty slots; return when the last swap is done."""
        ready = self.env.now
        spares = self.policy["spares"]
        for s in list(job.missing):
            if spares == "none":
                continue
            n = self._standby(job)
            if n is None:
                if len(self.idle) <= len(self.standby_of):  # the idle nodes left are other jobs' standbys
                    self.stats["pool_empty"] += 1  # a slot to fill and no spare left: the job waits for a repair
                    break
                n = self.idle[self.rng.randrange(len(self.idle))]
                while n in self.standby_of:  # another job's standby (drawn again only when jobs keep standbys)
                    n = self.idle[self.rng.randrange(len(self.idle))]
            self._idle_remove(n)
            self._place(job, s, n)
            self.stats["spares_used"] += 1
            swap = self.rep["hot_swap_min"] if spares == "hot" else self.rep["cold_swap_min"]
            ready = max(ready, self.env.now + swap["sample"](self.rng) * H)
        if job.missing and job not in self.waiting_jobs:
            self.waiting_jobs.append(job)
        return ready

    def _standby(self, job: Job) -> int | None:
        """The first of the job's warm standbys still idle (AIReSim's standby list, first in, first out)."""
        while job.standby:
            n = job.standby.pop(0)
            self.standby_of.pop(n, None)
            if self.owner[n] == -1:
                return n
        return None

    def _place(self, job: Job, s: int, n: int) -> None:
        job.missing.remove(s)
        job.reserved.pop(s, None)
        job.nodes[s] = n
        self.owner[n], self.slot[n] = job.idx, s

    def node_returns(self, n: int) -> None:
        rec = self.recs.get(n)
        if rec is not None:
            rec.state, rec.fault, rec.verdict = "healthy", None, None
            rec.token += 1
            # keep the history for the brain's lemon logic; drop plain healthy records
            if not rec.lemon and not rec.attempts:
                del self.recs[n]
        for job in list(self.waiting_jobs):
            for s, want in list(job.reserved.items()):
                if want == n:
                    self._place(job, s, n)
                    self._wake(job)
                    return
            if self.policy["spares"] != "none" and job.missing:
                s = job.missing[0]
                self._place(job, s, n)
                self.stats["spares_used"] += 1
                self._wake(job)
                return
        self._idle_add(n)
        for job in self.jobs:  # a repaired node refills a job's warm standbys, in the order nodes come back
            if not job.done and len(job.standby) < job.spec["standbys"]:
                job.standby.append(n)
                self.standby_of[n] = job.idx
                break

    def _wake(self, job: Job) -> None:
        if not job.missing and job in self.waiting_jobs:
            self.waiting_jobs.remove(job)
        if job.wake is not None and not job.wake.triggered:
            job.wake.succeed()

    def job_done(self, job: Job) -> None:
        self.jobs_left -= 1
        for n in job.nodes:
            if n >= 0 and self.owner[n] == job.idx:
                self._idle_add(n)
        if self.jobs_left == 0 and not self.all_done.triggered:
            self.all_done.succeed()

    # --- random streams and records ------------------------------------------------------------------------------
    def stream(self, name: str) -> random.Random:
        return random.Random(self.seed * 1_000_003 + zlib.crc32(name.encode()))

    def _rec(self, n: int) -> NodeRec:
        rec = self.recs.get(n)
        if rec is None:
            rec = self.recs[n] = NodeRec(n)
        return rec

    # --- nodes out of service ----------------------------------------------------------------------------------------
    def _take_out(self, n: int) -> None:
        if self.owner[n] == -1:
            self._idle_remove(n)
            j = self.standby_of.pop(n, None)
            if j is not None:  # a warm standby that failed while idle
                self.jobs[j].standby.remove(n)
        self.owner[n] = -2
        self.out_count += 1
        self.out_nodes.add(n)
        if self.out_count > self.stats["peak_out"]:
            self.stats["peak_out"] = self.out_count
        r = n // self.rack
        self.rack_out[r] = self.rack_out.get(r, 0) + 1

    def _bring_back(self, n: int) -> None:
        self.out_count -= 1
        self.out_nodes.discard(n)
        r = n // self.rack
        left = self.rack_out.get(r, 0) - 1
        if left > 0:
            self.rack_out[r] = left
        else:
            self.rack_out.pop(r, None)

    def out_of_service(self):
        """The Slurm records of the nodes out of service that carry a reason and its time (the drains the agent's
        breaker counts); nodes down without a record have neither. A generator: the drain rule reads it only for a
        node that cannot run jobs, so a warning costs nothing per node out of service."""
        recs = self.recs
        return (rec.slurm for rec in (recs.get(n) for n in self.out_nodes)
                if rec is not None and rec.slurm is not None and rec.slurm.out_of_service)

    def fleet_summary(self, batch, spares: bool = True) -> FleetSummary:
        """The whole fleet as one repair run reads it: counts for the partition and for each rack of the nodes
        planned (a node's limits read its own rack only); as many idle hot spares as nodes planned at most."""
        size, names, rack_out, total_n = self.rack, self.rack_names, self.rack_out, self.N
        doms = {}
        for n in batch:  # (two nodes of one rack make the same Counts twice)
            r = n // size
            total = total_n - r * size
            if total > size:
                total = size
            ro = rack_out.get(r, 0)
            doms[names[r]] = Counts(total, total - ro, ro, [])
        hot = [None] * min(len(self.idle), len(batch)) if spares and self.policy["spares"] == "hot" else []
        out = self.out_count
        return FleetSummary(total_n, {PARTITION: Counts(total_n, total_n - out, out, hot)}, {"rack": doms})

    def keep_records(self, histories: bool = True, reports: bool = True) -> None:
        """Keep what a real cluster's records would show of this run, for export.py (call before ``run``):
        slurmdbd's node events and sacct's job runs; with ``histories`` every write of a node's repair history, with
        ``reports`` every report of the agent. A run keeps none of them unless asked: no result reads them."""
        self.vslurm.events = []
        for job in self.jobs:
            job.runs = []
        if histories:
            self.vslurm.history_log = []
        if reports:
            self.vslurm.report_log = []

    # --- run ---------------------------------------------------------------------------------------------------------
    def run(self) -> dict:
        with few_collections():
            if self.horizon is not None:
                stop = self.env.timeout(self.horizon)
                self.env.run(until=simpy.AnyOf(self.env, [stop, self.all_done]))
            else:
                self.env.run(until=self.all_done)
        end = self.env.now
        for job in self.jobs:
            if not job.done:
                if job.computing and job.phase == "compute":
                    job.work += job._progress(job.seg_start, job.seg_rate)
                job._enter("end")
                job.end_run("RUNNING")
        return self.result(end)

    def result(self, end: float) -> dict:
        jobs = []
        for job in self.jobs:
            if job.done:
                wall = job.phase_t
            else:
                wall = end
            useful = job.work  # work since the last checkpoint counts at the end of the horizon
            jobs.append({
                "name": job.name, "gpus": job.gpus, "wall_h": wall, "work_h": useful,
                "ettr": useful / wall if wall > 0 else 0.0,
                "interruptions": job.interruptions, "by_class": dict(job.by_class),
                "planned_by_class": dict(job.planned_by_class),
                "lost_work_h": job.lost_work, "buckets": dict(job.buckets),
                "downtime_mean_h": (sum(job.downtimes) / len(job.downtimes)) if job.downtimes else 0.0,
            })
        return {"end_h": end, "jobs": jobs, "stats": self.stats}


#: Allocations (net of frees) between two collections of the youngest generation during a run (Python's default: 700).
GC_YOUNG = 1_000_000


@contextlib.contextmanager
def few_collections():
    """The cyclic collector's youngest threshold at ``GC_YOUNG`` while the block runs; the thresholds before it are
    restored after (a higher threshold of the process's own is kept, and 0, collection off, stays off)."""
    before = gc.get_threshold()
    if before[0]:
        gc.set_threshold(max(GC_YOUNG, before[0]), *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)


def young(delta: float, m: float) -> float:
    return math.sqrt(2.0 * delta * m)


def daly(delta: float, m: float) -> float:
    if delta >= 2.0 * m:
        return m
    x = delta / (2.0 * m)
    return math.sqrt(2.0 * delta * m) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - delta


def daly_wall(ts: float, tau: float, delta: float, restart: float, m: float) -> float:
    return m * math.exp(restart / m) * (math.exp((tau + delta) / m) - 1.0) * ts / tau
