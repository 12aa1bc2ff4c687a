"""Repair runs: the node agent's drain rule and the repair policy's ``plan()`` at every run, and the steps they
decide, carried out with the scenario's durations and success probabilities.

A sick node is asked on the first repair run at or after the time it needs one (``ask``); one ``plan()`` call plans
every node of a run together, as one run of the repair playbook does. Every change to a node's Slurm record goes
through the virtual Slurm (vslurm.py).
"""

from __future__ import annotations

import math

import simpy

from ansible_collections.gpufleet.reliability.plugins.module_utils.repair import NodeState, loads
from ansible_collections.gpufleet.reliability.plugins.module_utils.repair.drain import wants_drain
from ansible_collections.gpufleet.reliability.plugins.module_utils.repair.fleet import DOMAIN_PREFIXES
from ansible_collections.gpufleet.reliability.plugins.module_utils.repair.model import (
    RULE_BLAST_RADIUS_DRAIN,
    RULE_BREAKER,
    RULE_LEMON,
)
from ansible_collections.gpufleet.reliability.plugins.module_utils.slurm.node import Node
from ansible_collections.gpufleet.reliability.plugins.module_utils.slurmfacts import drain_reason

from .brain import PARTITION, to_epoch, to_hours
from .records import ACT_HOLD, Failure, H, NodeRec
from .scenario import LEVEL

#: the node feature that names a node's rack, as the Slurm adapter reads it (``rack_r12``: rack r12)
RACK_FEATURE = DOMAIN_PREFIXES["rack"]


class RepairRuns:
    """The repair runs of one simulated cluster (a part of ``engine.Sim``)."""

    def ask(self, n: int, sl: NodeState, at: float, approvals: set) -> tuple:
        """Put node ``n`` on the first repair run at or after ``at``; return the run's event and the run's answers:
        once the event has fired, ``answers[n]`` is the node's Decision. Every node on one run is planned by one
        plan() call, the way one run of the repair playbook plans them all (two processes asking about one node on
        one run read the same Decision). The answers live as long as the processes that asked hold them."""
        env = self.env
        now = env.now
        t = self.next_run(at if at > now else now)
        run = self._runs.get(t)
        if run is None:
            ev = env.timeout(t - now, t)
            ev.callbacks.append(self._repair_run)  # first callback: plans before any waiting node resumes
            run = self._runs[t] = (ev, {}, {})
        run[1][n] = (sl, approvals)
        return run[0], run[2]

    def _repair_run(self, event: simpy.Event) -> None:
        """The repair run at ``event.value`` (its time): plan every node on it together."""
        _ev, batch, decided = self._runs.pop(event.value)
        stats = self.stats
        k = len(batch)
        stats["brain_calls"] += 1
        stats["decisions"] += k
        if k > stats["peak_run"]:
            stats["peak_run"] = k
        if k == 1:  # the usual run: one node
            ((only, (sl, approvals)),) = batch.items()
            nodes = [sl]
        else:
            approvals = set()
            for _sl, ap in batch.values():
                approvals |= ap
            nodes = [v[0] for v in batch.values()]
        p = self.brain.plan_run(nodes, self.fleet_summary(batch), self.env.now, approvals, self.breaker)
        brk = p.breaker
        if brk is not None:
            if brk.tripped and not (self.breaker is not None and self.breaker.tripped):
                stats["breaker_trips"] += 1
            self.breaker = brk
        if k == 1:
            decided[only] = p[0]
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
        if sl.jobs != ():  # the job has left the node (evicted, or crashed off it): Slurm shows no job on it
            vs.jobs(sl, ())  # (None, "not read", left by a released node, would hold an open eviction for ever)
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
        seen: list = []  # the last decisions before the guard gives up (for its error)
        for _guard in range(200):
            run, answers = self.ask(n, sl, at, approvals)
            yield run
            d = answers[n]
            if _guard >= 194:
                seen.append((round(env.now, 2), d.action, d.rule))
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
            raise RuntimeError(f"node {n}: the repair brain did not settle after 200 decisions; the last: {seen[-6:]}")
        self.stats["repairs"] += 1
        self.stats["mttr"].append(env.now - out_since)
        self._bring_back(n)
        self.node_returns(n)

    # --- warnings: the agent's drain rule, then the repair runs' plan() ---------------------------------------------
    def _slurm(self, n: int) -> NodeState:
        """The node's virtual Slurm record (kept with its repair history for the node's life)."""
        rec = self._rec(n)
        if rec.slurm is None:
            rack = self.rack_names[n // self.rack]
            rec.slurm = self.vslurm.add(NodeState(f"node{n:06d}", (PARTITION,), {"rack": rack}))
        return rec.slurm

    def slurm_nodes(self) -> list:
        """Every node's Slurm record as the agent reads it (``sinfo``), as the Slurm adapter's ``Node``: name, state,
        flags, reason and its time, partition, rack feature. Nodes in service share one prebuilt record each; out
        of service: its own."""
        base = self._in_service
        if base is None:
            base = self._in_service = [Node(f"node{n:06d}", "allocated", partitions=[PARTITION],
                                            features=[f"{RACK_FEATURE}_{self.rack_names[n // self.rack]}"])
                                       for n in range(self.N)]
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
            run, answers = self.ask(n, sl, t, approvals)
            yield run
            if not alive():
                return None
            d = answers[n]
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

    def _do(self, rec: NodeRec, action: str):
        """Carry out one repair step; True when the node's fault is fixed."""
        env, rng = self.env, self.rng
        acts = self.rep["actions"]
        dur = acts[action]["duration_min"]["sample"](rng) * H
        then = acts[action].get("then")
        staged = then is not None and rng.random() < then["probability"]
        if staged:  # the step's second stage (drawn only when the scenario has one: other runs keep their streams)
            dur += then["duration_min"]["sample"](rng) * H
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
            cure = lem["cure_probability_then"] if staged else lem["cure_probability"]
            # the cure is drawn only when a repair can miss, so runs without misdiagnosis keep their random streams
            if rec.lemon and LEVEL[action] >= LEVEL[lem["cured_by"]] and (cure >= 1.0 or rng.random() < cure):
                rec.lemon = False
            rec.fault = None
        return ok
