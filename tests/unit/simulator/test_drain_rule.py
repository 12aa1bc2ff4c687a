"""The engine drains as the shipped bodies do: the node agent's one drain rule (repair.drain.drain_decision), then the
repair run's plan() at its run interval - never a rule of its own (issue: the engine drained every degraded verdict
that carried a repair step, e.g. the Xid 63 precursor the agent leaves in service)."""

import pytest

from ansible_collections.gpufleet.reliability.plugins.module_utils import repair
from ansible_collections.gpufleet.reliability.plugins.module_utils.repair.drain import drain_decision, wants_drain
from ansible_collections.gpufleet.reliability.plugins.module_utils.slurm.repair_inputs import drain_inputs
from gpufleet_sim import scenario as scn
from gpufleet_sim import validate as val
from gpufleet_sim.brain import default_brain, to_epoch
from gpufleet_sim.engine import Sim
from gpufleet_sim.policies import resolve

XID63 = "NVRM: Xid (PCI:0000:18:00): 63, pid=48213, name=python, Row remapping pending"


def _sim(policy="passive+auto-repair+hot-spares", mode="automatic"):
    sc = scn.load(val.SCENARIOS / "default-1k.yaml")
    sc["faults"] = []  # no fault process: the test drives one warning by hand
    sc["false_positive"] = None
    return Sim(sc, resolve(policy), 1, default_brain(sc, mode)), sc


def _direct(sim, v, name, cfg, now):
    """The rule on the whole fleet read node by node, as the agent reads Slurm (the adapter's drain_inputs)."""
    read = drain_inputs(sim.slurm_nodes(), name)
    return drain_decision(v["report"], read.me, read.fleet, read.before, cfg, now, reason=v["drain_reason"])


def _drive(sim, n, v, seen, deadline=float("inf")):
    out = {}

    def proc():
        out["drained"] = yield from sim._warning(n, v, seen, deadline, lambda: True)
        out["at"] = sim.env.now

    sim.env.process(proc())
    sim.env.run(until=seen + 48.0)
    return out


def test_default_xid63_precursor_is_not_drained_by_the_agent():
    """judge() gives degraded reset_gpu drain=False; the agent's rule does nothing; the engine asks the same rule."""
    sim, _sc = _sim()
    pre = next(f for f in scn.load(val.SCENARIOS / "default-1k.yaml")["faults"]
               if f["name"] == "gpu_hbm3")["precursor"]["kmsg"]
    assert tuple(pre) == (XID63,)
    v = sim.brain.judge(tuple(pre))
    assert (v["verdict"], v["action"], bool(v["report"].get("drain"))) == ("degraded", "reset_gpu", False)
    assert not wants_drain(v["report"])
    direct = _direct(sim, v, "node000000", sim.brain.repair_config, to_epoch(1.0))
    assert direct.action == "none"
    seen = 1.0 + 1.0 / 60  # 01:01, between two repair runs (every 5 min)
    out = _drive(sim, 0, v, seen)
    assert (sim.stats["agent_drains"], sim.stats["agent_deferred"], sim.stats["agent_no_drain"]) == (0, 0, 1)
    # ... but the repair run's plan() drains it, after the TTL, at a run: the same answer as direct plan() calls
    assert out["drained"] is True and sim.stats["plan_drains"] == 1
    cfg = sim.brain.repair_config
    node = repair.NodeState("node000000", ("gpu",), {"rack": "r0"}, state="allocated", report=v["report"],
                            report_time=float(to_epoch(seen)))
    fleet = sim.fleet_summary([0])
    t = sim.next_run(seen)
    while True:
        d = repair.plan(fleet, (node,), cfg, to_epoch(t))[0]
        if d.action != "wait":
            break
        node.history = d.hist
        t = sim.next_run(max((d.earliest - to_epoch(0)) / 3600.0, t + 1 / 60))
    assert d.action == "drain"
    assert abs(out["at"] - t) < 1e-9
    assert out["at"] >= seen + cfg.ttl_s / 3600.0
    rec = sim.recs[0].slurm
    assert rec.drained_by(cfg.reason_prefix) and rec.history is not None


def test_unhealthy_warning_is_left_by_the_agent_and_drained_by_the_repair_run():
    """Xid 79 in the kernel log while the GPU still answers (a warning): the agent's rule defers it, and the
    repair run's plan() drains it, after the TTL, at a run."""
    sim, _sc = _sim()
    v = sim.brain.judge(("NVRM: Xid (PCI:0000:18:00): 79, pid=1, name=python, GPU has fallen off the bus.",))
    assert wants_drain(v["report"])
    direct = _direct(sim, v, "node000003", sim.brain.repair_config, to_epoch(2.0))
    assert (direct.action, direct.rule) == ("defer", "one_writer")
    out = _drive(sim, 3, v, 2.0)
    cfg = sim.brain.repair_config
    assert out["drained"] is True and out["at"] >= 2.0 + cfg.ttl_s / 3600.0 - 1e-9
    assert sim.stats["agent_drains"] == 0 and sim.stats["agent_deferred"] == 1 and sim.stats["plan_drains"] == 1
    assert sim.brain.calls["drain_rule"] == 1
    assert sim.recs[3].slurm.drained_by(cfg.reason_prefix)


