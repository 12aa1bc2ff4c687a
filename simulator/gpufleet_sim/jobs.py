"""A training job: compute, checkpoints, interruptions and restarts, as a SimPy process."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import simpy

from .records import Failure, H

if TYPE_CHECKING:  # pragma: no cover - types only
    from .engine import Sim


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
        self.standby: list[int] = []  # the job's warm standbys (idle nodes kept for it; spec standbys)
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
        self.poked: simpy.Event | None = None  # the interrupt on its way to the job's process (see poke)
        self.seg_start, self.seg_rate = 0.0, 1.0
        #: the job's runs as Slurm's accounting records them: (start_h, end_h, state); a run ends at a crash
        #: (NODE_FAIL, or FAILED for a fault of the job's own software), a drain's requeue (REQUEUED) or the end.
        #: None keeps nothing (no result reads them): Sim.keep_records() makes it a list for export.py
        self.runs: list[tuple[float, float, str]] | None = None
        self.run_start = sim.env.now
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
                t = env.timeout(self.jf_next - now)
                try:
                    yield t
                except simpy.Interrupt:
                    env.abandon(t)
                    return False
                self.jf_next = env.now + self.jrng.expovariate(self.jf_rate)
                self.sim.job_fault(self)
                return False
        t = env.timeout(dt)
        try:
            yield t
        except simpy.Interrupt:
            env.abandon(t)  # its time would still come, for nobody: out of SimPy's queue
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
        self.end_run("COMPLETED")
        self.sim.job_done(self)

    def end_run(self, state: str) -> None:
        """The current run ends now with ``state`` (when one is under way)."""
        if self.run_start is not None:
            if self.runs is not None:
                self.runs.append((self.run_start, self.sim.env.now, state))
            self.run_start = None

    def _recover(self):
        env = self.sim.env
        t0 = env.now
        # one pass over the failures (usually one): any not planned (a crash), any of the job's own software, the
        # oldest rollback of a silent corruption
        planned, own, rb = True, False, []
        for f in self.pending:
            if not f.planned:
                planned = False
            if f.fault.get("scope") == "job":
                own = True
            if f.rollback_to is not None:
                rb.append(f.rollback_to)
        self.end_run("REQUEUED" if planned else "FAILED" if own else "NODE_FAIL")
        # roll back to the last checkpoint
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
        self.run_start = env.now

    def interrupt(self, failure: Failure) -> None:
        self.pending.append(failure)
        self.poke()

    def poke(self) -> None:
        """Wake the job's process: it reads the news (``pending``, ``rate``) when it wakes. One interrupt on its way
        is enough: a rack's outage fails every node of the job in the rack at one instant, and an interrupt for
        each would only end and begin again the sleep the first one began (the job already holds every failure),
        with no random draw in between; a second interrupt could also end the wait for a swap early."""
        if not self.proc.is_alive or self.sim.env.active_process is self.proc:
            return
        if self.poked is not None and not self.poked.processed:
            return  # one is on its way
        self.poked = simpy.events.Interruption(self.proc, None)  # what Process.interrupt() makes, kept

    def set_rate(self) -> None:
        r = 1.0
        for s in self.slow.values():
            r *= 1.0 - s
        self.rate = max(r, 1e-6)
        if self.computing and self.phase == "compute":
            self.poke()
