"""The engine changes a node's Slurm record only through the virtual Slurm (gpufleet_sim/vslurm.py), and compares
plan()'s rule names with the brain's constants, never with literals of its own. A deliberate violation shows each
check fails."""
import ast
import dataclasses
from pathlib import Path

import pytest

from ansible_collections.gpufleet.reliability.plugins.module_utils.repair import NodeState, model
from gpufleet_sim.vslurm import VirtualSlurm

SIM = Path(__file__).resolve().parents[3] / "simulator" / "gpufleet_sim"
FIELDS = {f.name for f in dataclasses.fields(NodeState)}
RULES = {v for k, v in vars(model).items() if k.startswith("RULE_")}


def _record_names(tree) -> set:
    """Names bound to a node's Slurm record: ``x = self._slurm(n)``, ``x = rec.slurm``, ``x: NodeState`` params."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            v = node.value
            if isinstance(v, ast.IfExp):
                v = v.body
            if (isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and v.func.attr == "_slurm") or (
                    isinstance(v, ast.Attribute) and v.attr == "slurm"):
                names.add(node.targets[0].id)
        elif isinstance(node, ast.arg) and isinstance(node.annotation, ast.Name) and node.annotation.id == "NodeState":
            names.add(node.arg)
    return names


def record_writes(source: str):
    """Assignments to a field of a node's Slurm record (``sl.state = ...``, ``sl.flags, sl.reason = ...``,
    ``rec.slurm.reason = ...``)."""
    tree = ast.parse(source)
    records = _record_names(tree)
    out = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for t in targets:
            for sub in ast.walk(t):
                if not (isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store) and sub.attr in FIELDS):
                    continue
                owner = sub.value
                if (isinstance(owner, ast.Name) and owner.id in records) or (
                        isinstance(owner, ast.Attribute) and owner.attr == "slurm"):
                    out.append((node.lineno, sub.attr))
    return out


def rule_literals(source: str):
    """Rule names written as literals where a decision's ``rule`` is compared."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        if not any(isinstance(x, ast.Attribute) and x.attr == "rule" for n in sides for x in ast.walk(n)):
            continue
        out += [(c.lineno, c.value) for n in sides for c in ast.walk(n)
                if isinstance(c, ast.Constant) and isinstance(c.value, str) and c.value in RULES]
    return out


@pytest.mark.parametrize("path", sorted(p for p in SIM.glob("*.py") if p.name != "vslurm.py"), ids=lambda p: p.name)
def test_no_body_of_the_simulator_writes_a_slurm_record_or_spells_a_rule(path):
    source = path.read_text()
    assert record_writes(source) == [], f"{path.name} writes Slurm record fields itself"
    assert rule_literals(source) == [], f"{path.name} spells plan()'s rule names itself"


def test_the_checks_catch_a_violation():
    bad = "sl = self._slurm(n)\nsl.state, sl.flags = 'idle', x\nrec.slurm.reason_time = 1\nrec.state = 'failed'\n"
    assert record_writes(bad) == [(2, "state"), (2, "flags"), (3, "reason_time")]  # rec.state: the engine's own
    assert rule_literals("if d.rule == 'breaker': pass\nif (d.action, d.rule) in {('wait', 'draining')}: pass\n") \
        == [(1, "breaker"), (2, "draining")]
    assert rule_literals("x = {'breaker': 1}\n") == []  # a scenario key, not a rule compared


def test_slurm_events_as_slurm_shows_them():
    t = [1_800_000_000.0]
    vs = VirtualSlurm(lambda: t[0])
    sl = vs.add(NodeState("node000001", ("gpu",), {"rack": "r0"}))
    vs.job_started(sl)
    vs.drain(["node000001"], "gpufleet: xid79 gpu3")
    assert (sl.state, sl.flags, sl.reason, sl.reason_user, sl.reason_time) == (
        "allocated", frozenset({"DRAIN"}), "gpufleet: xid79 gpu3", "root", t[0])
    assert sl.drained_by("gpufleet:") and sl.busy  # drained, its job still running
    vs.job_left(sl)
    assert sl.state == "idle" and sl.drained_by("gpufleet:")
    t[0] += 60
    vs.not_responding(sl)
    assert (sl.state, sl.reason, sl.reason_user, sl.reason_time) == ("down", "Not responding", "slurm", t[0])
    assert sl.foreign("gpufleet:")  # Slurm's own reason: not ours
    vs.resume(["node000001"])
    assert (sl.state, sl.flags, sl.reason, sl.reason_time) == ("idle", frozenset(), "", None)
    assert not sl.out_of_service
    with pytest.raises(KeyError):
        vs.drain(["node999999"], "gpufleet: x")  # only nodes the cluster has


def test_slurmdbd_events_are_kept_only_when_asked():
    """Nothing feeds a result from slurmdbd's node events or sacct's job runs, so a run keeps them only for
    --export-history (Sim.keep_records); kept or not, the run's result is the same, and an export of a run that
    kept nothing says so instead of writing empty records."""
    from gpufleet_sim import scenario as scn
    from gpufleet_sim import validate as val
    from gpufleet_sim.brain import default_brain
    from gpufleet_sim.engine import Sim
    from gpufleet_sim.export import export_history, sacct_json
    from gpufleet_sim.policies import resolve

    t = [1_800_000_000.0]
    vs = VirtualSlurm(lambda: t[0])
    sl = vs.add(NodeState("node000001", ("gpu",), {"rack": "r0"}))
    vs.drain(["node000001"], "gpufleet: xid79 gpu3")
    vs.resume(["node000001"])
    assert vs.events is None and sl.reason == ""
    vs.events = []
    vs.drain(["node000001"], "gpufleet: xid79 gpu3")
    t[0] += 60
    vs.resume(["node000001"])
    assert vs.events == [["node000001", t[0] - 60, t[0], "DRAIN", "gpufleet: xid79 gpu3", "root"]]

    sc = scn.validate(scn.override(scn.load(val.SCENARIOS / "default-1k.yaml")["raw"], {"horizon_days": 20}))
    pol = resolve("passive+auto-repair+hot-spares")
    plain, kept = Sim(sc, pol, 3, default_brain(sc)), Sim(sc, pol, 3, default_brain(sc))
    kept.keep_records(histories=False, reports=False)
    a, b = plain.run(), kept.run()
    assert a == b and a["stats"]["repairs"] > 0
    assert plain.vslurm.events is None and all(job.runs is None for job in plain.jobs)
    assert len(kept.vslurm.events) >= a["stats"]["repairs"] and all(job.runs for job in kept.jobs)
    assert kept.vslurm.history_log is None and kept.vslurm.report_log is None
    assert sacct_json(kept)["jobs"]
    with pytest.raises(ValueError, match="kept no records"):
        sacct_json(plain)
    with pytest.raises(ValueError, match="kept no records"):
        export_history(plain, Path("/nonexistent/never-written"))
