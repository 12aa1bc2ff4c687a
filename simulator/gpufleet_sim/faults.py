"""Faults: the SimPy processes that strike the fleet, one per fault class, and what a fault does where it lands.

Each class draws from its aggregate rate (exponential or a Weibull fleet-age hazard) and is thinned onto nodes that
can fail now; lemon nodes and false positives have processes of their own. A fault that lands crashes a job, a
rack, or a node, or starts a precursor, silent corruption or a straggler episode; the health checks that see it
then hand the node to the repair runs (repairs.py).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .records import JOB_CHECKPOINT_REQUEUE, JOB_REQUEUE, Failure, H

if TYPE_CHECKING:  # pragma: no cover - types only
    from .jobs import Job


class FaultProcesses:
    """The fault processes of one simulated cluster (a part of ``engine.Sim``)."""

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
        """Every node still a lemon fails at its extra rate (``per_lemon``). A draw at the rate of a pool of
        candidates picks one of them; a candidate cured since (a lemon never becomes one again) leaves the pool at
        that draw, so the rate follows the lemons left. The pool always holds every lemon, so this thinning is
        exact: each lemon's rate is the pool's rate over its size."""
        env, rng = self.env, self.stream("lemons")
        mult = self.sc["lemons"]["multiplier"] - 1.0
        weights = [f["per_node_h"] * mult for f in classes]
        per_lemon = sum(weights)
        if per_lemon <= 0:
            return
        pool = list(self.lemons_initial)
        while pool:
            yield env.timeout(rng.expovariate(per_lemon * len(pool)))
            self.stats["events"] += 1
            i = rng.randrange(len(pool))
            n = pool[i]
            rec = self.recs.get(n)
            if rec is None or not rec.lemon:
                pool[i] = pool[-1]  # cured: out of the pool for good
                pool.pop()
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
