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
"""

from __future__ import annotations

import math
import random
import zlib
from dataclasses import dataclass, field

import simpy

from ansible_collections.gpufleet.reliability.plugins.module_utils.repair import (
    BreakerState,
    Counts,
    FleetSummary,
    NodeState,
    loads,
)
from ansible_collections.gpufleet.reliability.plugins.module_utils.repair.drain import wants_drain
from ansible_collections.gpufleet.reliability.plugins.module_utils.repair.model import (
    RULE_BLAST_RADIUS_DRAIN,
    RULE_BREAKER,
    RULE_DRAINING,
    RULE_EVICTION_LIMIT,
    RULE_JOB_KEPT,
    RULE_LEMON,
)
from ansible_collections.gpufleet.reliability.plugins.module_utils.repair.state import JobInfo
from ansible_collections.gpufleet.reliability.plugins.module_utils.slurm.node import Node
from ansible_collections.gpufleet.reliability.plugins.module_utils.slurmfacts import drain_reason

from .brain import PARTITION, to_epoch, to_hours
from .scenario import LEVEL
from .vslurm import VirtualSlurm

H = 1.0 / 60.0  # one minute in hours
# plan()'s decisions on a node drained by us with a job still on it (repair.rules: draining, evict, ...)
ACT_EVICT, ACT_WAIT, ACT_HOLD = "evict", "wait", "hold"
JOB_CHECKPOINT_REQUEUE, JOB_REQUEUE = "checkpoint_requeue", "requeue"
KEPT = "kept"  # the job keeps the node (jobs.action wait, a job kept, the eviction limit)
_KEPT_BY = {(ACT_WAIT, RULE_DRAINING), (ACT_WAIT, RULE_JOB_KEPT), (ACT_HOLD, RULE_EVICTION_LIMIT)}


@dataclass
class NodeRec:
    node: int
    lemon: bool = False
    state: str = "healthy"  # precursor | failed | drained | repair | retired
    fault: dict | None = None
    since: float = 0.0
    attempts: list = field(default_factory=list)  # [(time_h, action, ok, step_ended_h)]
    verdict: dict | None = None
    failures: int = 0
    token: int = 0  # invalidates stale scheduled callbacks
    slurm: NodeState | None = None  # the node's virtual Slurm record, as the repair policy reads it


@dataclass
class Failure:
    node: int | None
    fault: dict
    t: float
    detect_at: float
    needs_human: bool
    remove: bool  # take the node out of the job (False: restart on the same nodes)
    planned: bool = False  # a proactive drain: checkpoint first, no lost work
    rollback_to: float | None = None  # silent corruption: roll back to this work value


class Job:
    def __init__(self, sim: Sim, idx: int, spec: dict, nodes: list[int]):
        self.sim, self.idx, self.spec = sim, idx, spec
        self.name = spec["name"]
        self.nodes = nodes
        self.gpus = len(nodes) * sim.sc["cluster"]["gpus_per_node"]
        self.work = 0.0
        self.ckpt_work = 0.0
        self.work_target = spec["work_hours"]
        self.rate = 1.0
        self.slow: dict[int, float] = {}
        self.pending: list[Failure] = []
        self.missing: list[int] = []  # slots without a node
        self.reserved: dict[int, int] = {}  # slot -> node it waits for (spares: none)
        self.computing = False
        self.down = False
        self.done = False
        self.phase = "compute"
        self.phase_t = 0.0
        self.buckets = {"checkpoint": 0.0, "detection": 0.0, "waiting": 0.0, "restart": 0.0, "straggler": 0.0}
        self.lost_work = 0.0
        self.useful_compute = 0.0
        self.interruptions = 0
        self.by_class: dict[str, int] = {}
        self.planned_by_class: dict[str, int] = {}  # proactive drains at a checkpoint (no crash)
        self.downtimes: list[float] = []
        self.wake: simpy.Event | None = None
        self.seg_start, self.seg_rate = 0.0, 1.0
        self.jf_classes = []
        for f in sim.sc["faults"]:
            if f["scope"] == "job":
                r = 1.0 / f["job_mtbf_h"] if f.get("job_mtbf_h") else f["per_node_h"] * len(nodes)
                if r > 0:
                    self.jf_classes.append((f, r))
        self.jf_rate = sum(r for _f, r in self.jf_classes)
        self.jrng = sim.stream("jobfault:" + self.name)
        self.jf_next = self.jrng.expovariate(self.jf_rate) if self.jf_rate > 0 else math.inf
        # in-memory every step (no lost work): an interval of 0, or Young/Daly for a checkpoint that costs nothing
        # (their optimum interval goes to 0 with the cost)
        ci = spec["checkpoint_interval_min"]
        self.continuous = ci == 0 or (isinstance(ci, str) and spec["checkpoint_cost_min"] == 0)
        self.tau = sim.checkpoint_interval(self) if not self.continuous else math.inf
        self.delta = spec["checkpoint_cost_min"] * H
        self.proc = sim.env.process(self.run())

    # --- accounting -------------------------------------------------------------------------------------------
    def _enter(self, phase: str) -> None:
        now = self.sim.env.now
        dt = now - self.phase_t
        if dt > 0:
            if self.phase == "compute":
                self.useful_compute += dt
            else:
                self.buckets[self.phase] += dt
        self.phase, self.phase_t = phase, now

    def _progress(self, start: float, rate: float) -> float:
        dt = self.sim.env.now - start
        self.buckets["straggler"] += dt * (1.0 - rate)
        return dt * rate

    # --- the job's life ----------------------------------------------------------------------------------------
    def _sleep(self, dt: float):
        """Sleep dt hours inside the job process; True when the whole time passed.

        Job-scope faults (software, hangs) are drawn here from the job's aggregate rate instead of in a separate
        process: a fault due inside the window ends the sleep as a pending failure. Node faults arrive as
        SimPy interrupts and end it too.
        """
        env = self.sim.env
        if self.jf_rate > 0:
            now = env.now
            if self.jf_next < now:  # drawn before an unexposed stretch: redraw (memoryless, exact)
                self.jf_next = now + self.jrng.expovariate(self.jf_rate)
            exposed = self.computing or self.spec["faults_while_down"]
            if exposed and self.jf_next < now + dt:
                try:
                    yield env.timeout(self.jf_next - now)
                except simpy.Interrupt:
                    return False
                self.jf_next = env.now + self.jrng.expovariate(self.jf_rate)
                self.sim.job_fault(self)
                return False
        try:
            yield env.timeout(dt)
        except simpy.Interrupt:
            return False
        return True

    # --- the job's life ----------------------------------------------------------------------------------------
    def run(self):
        env = self.sim.env
        while not self.done:
            if self.pending or self.missing:
                yield from self._recover()
                continue
            remaining = (self.work_target - self.work) if self.work_target is not None else math.inf
            if remaining <= 1e-12:
                self.done = True
                break
            if self.continuous:
                seg = remaining if remaining < math.inf else 24.0 * 365
            else:
                seg = min(self.tau - (self.work - self.ckpt_work), remaining)
            rate = self.rate
            self._enter("compute")
            self.computing = True
            start = env.now
            self.seg_start, self.seg_rate = start, rate
            ok = yield from self._sleep(seg / rate)
            self.computing = False
            if ok:
                self.work += seg
                self.buckets["straggler"] += (seg / rate) * (1 - rate)
            else:
                self.work += self._progress(start, rate)
                continue
            # blocking checkpoint (failures may strike it: the checkpoint is then lost)
            if self.delta > 0 and not self.continuous:
                self._enter("checkpoint")
                self.computing = True
                ok = yield from self._sleep(self.delta)
                self.computing = False
                if not ok:
                    continue
            self.ckpt_work = self.work
        self._enter("end")
        self.sim.job_done(self)

    def _recover(self):
        env = self.sim.env
        t0 = env.now
        # roll back to the last checkpoint
        planned = all(f.planned for f in self.pending)
        rb = [f.rollback_to for f in self.pending if f.rollback_to is not None]
        target = min([self.work if self.continuous else self.ckpt_work] + rb)
        if planned and not rb:
            target = self.work  # checkpoint taken on the way out
            if self.delta > 0:
                # Only a failure that is not itself a planned drain spoils this checkpoint. Another planned drain,
                # or a straggler's rate change, that interrupts it leaves it running for the time still left: a
                # real job would checkpoint once on the way out for all of them.
                self._enter("checkpoint")
                left, seen = self.delta, len(self.pending)
                while left > 1e-12:
                    t1 = env.now
                    ok = yield from self._sleep(left)
                    if ok:
                        break
                    left -= env.now - t1
                    if any(not f.planned for f in self.pending[seen:]):
                        target = self.ckpt_work
                        break
                    seen = len(self.pending)
        self.lost_work += max(0.0, self.work - target)
        self.work = self.ckpt_work = target
        self.down = True
        # detection: wait until the last pending failure has been found (and a person, if needed, acted)
        self._enter("detection")
        while True:
            now = env.now
            due = max([f.detect_at for f in self.pending]) if self.pending else now
            if due <= now:
                break
            yield from self._sleep(due - now)
        failures, self.pending = self.pending, []
        for f in failures:
            if f.remove and f.node is not None:
                self.sim.remove_from_job(self, f.node, f)
        # get nodes
        self._enter("waiting")
        while self.missing:
            ready_at = self.sim.fill_slots(self)
            try:
                if self.missing:
                    self.wake = env.event()
                    yield self.wake
                elif ready_at > env.now:
                    yield env.timeout(ready_at - env.now)
            except simpy.Interrupt:
                pass
            self.wake = None
            if self.pending:  # a new fault while waiting: detect it too
                return
        # restart (failures may strike a restart: it starts over)
        self._enter("restart")
        self.computing = self.spec["faults_while_down"]
        ok = yield from self._sleep(self.spec["restart_min"]["sample"](self.sim.rng) * H)
        self.computing = False
        if not ok:
            return
        self.down = False
        self.downtimes.append(env.now - t0)

    def interrupt(self, failure: Failure) -> None:
        self.pending.append(failure)
        if self.proc.is_alive and self.sim.env.active_process is not self.proc:
            self.proc.interrupt()

    def set_rate(self) -> None:
        r = 1.0
        for s in self.slow.values():
            r *= 1.0 - s
        self.rate = max(r, 1e-6)
        if self.computing and self.phase == "compute" and self.proc.is_alive:
            self.proc.interrupt()


class Sim:
    def __init__(self, sc: dict, policy: dict, seed: int, brain, horizon_h: float | None = None):
        self.sc, self.policy, self.brain = sc, policy, brain
        self.seed = seed
        self.rng = random.Random(seed)
        # common random numbers: fault arrivals and the properties of each fault come from their own streams, so
        # every policy run with the same seed meets the same faults at the same times (sharper comparisons)
        self.frng = {f["name"]: self.stream("fault:" + f["name"]) for f in sc["faults"]}
        self.env = simpy.Environment()
        self.vslurm = VirtualSlurm(lambda: float(to_epoch(self.env.now)))
        cl = sc["cluster"]
        self.N = cl["nodes"]
        self.gpn = cl["gpus_per_node"]
        self.rack = cl["nodes_per_rack"]
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
        self._runs: dict[float, tuple] = {}  # repair run time -> (its event, {node: (record, approvals)})
        self._decided: dict[int, object] = {}  # node -> the Decision of the last run that planned it
        self.job_actions: list = []  # (time_h, node, the plan() Decision the engine carried out on the job)
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
            if not self.idle:
                self.stats["pool_empty"] += 1  # a slot to fill and no spare left: the job waits for a repair
                break
            n = self.idle[self.rng.randrange(len(self.idle))]
            self._idle_remove(n)
            self._place(job, s, n)
            self.stats["spares_used"] += 1
            swap = self.rep["hot_swap_min"] if spares == "hot" else self.rep["cold_swap_min"]
            ready = max(ready, self.env.now + swap["sample"](self.rng) * H)
        if job.missing and job not in self.waiting_jobs:
            self.waiting_jobs.append(job)
        return ready

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

    # --- fault arrival -------------------------------------------------------------------------------------------
    def stream(self, name: str) -> random.Random:
        return random.Random(self.seed * 1_000_003 + zlib.crc32(name.encode()))

    def _fault_process(self, f: dict):
        env, rng = self.env, self.frng[f["name"]]
        scope = f["scope"]
        if scope == "job":
            return  # drawn inside each job process (Job._sleep)
        if scope == "rack":
            n_racks = max(1, math.ceil(self.N / self.rack))
            total = (f["per_node_h"] or 0.0) * self.N
        else:
            total = (f["per_node_h"] or 0.0) * self.N
        if total <= 0:
            return
        k = f["weibull_shape"]
        horizon = self.horizon or 24.0 * 365
        cum = 0.0
        while True:
            if k == 1.0:
                yield env.timeout(rng.expovariate(total))
            else:
                # fleet-age Weibull hazard with the same expected count over the horizon: L(t) = total*T*(t/T)^k
                cum += rng.expovariate(1.0)
                t_next = horizon * (cum / (total * horizon)) ** (1.0 / k)
                yield env.timeout(max(0.0, t_next - env.now))
            self.stats["events"] += 1
            if scope == "rack":
                self._strike_rack(rng.randrange(n_racks), f)
            else:
                self._strike_node(rng.randrange(self.N), f)

    def _lemon_process(self, classes: list[dict]):
        env, rng = self.env, self.stream("lemons")
        mult = self.sc["lemons"]["multiplier"] - 1.0
        weights = [f["per_node_h"] * mult for f in classes]
        per_lemon = sum(weights)
        total = per_lemon * len(self.lemons_initial)
        if total <= 0:
            return
        while True:
            yield env.timeout(rng.expovariate(total))
            self.stats["events"] += 1
            n = self.lemons_initial[rng.randrange(len(self.lemons_initial))]
            rec = self.recs.get(n)
            if rec is None or not rec.lemon:
                continue
            x = rng.random() * per_lemon
            for f, w in zip(classes, weights):  # noqa: B007 - f is the pick
                x -= w
                if x <= 0:
                    break
            before = self.stats["faults"] + self.stats["faults_idle"]
            self._strike_node(n, f)
            self.stats["lemon_faults"] += self.stats["faults"] + self.stats["faults_idle"] - before

    def _false_positive_process(self, fp: dict):
        """Passive checks that call a healthy node sick: the node is drained (a job on it checkpoints and restarts
        elsewhere), goes through the first repair step and its verification, and comes back."""
        env, rng = self.env, self.stream("false-positive")
        total = fp["per_node_h"] * self.N
        while True:
            yield env.timeout(rng.expovariate(total))
            n = rng.randrange(self.N)
            o = self.owner[n]
            rec = self.recs.get(n)
            if o == -2 or (rec is not None and rec.state != "healthy"):
                continue  # out of service or already sick: no healthy node to mistake
            self.stats["events"] += 1
            self.stats["false_positives"] += 1
            if o == -1 or self.jobs[o].done:
                rec = self._rec(n)
                rec.state, rec.fault, rec.since = "failed", fp, env.now
                self._take_out(n)
                self.start_repair(n, Failure(n, fp, env.now, env.now, False, True))
                continue
            rec = self._rec(n)
            rec.state, rec.fault, rec.since = "precursor", fp, env.now
            env.process(self._false_drain(self.jobs[o], n, fp, rec.token))

    def _false_drain(self, job: Job, n: int, fp: dict, tok: int):
        env = self.env
        rec = self.recs[n]
        v = self.brain.judge(tuple(fp["kmsg"]))

        def alive() -> bool:
            return rec.token == tok and rec.state == "precursor" and self.owner[n] == job.idx and not job.done

        # the check that raised it goes through the agent's drain rule, then the repair runs, like a true finding
        drained = yield from self._warning(n, v, env.now, math.inf, alive)
        if rec.token != tok or rec.state != "precursor":
            return
        if not drained:
            rec.state, rec.fault = "healthy", None  # not drained, or the job moved on: the alarm is moot
            return
        act = yield from self._job_action(n, job, math.inf, alive)
        if act not in (JOB_CHECKPOINT_REQUEUE, JOB_REQUEUE):
            rec.state, rec.fault = "healthy", None  # the job keeps the node: the alarm is moot for the model
            self._release(n)
            return
        rec.verdict = v
        rec.state = "drained"
        self._evict(job, n, fp, act)

    def _can_fail(self, n: int) -> bool:
        o = self.owner[n]
        if o == -2:
            return False
        rec = self.recs.get(n)
        if rec is not None and rec.state not in ("healthy", "precursor"):
            return False
        if o == -1:
            return self.sc["cluster"]["idle_nodes_fail"]
        job = self.jobs[o]
        if job.done:
            return self.sc["cluster"]["idle_nodes_fail"]
        return job.computing or job.spec["faults_while_down"]

    def _rec(self, n: int) -> NodeRec:
        rec = self.recs.get(n)
        if rec is None:
            rec = self.recs[n] = NodeRec(n)
        return rec

    def job_fault(self, job: Job) -> None:
        """A job-scope fault drawn by the job itself (called from inside the job process)."""
        self.stats["events"] += 1
        x = job.jrng.random() * job.jf_rate
        for f, r in job.jf_classes:  # noqa: B007 - f is the pick
            x -= r
            if x <= 0:
                break
        self._strike_job(job, f, inside=True)

    def _strike_job(self, job: Job, f: dict, inside: bool = False) -> None:
        if job.done or not (job.computing or job.spec["faults_while_down"]):
            return
        self.stats["faults"] += 1
        self._count(job, f)
        now = self.env.now
        human = self.policy["repair"] == "manual" and self.policy["identify"] == "human"
        detect = now + f["job_detect_min"]["sample"](self.rng) * H
        if human:
            detect = self.human_ready(detect)
        if f["effect"] == "straggler":
            return  # job-wide slowdowns are not modelled at job scope
        fl = Failure(None, f, now, detect, human, remove=False)
        if inside:
            job.pending.append(fl)
        else:
            job.interrupt(fl)

    def _strike_rack(self, r: int, f: dict) -> None:
        nodes = [n for n in range(r * self.rack, min(self.N, (r + 1) * self.rack)) if self._can_fail(n)]
        if not nodes:
            return
        now = self.env.now
        out = f["outage_h"]["sample"](self.frng[f["name"]])
        hit_jobs = {}
        for n in nodes:
            o = self.owner[n]
            if o >= 0 and not self.jobs[o].done:
                hit_jobs.setdefault(o, []).append(n)
            elif o == -1:
                self._take_out(n)
                self.env.process(self._outage_return(n, out))
        self.stats["faults"] += 1
        for o, ns in hit_jobs.items():
            job = self.jobs[o]
            self._count(job, f)
            detect = now + f["job_detect_min"]["sample"](self.rng) * H
            for n in ns:
                job.interrupt(Failure(n, f, now, detect, False, remove=False))
                s = self.slot[n]
                job.nodes[s] = -1
                job.missing.append(s)
                job.reserved[s] = n  # the rack comes back as a whole
                self._take_out(n)
                self.env.process(self._outage_return(n, out))
            if job not in self.waiting_jobs:
                self.waiting_jobs.append(job)

    def _outage_return(self, n: int, out: float):
        yield self.env.timeout(out)
        self.stats["mttr"].append(out)
        self._bring_back(n)
        self.node_returns(n)

    def _count(self, job: Job, f: dict, planned: bool = False) -> None:
        job.interruptions += 1
        job.by_class[f["name"]] = job.by_class.get(f["name"], 0) + 1
        if planned:
            job.planned_by_class[f["name"]] = job.planned_by_class.get(f["name"], 0) + 1

    def _strike_node(self, n: int, f: dict) -> None:
        if not self._can_fail(n):
            return
        rec = self.recs.get(n)
        if rec is not None and rec.state == "precursor":
            return
        now = self.env.now
        o = self.owner[n]
        if o == -1 or (o >= 0 and self.jobs[o].done):
            if f["effect"] != "crash" or f["scope"] == "job" or not f["hardware"]:
                return  # software and stragglers need a running job
            self.stats["faults_idle"] += 1
            rec = self._rec(n)
            rec.state, rec.fault, rec.since = "failed", f, now
            self._take_out(n)
            self.start_repair(n, Failure(n, f, now, now, False, True))
            return
        job = self.jobs[o]
        if f["scope"] == "node" and not f["hardware"] and f["category"] in ("software", "unknown"):
            # a per-node rate for a job-level fault: restart on the same nodes
            self._strike_job(job, f)
            return
        self.stats["faults"] += 1
        if f["effect"] == "straggler":
            self._straggle(job, n, f)
            return
        if f["effect"] == "silent":
            rec = self._rec(n)
            rec.state, rec.fault, rec.since = "failed", f, now
            rollback = job.ckpt_work
            tok = rec.token
            self.env.process(self._silent(job, n, f, rollback, tok))
            return
        pre = f["precursor"]
        fr = self.frng[f["name"]]
        if pre and fr.random() < pre["share"]:
            rec = self._rec(n)
            rec.state, rec.fault, rec.since = "precursor", f, now
            lead = pre["lead_h"]["sample"](fr)
            self.env.process(self._precursor(job, n, f, lead, rec.token))
            return
        self._crash(job, n, f)

    def _crash(self, job: Job, n: int, f: dict) -> None:
        now = self.env.now
        rec = self._rec(n)
        rec.state, rec.fault, rec.since = "failed", f, now
        rec.failures += 1
        self._count(job, f)
        d_job = f["job_detect_min"]["sample"](self.rng) * H
        detect = now + d_job
        human = False
        if self.policy["detection"] == "passive" and self.rng.random() < f["visible"]:
            v = self.brain.judge(tuple(f["kmsg"]))
            rec.verdict = v
            if v["verdict"] == "unhealthy":
                detect = min(detect, now + self.rng.random() * self.check_interval +
                             self.rep["check_detect_min"]["sample"](self.rng) * H)
        if self.policy["identify"] == "human" and rec.verdict is None:
            human = True
            detect = self.human_ready(detect)
        job.interrupt(Failure(n, f, now, detect, human, remove=True))

    def _precursor(self, job: Job, n: int, f: dict, lead: float, tok: int):
        env = self.env
        rec = self.recs[n]
        fail_at = env.now + lead
        if self.policy["detection"] == "passive" and self.rng.random() < f["visible"]:
            seen = env.now + self.rng.random() * self.check_interval
            v = self.brain.judge(tuple(f["precursor"]["kmsg"]))

            def alive() -> bool:
                return rec.token == tok and rec.state == "precursor" and self.owner[n] == job.idx and not job.done

            drained = yield from self._warning(n, v, seen, fail_at, alive)
            if drained:
                act = yield from self._job_action(n, job, fail_at, alive)
                if act in (JOB_CHECKPOINT_REQUEUE, JOB_REQUEUE):
                    rec.verdict = v
                    rec.state = "drained"
                    self._evict(job, n, f, act)
                    return
                # the job keeps the node (or the fault came first): the fault strikes at its time below
        yield env.timeout(max(0.0, fail_at - env.now))
        if rec.token != tok or rec.state != "precursor":
            return
        o = self.owner[n]
        if o == job.idx and not job.done and (job.computing or job.spec["faults_while_down"]):
            self.stats["faults"] += 0
            self._crash(job, n, f)
        elif o == -1 and self.sc["cluster"]["idle_nodes_fail"]:
            rec.state = "failed"
            self._take_out(n)
            self.start_repair(n, Failure(n, f, env.now, env.now, False, True))
        else:
            rec.state = "healthy"
            self._release(n)

    def _silent(self, job: Job, n: int, f: dict, rollback: float, tok: int):
        env = self.env
        yield env.timeout(f["silent_detect_h"]["sample"](self.frng[f["name"]]))
        rec = self.recs.get(n)
        if rec is None or rec.token != tok or self.owner[n] != job.idx or job.done:
            return
        self._count(job, f)
        detect = env.now
        if self.policy["identify"] == "human":
            detect = self.human_ready(detect)
        job.interrupt(Failure(n, f, env.now, detect, False, remove=True, rollback_to=rollback))

    def _straggle(self, job: Job, n: int, f: dict):
        if n in job.slow:
            return
        job.slow[n] = f["slowdown"]
        job.set_rate()
        self.env.process(self._straggle_end(job, n, f))

    def _straggle_end(self, job: Job, n: int, f: dict):
        env = self.env
        ep = f["episode_min"]["sample"](self.frng[f["name"]]) * H
        end = env.now + ep
        if self.policy["detection"] == "passive" and self.rng.random() < f["visible"] and f["kmsg"]:
            v = self.brain.judge(tuple(f["kmsg"]))
            seen = env.now + self.rng.random() * self.check_interval

            def alive() -> bool:
                return n in job.slow and self.owner[n] == job.idx and not job.done

            drained = yield from self._warning(n, v, seen, end, alive)
            if drained:
                act = yield from self._job_action(n, job, end, alive)
                if act in (JOB_CHECKPOINT_REQUEUE, JOB_REQUEUE):
                    job.slow.pop(n, None)
                    job.set_rate()
                    rec = self._rec(n)
                    rec.state, rec.fault, rec.since = "drained", f, env.now
                    self._evict(job, n, f, act)
                    return
                # the job keeps the node: it stays slow until the episode ends
                if end > env.now:
                    yield env.timeout(end - env.now)
                if job.slow.pop(n, None) is not None:
                    job.set_rate()
                self._release(n)
                return
        if end > env.now:
            yield env.timeout(end - env.now)
        if job.slow.pop(n, None) is not None:
            job.set_rate()

    # --- people ----------------------------------------------------------------------------------------------------
    def business_open(self, t: float) -> float:
        """The first time >= t when someone is at work (the run starts Monday 00:00)."""
        bh = self.rep["business_hours"]
        if bh is None:
            return t
        for _unused in range(15):
            day = int(t // 24)
            hour = t - day * 24
            if day % 7 < bh["weekdays"]:
                if hour < bh["start"]:
                    return day * 24 + bh["start"]
                if hour < bh["end"]:
                    return t
            t = (day + 1) * 24
        return t

    def human_ready(self, t: float) -> float:
        t = self.business_open(t)
        return self.business_open(t + self.rep["human_response_min"]["sample"](self.rng) * H)

    def approval_delay(self, t: float) -> float:
        spec = self.policy.get("approval_delay_min")
        if spec is not None:
            from .dists import parse_duration

            sampler = parse_duration("policy.approval_delay_min", spec)[0]
        else:
            sampler = self.rep["approval_delay_min"]["sample"]
        self.stats["approvals"] += 1
        return t + sampler(self.rng) * H

    # --- repair ------------------------------------------------------------------------------------------------------
    def _take_out(self, n: int) -> None:
        if self.owner[n] == -1:
            self._idle_remove(n)
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
        racks = {n // self.rack for n in batch}
        doms = {}
        for r in racks:
            total = min(self.rack, self.N - r * self.rack)
            ro = self.rack_out.get(r, 0)
            doms[f"r{r}"] = Counts(total, total - ro, ro)
        hot = [None] * min(len(self.idle), len(batch)) if spares and self.policy["spares"] == "hot" else []
        return FleetSummary(self.N, {PARTITION: Counts(self.N, self.N - self.out_count, self.out_count, hot)},
                            {"rack": doms})

    def ask(self, n: int, sl: NodeState, at: float, approvals: set) -> simpy.Event:
        """Put node ``n`` on the first repair run at or after ``at`` and return the run's event; once it has
        fired, ``self._decided[n]`` is the node's Decision. Every node on one run is planned by one plan() call,
        the way one run of the repair playbook plans them all."""
        t = self.next_run(max(at, self.env.now))
        run = self._runs.get(t)
        if run is None:
            ev = self.env.timeout(t - self.env.now, t)
            ev.callbacks.append(self._repair_run)  # first callback: plans before any waiting node resumes
            run = self._runs[t] = (ev, {})
        run[1][n] = (sl, approvals)
        return run[0]

    def _repair_run(self, event: simpy.Event) -> None:
        """The repair run at ``event.value`` (its time): plan every node on it together."""
        batch = self._runs.pop(event.value)[1]
        approvals: set = set()
        for _sl, ap in batch.values():
            approvals |= ap
        self.stats["brain_calls"] += 1
        self.stats["decisions"] += len(batch)
        if len(batch) > self.stats["peak_run"]:
            self.stats["peak_run"] = len(batch)
        nodes = [v[0] for v in batch.values()]
        p = self.brain.plan_run(nodes, self.fleet_summary(batch), self.env.now, approvals, self.breaker)
        if p.breaker is not None:
            if p.breaker.tripped and not (self.breaker is not None and self.breaker.tripped):
                self.stats["breaker_trips"] += 1
            self.breaker = p.breaker
        decided = self._decided
        if len(p) == 1:
            decided[next(iter(batch))] = p[0]
        else:
            by_name = {d.node: d for d in p}
            for n, (sl, _ap) in batch.items():
                decided[n] = by_name[sl.name]

    def reset_breaker(self) -> None:
        """A person looked at the fleet and resets the breaker (failures before now no longer count)."""
        if self.breaker is not None and self.breaker.tripped:
            self.breaker = self.breaker.reset(float(to_epoch(self.env.now)))

    # --- repair: the collection's repair policy decides every step -------------------------------------------------
    def start_repair(self, n: int, f: Failure) -> None:
        rec = self._rec(n)
        if rec.state in ("repair", "retired"):
            return
        if rec.state == "healthy":
            rec.state, rec.fault = "failed", f.fault
        rec.since = f.t
        self.env.process(self._repair(n, rec))

    def _report_for(self, rec: NodeRec) -> dict:
        lines = tuple(rec.fault["kmsg"]) if rec.fault else ()
        if rec.fault and rec.state == "drained" and rec.fault.get("precursor") and not lines:
            lines = tuple(rec.fault["precursor"]["kmsg"])
        return self.brain.judge(lines) if lines else self.brain.healthy_report()

    def _repair(self, n: int, rec: NodeRec):
        env = self.env
        out_since = env.now
        proactive = rec.state == "drained"
        rec.state = "repair"
        mode = self.policy["repair"]
        fixed = False
        if proactive and rec.fault and rec.fault.get("precursor"):
            v = self.brain.judge(tuple(rec.fault["precursor"]["kmsg"]))
        else:
            v = self._report_for(rec)
        now_s = float(to_epoch(env.now))
        sl = self._slurm(n)
        vs = self.vslurm
        if sl.jobs:  # the job has left the node (evicted, or crashed off it): Slurm shows no job on it
            vs.jobs(sl, ())
        vs.job_left(sl)
        if not proactive:  # a proactive drain (agent or plan) left the record drained by us, with its history
            # a fault: the node cannot run jobs (the live probe, which the simulator does not replay, finds the GPU
            # lost or in need of a reset), so the agent's rule drains it at once when its report asks for a drain
            if wants_drain(v["report"]):
                vs.drain((sl.name,), v["drain_reason"])
            elif v["verdict"] == "healthy":  # nothing a check sees: Slurm finds the node not responding
                vs.not_responding(sl)
            else:  # a warning the agent leaves in service: the repair run's plan() drains it (TTL, limits)
                vs.resume((sl.name,))
            vs.report(sl, v["report"], now_s)
        approvals: set = set()
        at = env.now
        for _guard in range(200):
            yield self.ask(n, sl, at, approvals)
            d = self._decided[n]
            at = env.now
            a = d.action
            if a == "wait":
                h = d.hist
                if h is not None:
                    vs.history(sl, h)
                at = max(to_hours(d.earliest), env.now + H)
                continue
            if a in ("hold", "escalate"):
                # the brain hands the node to a person: someone diagnoses it and fixes it by hand
                if a == "escalate" and d.hist_after is not None:
                    vs.history(sl, d.hist_after)
                elif d.hist is not None:
                    vs.history(sl, d.hist)
                self.stats["escalations"] += 1
                if d.rule == RULE_BREAKER:
                    yield env.timeout(self.human_ready(env.now) - env.now)
                    self.reset_breaker()
                    at = env.now
                    continue
                while True:
                    action = rec.fault["fixed_by"] if rec.fault else "reboot"
                    ok = yield from self._by_hand(rec, action, wait_for_hours=True)
                    if ok:
                        break
                fixed = True
                vs.resume((sl.name,))
                vs.report(sl, self.brain.healthy_report()["report"], float(to_epoch(env.now)))
                break
            if d.needs_approval and not d.approved:
                yield env.timeout(self.approval_delay(env.now) - env.now)
                approvals.add(d.approval_key)
                at = env.now
                continue
            if mode == "manual":
                yield env.timeout(self.human_ready(env.now) - env.now)
            if d.hist_after is not None:
                vs.history(sl, d.hist_after)
            if a == "drain":
                vs.drain((sl.name,), drain_reason(d.code, d.gpu))
                at = env.now
                continue
            if a == "resume":
                vs.resume((sl.name,))
                fixed = True
                break
            if a in LEVEL:
                if d.rule == RULE_LEMON:
                    self.stats["retired"] += 1
                if mode == "manual" or a == "replace":
                    ok = yield from self._by_hand(rec, a)
                else:
                    ok = yield from self._do(rec, a)
                # what the bodies leave as proof that the step ran, when it ended (before its check): a reset's
                # own record (repair_step op=ran), a reboot's new boot time in Slurm; the check's report is newer
                proved = to_epoch(rec.attempts[-1][3])
                if a == "reset_gpu":
                    h = loads(sl.history).copy()  # the record's History (or none yet), never changed in place
                    h.ran(proved)
                    vs.history(sl, h)
                elif a == "reboot":
                    vs.booted(sl, float(proved))
                rep = self.brain.healthy_report() if ok else self._report_for(rec)
                vs.report(sl, rep["report"], float(max(to_epoch(env.now), proved + 1)))
                at = env.now
                continue
            raise RuntimeError(f"repair brain returned an action the simulator does not know: {a}")
        if not fixed:
            raise RuntimeError(f"node {n}: the repair brain did not settle after 200 decisions")
        self.stats["repairs"] += 1
        self.stats["mttr"].append(env.now - out_since)
        self._bring_back(n)
        self.node_returns(n)

    # --- warnings: the agent's drain rule, then the repair runs' plan() ---------------------------------------------
    def _slurm(self, n: int) -> NodeState:
        """The node's virtual Slurm record (kept with its repair history for the node's life)."""
        rec = self._rec(n)
        if rec.slurm is None:
            rec.slurm = self.vslurm.add(NodeState(f"node{n:06d}", (PARTITION,), {"rack": f"r{n // self.rack}"}))
        return rec.slurm

    def slurm_nodes(self) -> list:
        """Every node's Slurm record as the agent reads it (``sinfo``), as the Slurm adapter's ``Node``: name, state,
        flags, reason and its time, partition, rack feature. Nodes in service share one prebuilt record each; out
        of service: its own."""
        base = self._in_service
        if base is None:
            base = self._in_service = [Node(f"node{n:06d}", "allocated", partitions=[PARTITION],
                                            features=[f"rack_r{n // self.rack}"]) for n in range(self.N)]
        out = list(base)
        for n, o in enumerate(self.owner):
            if o != -2:
                continue
            rec = self.recs.get(n)
            sl = rec.slurm if rec is not None else None
            if sl is not None and not sl.out_of_service:
                continue
            out[n] = Node(base[n].name, sl.state if sl is not None else "down",
                          frozenset(sl.flags) if sl is not None else frozenset(),
                          sl.reason if sl is not None else "Not responding",
                          reason_time=sl.reason_time if sl is not None else None,
                          partitions=base[n].partitions, features=base[n].features)
        return out

    def next_run(self, t: float) -> float:
        """The first repair run (``repair.run_interval_min`` apart, from hour 0) at or after ``t``."""
        ri = self.run_interval
        return math.ceil(t / ri - 1e-9) * ri

    def _warning(self, n: int, v: dict, seen: float, deadline: float, alive):
        """A health check finds ``v`` (a judge() result) on node ``n``, in a job, at ``seen``.

        First the node agent: the shipped drain rule (``repair.drain.drain_decision``) drains it at once only when
        it cannot run jobs; a warning (the node still runs jobs) it leaves to the repair runs (every
        ``run_interval``), where the real ``plan()`` decides: TTL, blast radius, breaker, approval gate (an
        approval takes ``approval_delay``); in manual mode a person then drains it during business hours. Returns
        True when the node is drained now (its Slurm record drained by us), False when it stays in service (held,
        or ``deadline`` / ``alive()`` came first)."""
        env = self.env
        if seen > env.now:
            yield env.timeout(seen - env.now)
        if not alive() or v["verdict"] == "healthy":
            return False
        sl = self._slurm(n)
        vs = self.vslurm
        vs.resume((sl.name,))
        vs.job_started(sl)
        vs.report(sl, v["report"], float(to_epoch(env.now)))
        dd = self.brain.drain_rule(v, sl, self.fleet_summary((n,), spares=False), self.out_of_service(), env.now)
        if dd.action == "drain":
            self.stats["agent_drains"] += 1
            vs.job_left(sl)
            vs.drain((sl.name,), dd.reason)
            return True
        self.stats["agent_deferred" if dd.action == "defer" else "agent_no_drain"] += 1
        d = yield from self._plan_until(n, sl, self.next_run(env.now), deadline, alive, "drain", self._drain_retry)
        if d is None or d.action != "drain":
            return False  # held, nothing to do (monitoring, a person's call), or too late: it stays in service
        self.stats["plan_drains"] += 1
        vs.job_left(sl)
        vs.drain((sl.name,), drain_reason(d.code, d.gpu))
        return True

    def _drain_retry(self, d) -> float | None:
        """When a node waiting for plan()'s drain is asked again: at a wait's time, the next run while a limit or
        the breaker holds it; None: plan() decided otherwise, the node stays in service."""
        if d.action == "wait":
            return max(to_hours(d.earliest), self.env.now + H)
        if d.action == ACT_HOLD and d.rule in (RULE_BLAST_RADIUS_DRAIN, RULE_BREAKER):
            return self.env.now + H
        return None

    def _plan_until(self, n: int, sl: NodeState, t: float, deadline: float, alive, action: str, retry):
        """Ask plan() about node ``n`` (Slurm record ``sl``) at the repair runs from ``t`` until it decides
        ``action``, approved (an approval takes ``approval_delay``) and, in manual mode, carried out by a person in
        business hours; returns that Decision. A decision of another action ends the asking unless ``retry(d)``
        gives the time to ask again, and is returned. None: ``deadline`` or ``alive()`` came first."""
        env = self.env
        approvals: set = set()
        for _guard in range(200):
            if t >= deadline:
                return None
            yield self.ask(n, sl, t, approvals)
            if not alive():
                return None
            d = self._decided[n]
            if d.hist is not None:
                self.vslurm.history(sl, d.hist)
            if d.action != action:
                again = retry(d)
                if again is None:
                    return d
                t = self.next_run(again)
                continue
            if d.needs_approval and not d.approved:
                approvals.add(d.approval_key)
                t = self.next_run(self.approval_delay(env.now))
                continue
            if self.policy["repair"] == "manual":
                t_h = self.human_ready(env.now)
                if t_h >= deadline:
                    return None
                yield env.timeout(t_h - env.now)
                if not alive():
                    return None
            if d.hist_after is not None:
                self.vslurm.history(sl, d.hist_after)
            return d
        return None

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
            self.job_actions.append((env.now, n, d))
            # d.spare (a hot spare brought in first): the job's empty slot is filled from the idle pool as every
            # swap is (fill_slots), the spare's GPU-hours already counted
            return d.jobs.action
        if (d.action, d.rule) in _KEPT_BY:
            self.job_actions.append((env.now, n, d))
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

    def _by_hand(self, rec: NodeRec, action: str, wait_for_hours: bool = False):
        """A step a person carries out (a held or escalated node, every step in manual mode, a replacement): with a
        limited crew (repair.technicians) it first waits for a free technician, in order of arrival."""
        req = self.techs.request() if self.techs is not None else None
        if req is not None:
            t0 = self.env.now
            yield req
            self.stats["technician_wait_h"] += self.env.now - t0
        try:
            if wait_for_hours:
                yield self.env.timeout(self.human_ready(self.env.now) - self.env.now)
            ok = yield from self._do(rec, action)
        finally:
            if req is not None:
                self.techs.release(req)
        return ok

    def _do(self, rec: NodeRec, action: str):
        """Carry out one repair step; True when the node's fault is fixed."""
        env, rng = self.env, self.rng
        acts = self.rep["actions"]
        dur = acts[action]["duration_min"]["sample"](rng) * H
        if action == "replace":
            dur += self.rep["rma_lead_days"]["sample"](rng) * 24.0
        done_at = env.now + dur  # the step itself ends; its check follows
        yield env.timeout(dur + self.rep["verify_min"]["sample"](rng) * H)
        self.stats["repair_actions"][action] = self.stats["repair_actions"].get(action, 0) + 1
        need = LEVEL[rec.fault["fixed_by"]] if rec.fault else 0
        ok = LEVEL[action] >= need and rng.random() < acts[action]["success"]
        rec.attempts.append((env.now, action, ok, done_at))
        if ok:
            lem = self.sc["lemons"]
            # the cure is drawn only when a repair can miss, so runs without misdiagnosis keep their random streams
            if rec.lemon and LEVEL[action] >= LEVEL[lem["cured_by"]] and (
                    lem["cure_probability"] >= 1.0 or rng.random() < lem["cure_probability"]):
                rec.lemon = False
            rec.fault = None
        return ok

    # --- run ---------------------------------------------------------------------------------------------------------
    def run(self) -> dict:
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


def young(delta: float, m: float) -> float:
    return math.sqrt(2.0 * delta * m)


def daly(delta: float, m: float) -> float:
    if delta >= 2.0 * m:
        return m
    x = delta / (2.0 * m)
    return math.sqrt(2.0 * delta * m) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - delta


def daly_wall(ts: float, tau: float, delta: float, restart: float, m: float) -> float:
    return m * math.exp(restart / m) * (math.exp((tau + delta) / m) - 1.0) * ts / tau
