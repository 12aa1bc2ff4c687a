"""A repair run plans every node that needs attention together, with one plan() call (as a run of the repair
playbook does), so a rack-wide fault trips the circuit breaker and max_unavailable holds, exactly as plan() says
for the same inputs (compare tests/integration/repair/test_repair_lab.py's storm test)."""

import copy

import pytest

from ansible_collections.gpufleet.reliability.plugins.module_utils import repair
from gpufleet_sim import scenario as scn
from gpufleet_sim import validate as val
from gpufleet_sim.brain import CollectionBrain, default_brain, to_epoch
from gpufleet_sim.engine import Sim
from gpufleet_sim.policies import resolve

XID63 = "NVRM: Xid (PCI:0000:18:00): 63, pid=48213, name=python, Row remapping pending"


class _Recording(CollectionBrain):
    """The real brain; every repair run's inputs (copied) and its Plan are kept for a direct plan() replay."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.runs = []

    def plan_run(self, nodes, fleet, now_h, approvals=(), breaker=None):
        inputs = (copy.deepcopy(list(nodes)), copy.deepcopy(fleet), to_epoch(now_h), set(approvals),
                  copy.deepcopy(breaker))
        p = super().plan_run(nodes, fleet, now_h, approvals, breaker)
        self.runs.append((inputs, p))
        return p


def _sim(repair_config, policy="passive+auto-repair+hot-spares"):
    sc = scn.load(val.SCENARIOS / "default-1k.yaml")
    fault = next(f for f in sc["faults"] if f["name"] == "faulty_gpu")
    sc["faults"] = []  # the test strikes by hand
    sc["false_positive"] = None
    sc["repair_config"] = repair_config
    brain = default_brain(sc, cls=_Recording)
    return Sim(sc, resolve(policy), 1, brain), brain, fault


def _replay(brain):
    """Every run again, as direct plan() calls on the same inputs: the same decisions and breaker."""
    for (nodes, fleet, now, approvals, breaker), p in brain.runs:
        direct = repair.plan(fleet, nodes, brain.repair_config, now, approvals=approvals, breaker=breaker)
        assert [d.to_dict() for d in direct] == [d.to_dict() for d in p]
        assert direct.breaker == p.breaker


def test_rack_wide_fault_trips_the_breaker():
    """A rack's 16 nodes (PDU/rack event) fail at once: one run plans them together and trips the breaker
    (threshold 10 % of 125 = 13 nodes); every node is held, no step runs until a person resets it."""
    sim, brain, fault = _sim({"breaker": {"fraction": "10%", "min_nodes": 3, "window": "5m"}})
    job = sim.jobs[0]
    rack = list(range(16, 32))  # rack r1, all in the job
    assert all(sim.owner[n] == job.idx for n in rack)

    def strike():
        yield sim.env.timeout(1.0)
        for n in rack:
            sim._crash(job, n, fault)

    sim.env.process(strike())
    sim.env.run(until=1.5)
    assert sim.stats["breaker_trips"] == 1 and sim.breaker is not None and sim.breaker.tripped
    assert sorted(sim.breaker.nodes) == sorted(f"node{n:06d}" for n in rack)
    trip = next(p for _i, p in brain.runs if p.breaker is not None and p.breaker.tripped)
    assert len(trip) == 16 and all(d.action == "hold" and d.rule == "breaker" for d in trip)
    assert sim.stats["repair_actions"] == {}  # nothing repaired while tripped
    _replay(brain)


def test_same_fault_one_node_at_a_time_would_not_trip_it():
    """The control: the same 16 failures spread over runs an hour apart stay below the threshold."""
    sim, brain, fault = _sim({"breaker": {"fraction": "10%", "min_nodes": 3, "window": "5m"}})
    job = sim.jobs[0]

    def strike():
        for n in range(16, 32):
            yield sim.env.timeout(1.0)
            if sim.owner[n] == job.idx:
                sim._crash(job, n, fault)

    sim.env.process(strike())
    sim.env.run(until=20.0)
    assert sim.stats["breaker_trips"] == 0 and sim.stats["repair_actions"]
    _replay(brain)


def test_max_unavailable_holds_across_one_run():
    """Ten nodes warn at once (Xid 63: the agent leaves them in service); with max_unavailable 4 the run drains
    exactly 4 and holds 6, which the next runs drain as the first come back."""
    sim, brain, _fault = _sim({"breaker": {"enabled": False},
                               "blast_radius": {"max_unavailable": 4, "min_healthy": 0}})
    job = sim.jobs[0]
    v = sim.brain.judge((XID63,))
    nodes = list(range(0, 80, 8))  # ten nodes over five racks
    drained_at = {}

    def warn(n):
        def alive():
            return sim.owner[n] == job.idx and not job.done

        ok = yield from sim._warning(n, v, 1.0, 30.0, alive)
        if ok:
            drained_at[n] = sim.env.now
            sim._take_out(n)  # out of service from now on (the job's checkpoint and swap are not under test)

    for n in nodes:
        sim.env.process(warn(n))
    sim.env.run(until=3.0)
    first = [p for _i, p in brain.runs if any(d.action == "drain" for d in p)][0]
    assert len(first) == 10
    assert sorted(d.action for d in first) == ["drain"] * 4 + ["hold"] * 6
    assert {d.rule for d in first if d.action == "hold"} == {"blast_radius_drain"}
    assert len(drained_at) == 4 and sim.out_count == 4
    _replay(brain)


def _precursor_case(action):
    sim, brain, _f = _sim({"breaker": {"enabled": False}, "jobs": {"action": action}}, "passive+auto-repair")
    f = next(x for x in scn.load(val.SCENARIOS / "default-1k.yaml")["faults"] if x["name"] == "gpu_hbm3")
    f = dict(f, visible=1.0)
    job = sim.jobs[0]
    nodes = [3, 40, 77]

    def strike(n):
        yield sim.env.timeout(1.0)
        rec = sim._rec(n)
        rec.state, rec.fault, rec.since = "precursor", f, sim.env.now
        yield from sim._precursor(job, n, f, 6.0, rec.token)

    for n in nodes:
        sim.env.process(strike(n))
    sim.env.run(until=12.0)
    return sim, brain, job


def test_every_job_action_is_one_plan_decision():
    """A warned node drained by us with the job on it: what the engine does to the job is exactly one plan()
    decision (evict, or wait by the draining rule), made on a run whose direct replay gives the same."""
    for action, kind in (("checkpoint_requeue", "evict"), ("requeue", "evict"), ("wait", "wait")):
        sim, brain, job = _precursor_case(action)
        planned = {(inputs[2], d.node, d.action, d.rule, d.jobs.action if d.action == "evict" else None)
                   for inputs, p in brain.runs for d in p}
        assert sim.job_actions, action
        for a in sim.job_actions:
            # a decision the run at that time returned, nothing the engine made up
            assert (to_epoch(a.t), *a[1:]) in planned, (a, planned)
            assert a.action == kind and a.rule == ("evict" if kind == "evict" else "draining")
            assert a.job_action == (action if kind == "evict" else None)
        st = sim.stats
        n = len(sim.job_actions)
        if action == "checkpoint_requeue":
            assert st["evict_checkpoint"] == n and job.lost_work == 0
        elif action == "requeue":
            assert st["evict_requeue"] == n
        else:
            assert st["evict_waited"] == n and st["evict_checkpoint"] == st["evict_requeue"] == 0
        _replay(brain)


class _NeverSettles(CollectionBrain):
    """A brain that answers every repair run with a short wait: a node it is asked about never settles."""

    def plan_run(self, nodes, fleet, now_h, approvals=(), breaker=None):
        when = float(to_epoch(now_h))
        return repair.Plan([repair.Decision(n.name, "wait", "test: never settles", when, rule="test_wait")
                            for n in nodes], breaker)


def test_a_brain_that_never_settles_stops_the_run_naming_its_last_decisions():
    """The repair process gives up after 200 decisions on one node and says which ones came last (the six it kept):
    a run that would loop for ever fails loudly instead."""
    sc = scn.load(val.SCENARIOS / "default-1k.yaml")
    fault = next(f for f in sc["faults"] if f["name"] == "faulty_gpu")
    sc["faults"] = []
    sc["false_positive"] = None
    sim = Sim(sc, resolve("passive+auto-repair+hot-spares"), 1, default_brain(sc, cls=_NeverSettles))
    job = sim.jobs[0]

    def strike():
        yield sim.env.timeout(1.0)
        sim._crash(job, 16, fault)

    sim.env.process(strike())
    with pytest.raises(RuntimeError) as info:  # not: the run went on past 200 decisions on one node
        sim.env.run(until=400.0)
    msg = str(info.value)
    assert msg.startswith("node 16: the repair brain did not settle after 200 decisions; the last: [(")
    assert msg.count("'wait', 'test_wait')") == 6, msg