def test_a_warning_stays_in_service_when_max_unavailable_is_reached():
    """With a fifth of the partition out of service, the agent defers the warning and plan() holds it: the node
    stays in service (the old engine drained it anyway)."""
    sim, _sc = _sim()
    v = sim.brain.judge(("NVRM: Xid (PCI:0000:18:00): 79, pid=1, name=python, GPU has fallen off the bus.",))
    cfg = sim.brain.repair_config
    out_n = int(sim.N * cfg.max_unavailable.share) + 1
    for n in range(20, 20 + out_n):  # out of service, not by us (no breaker), spread across racks
        sim._take_out(n)
    direct = _direct(sim, v, "node000003", cfg, to_epoch(2.0))
    assert direct.action == "defer"
    out = _drive(sim, 3, v, 2.0, deadline=6.0)
    assert out["drained"] is False
    assert sim.stats["agent_deferred"] == 1 and sim.stats["agent_drains"] == 0 and sim.stats["plan_drains"] == 0


def test_monitor_report_is_never_drained():
    """'monitor' (the brain's no-step action) is not a reason to drain; the old engine tested a made-up 'observe'."""
    sim, _sc = _sim()
    v = sim.brain.judge(("NVRM: Xid (PCI:0000:18:00): 63, pid=1, name=python, Row remapping pending",))
    v = dict(v, action="monitor", report=dict(v["report"], action="monitor", verdict="degraded"))
    assert not wants_drain(v["report"])
    out = _drive(sim, 5, v, 1.0)
    assert out["drained"] is False and sim.stats["plan_drains"] == 0


def test_run_interval_is_validated_naming_the_field():
    raw = scn.load(val.SCENARIOS / "default-1k.yaml")["raw"]
    for bad in (0, -5, 1e9):
        with pytest.raises(scn.SpecError, match=r"repair\.run_interval_min"):
            scn.validate(scn.override(raw, {"repair.run_interval_min": bad}))
    assert scn.validate(scn.override(raw, {"repair.run_interval_min": 15}))["repair"]["run_interval_min"] == 15


class _RuleChecked:
    """The real brain; every drain-rule answer is checked against drain_decision() on every node's Slurm record
    (what the agent reads), so the engine's fleet counts give the agent's very decision."""

    def __init__(self, real):
        self.real, self.calls, self.checked, self.sim = real, real.calls, [], None
        self.repair_config = real.repair_config

    def judge(self, lines):
        return self.real.judge(lines)

    def healthy_report(self):
        return self.real.healthy_report()

    def plan_run(self, *args):
        return self.real.plan_run(*args)

    def drain_rule(self, verdict, me, fleet, before, now_h):
        d = self.real.drain_rule(verdict, me, fleet, before, now_h)
        full = _direct(self.sim, verdict, me.name, self.repair_config, to_epoch(now_h))
        assert (d.action, d.rule, d.forced, d.reason, d.breaker, d.check_at) == (
            full.action, full.rule, full.forced, full.reason, full.breaker, full.check_at)
        self.checked.append(d.action)
        return d


def test_engine_drain_rule_equals_drain_decision_on_whole_runs():
    """Many false positives (Xid 119, unhealthy: the agent's rule decides each) under tight limits: every answer
    the engine gets equals drain_decision() on the full node list; the agent defers every one (a false positive
    still runs jobs), and the repair runs drain some and hold others."""
    sc = scn.load(val.SCENARIOS / "default-1k.yaml")
    sc["false_positive"] = dict(sc["false_positive"], per_node_h=40 / 1000 / 24)  # 40 per 1,000 node-days
    sc["repair_config"] = {"blast_radius": {"max_unavailable": 20, "min_healthy": 0},
                           "breaker": {"fraction": "2%", "min_nodes": 3, "window": "1d"}}
    brain = _RuleChecked(default_brain(sc))
    sim = Sim(sc, resolve("passive+auto-repair+hot-spares"), 3, brain)
    brain.sim = sim
    sim.run()
    assert brain.checked.count("defer") > 50
    assert set(brain.checked) <= {"defer", "none"}, brain.checked  # "none": a degraded report asks no drain
    assert sim.stats["plan_drains"] > 0 and sim.stats["agent_drains"] == 0
