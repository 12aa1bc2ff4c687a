# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""End to end in the Slurm lab: the real agent drains a sick node, repair.yml (through ansible-runner, as AWX runs
it) resets the GPU, reboots through RebootProgram, verifies and resumes, and ``gpufleet-sim calibrate --nodes``
reads the history it wrote; replace + hot spare; foreign drains are never touched; a storm trips the breaker; a
crash converges; approval mode applies exactly the approved steps."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from support.repair_lab import REPO, wait_until

SCENARIO = REPO / "simulator" / "scenarios" / "default-1k.yaml"

pytestmark = [pytest.mark.lab, pytest.mark.scenario]  # scenario: dealt between the releases (conftest)


def _idle(rl, node):
    # the state only: Slurm 24.11 keeps the last reason on a resumed node (22.05 clears it), and a reason means
    # something only while the node is drained or down (docs/slurm.md)
    return lambda: rl.lab.node_states()[node][0] == "idle"


@pytest.mark.scenario(weight=3)  # about 3 times a typical scenario (--durations)
def test_reset_then_reboot_then_resume_and_replace_with_spare(repair_lab):
    rl = repair_lab
    lab = rl.lab
    n1, n2, n3, spare = lab.nodes[0], lab.nodes[1], lab.nodes[2], lab.nodes[-1]
    rl.spare(spare)
    # someone else's drain, on a node that is also sick: never touched
    lab.run("scontrol", "update", f"NodeName={n1}", "State=DRAIN", "Reason=maintenance: dimm swap")
    rl.inject(n1, "xid79", "never")
    # fault 1: Xid 48 (DBE + row remap) on GPU 3 that a GPU reset does not fix but a reboot does
    rl.inject(n2, "xid48", "reboot")
    state, reason = rl.drained_by_agent(n2)
    assert reason.startswith("gpufleet: xid48 gpu3")

    runs = rl.until(_idle(rl, n2), runs=4)
    assert len(rl.resets()) == 1 and f" {n2} -r -i 3" in rl.resets()[0]
    assert [ln for ln in rl.reboots() if f"node={n2}" in ln], rl.reboots()
    first = runs[0]["gpufleet_repair_plan"]["decisions"]
    assert {d["node"]: d["action"] for d in first}[n2] == "reset_gpu"
    h = rl.history(n2)
    assert "i" not in h and h["p"].startswith("gm") and "g" in h["r"] and "b" in h["r"], h
    results = [r for art in runs for r in art.get("gpufleet_repair_result", [])]
    assert any(r["node"] == n2 and r["action"] == "reboot" and r["verified"] == "healthy" for r in results), results
    _calibrate_reads_the_history(rl)

    # the foreign drain is exactly as it was
    assert lab.node_states()[n1] == ("drained", "maintenance: dimm swap")
    assert rl.history(n1) == {}
    held = {d["node"]: d for d in first}[n1]
    assert (held["action"], held["rule"]) == ("hold", "not_ours")

    # fault 2: the GPU fell off the bus and stays off: reboot, then a replacement, which waits for a person by
    # default (approval_for: [replace]); approved, it goes through the hook and the spare joins
    rl.inject(n3, "xid79", "never")
    rl.drained_by_agent(n3)
    runs = rl.until(lambda: any(d["node"] == n3 and d["action"] == "replace" and d["needs_approval"]
                                for d in rl.last["gpufleet_repair_plan"]["decisions"]), runs=4)
    waiting = runs[-1]["gpufleet_repair_plan"]
    assert waiting["pending_approval"] == [f"{n3}:replace:1"], waiting
    assert rl.hook_calls() == [] and lab.node_states()[spare][0] != "idle"
    _r, art = rl.run(node_repair_approvals=waiting["pending_approval"])
    assert lab.wait_for(spare, "idle", timeout=20)[0] == "idle", art
    calls = rl.hook_calls()
    assert len(calls) == 1 and calls[0]["node"] == n3 and calls[0]["action"] == "replace", calls
    assert calls[0]["idempotency_key"].startswith("gpufleet-")
    state3, reason3 = lab.node_states()[n3]
    assert state3 in ("drained", "down") and reason3.startswith("gpufleet: replace"), (state3, reason3)
    assert rl.history(n3)["i"]["sp"] == spare
    # two more runs: the replacement stays pending (a run that checked the still-broken node and failed the
    # replace escalated it, seen in CI); nothing is called twice, the spare stays in service
    for _unused in range(2):
        _r, art = rl.run()
        d3 = {d["node"]: d for d in art["gpufleet_repair_plan"]["decisions"]}[n3]
        assert (d3["action"], d3["verify"]) == ("wait", False) and len(rl.hook_calls()) == 1, (d3, rl.history(n3))
    assert lab.wait_for(spare, "idle", timeout=20)[0] == "idle"  # idle* for ~1-2 s after a resume
    assert lab.node_states()[n1] == ("drained", "maintenance: dimm swap")


def _calibrate_reads_the_history(rl):
    """What repair.yml wrote into the node's Extra, read back as a site would (a dump of Slurm's node records) by
    ``gpufleet-sim calibrate --nodes``: one incident of the Xid 48 class, its reset failed, its reboot cured it."""
    dump = rl.tmp / "nodes.jsonl"
    dump.write_text(rl.lab.node_records() + "\n")
    r = subprocess.run([sys.executable, "-m", "gpufleet_sim.cli", "calibrate", str(SCENARIO), "--nodes", str(dump),
                        "--json", "-"], capture_output=True, text=True, timeout=300, check=False,
                       cwd=REPO / "simulator")
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads(r.stdout[r.stdout.index("{"):])["repairs"]
    acts = rep["actions"]
    assert rep["incidents"] == 1 and set(rep["need"].values()) == {"reboot"}, (rep, dump.read_text()[-2000:])
    assert (acts["reset_gpu"]["failed"], acts["reset_gpu"]["cured"]) == (1, 0), acts
    assert (acts["reboot"]["cured"], acts["reboot"]["failed"]) == (1, 0), acts
    assert not rep["unreadable"], rep


@pytest.mark.scenario(weight=2)  # about 2 times a typical scenario (--durations)
def test_storm_trips_the_breaker_and_limits_the_blast_radius(repair_lab):
    rl = repair_lab
    lab = rl.lab
    sick = lab.nodes[: max(2, len(lab.nodes) // 2)]
    for n in sick:
        rl.inject(n, "xid48", "reset_gpu")
    for n in sick:
        rl.drained_by_agent(n)

    # 1. breaker: half the fleet failed within 5 minutes -> nothing is acted on, nothing resumed, state persisted
    cfg = {"breaker": {"fraction": "50%", "min_nodes": 2, "window": "5m"}}
    r, art = rl.run(ok=False, config=cfg)  # a tripped breaker fails the run: cron mails it, AWX shows "failed"
    plan = art["gpufleet_repair_plan"]
    summary = art["gpufleet_repair_summary"]
    assert any("circuit breaker tripped" in p for p in summary["problems"]), summary
    assert "circuit breaker tripped" in r.output and "repair run:" in r.output
    # each held node says so in Slurm (sinfo / scontrol show node), with the agent's finding
    for n in sick:
        assert lab.node_states()[n] == ("drained", "gpufleet: held (xid48): circuit breaker tripped, a person "
                                                   "checks the fleet and resets it"), lab.node_states()[n]
    assert plan["breaker"]["tripped"] and sorted(plan["breaker"]["nodes"]) == sorted(sick)
    assert rl.breaker()["tripped"] is True
    assert rl.resets() == [] and rl.reboots() == []
    assert all(d["action"] == "hold" for d in plan["decisions"])
    # the run's metrics for node_exporter say so too (the GpufleetRepairBreakerOpen alert reads them)
    prom = (rl.tmp / "gpufleet_repair.prom").read_text()
    assert "gpufleet_repair_breaker_open 1" in prom and 'gpufleet_repair_decisions{action="hold"}' in prom
    assert all(lab.node_states()[n][0] == "drained" for n in sick)
    # it stays tripped on the next run (persisted), even with the faults now older than the window
    _r, art = rl.run(ok=False, config=dict(cfg, breaker={"fraction": "50%", "min_nodes": 2, "window": 1}))
    assert art["gpufleet_repair_plan"]["breaker"]["tripped"] and rl.resets() == []

    # 2. a person resets the breaker; with max_unavailable 1 only one node is repaired at a time
    limited = {"breaker": {"enabled": False}, "blast_radius": {"max_unavailable": 1, "min_healthy": 0}}
    _r, art = rl.run(config=limited, node_repair_breaker_reset=True)
    assert not rl.breaker()["tripped"]
    acted = [d for d in art["gpufleet_repair_plan"]["decisions"] if d["runnable"]]
    assert len(acted) == 1 and len(rl.resets()) == 1
    # nothing unhealthy was resumed: every sick node not yet repaired is still drained
    fixed = acted[0]["node"]
    assert lab.wait_for(fixed, "idle", timeout=20)[0] == "idle"  # idle* for ~1-2 s after a resume
    assert all(lab.node_states()[n][0] == "drained" for n in sick if n != fixed)


@pytest.mark.scenario(weight=2)  # about 2 times a typical scenario (--durations)
def test_crash_in_the_middle_of_a_repair_converges(repair_lab):
    rl = repair_lab
    lab = rl.lab
    n2 = lab.nodes[1]
    rl.inject(n2, "xid48", "reboot")
    rl.drained_by_agent(n2)
    rl.run(ok=False)  # reset_gpu, verification fails (the fault needs a reboot): a failed run
    assert len(rl.resets()) == 1 and lab.node_states()[n2][0] == "drained"
    # the next run reboots; kill it as soon as it has written its intent (before or just after Slurm takes the
    # reboot: both must converge with exactly one reboot)
    proc = rl.start_async()

    def intent_written():
        steps = rl.history(n2).get("i", {}).get("s", [])
        return bool(steps) and steps[-1][0] == "b"

    try:
        wait_until(lambda: intent_written() or proc.poll() is not None, timeout=120, what="reboot intent")
    finally:
        rl.kill(proc)
    h = rl.history(n2)
    assert h["i"]["s"][-1][0] == "b" and h["i"]["s"][-1][2] is None, h  # the intent log shows the pending reboot
    # run again: it converges (verifies the reboot, resumes), never reboots twice
    rl.until(_idle(rl, n2), runs=3)
    assert len([ln for ln in rl.reboots() if f"node={n2}" in ln]) == 1
    assert "i" not in rl.history(n2)
    # no node is left drained without a pending action or an escalation
    _r, art = rl.run()
    states = lab.node_states()
    for d in art["gpufleet_repair_plan"]["decisions"]:
        if states[d["node"]][0] in ("drained", "down"):
            assert d["action"] != "hold" or d["rule"] in ("escalated", "not_ours"), d


@pytest.mark.scenario(weight=2)  # about 2 times a typical scenario (--durations)
def test_approval_mode_changes_nothing_before_approval(repair_lab, tmp_path):
    rl = repair_lab
    lab = rl.lab
    n2 = lab.nodes[1]
    rl.inject(n2, "xid48", "reboot")
    rl.drained_by_agent(n2)
    before = lab.node_states()
    cfg = {"modes": {"default": "approval"}}
    _r, art = rl.run(config=cfg)
    plan = art["gpufleet_repair_plan"]
    assert plan["pending_approval"] == [f"{n2}:reset_gpu:1"]
    assert lab.node_states() == before and rl.resets() == [] and rl.reboots() == []

    # AWX workflow: after the approval node, the apply job gets the plan job's artifacts as extra vars and
    # approves exactly what was published
    # the reset runs and its verification fails (the fault needs a reboot): a failed run
    _r, art = rl.run(ok=False, config=cfg, gpufleet_repair_plan=plan, node_repair_approve_published=True)
    assert len(rl.resets()) == 1 and rl.reboots() == []
    assert lab.node_states()[n2][0] == "drained"
    # the reboot is the next step and needs its own approval; the old approvals do not cover it
    approvals = tmp_path / "approvals.json"
    approvals.write_text(f'["{n2}:reset_gpu:1"]')
    _r, art = rl.run(config=cfg, node_repair_approvals_file=str(approvals))
    assert art["gpufleet_repair_plan"]["pending_approval"] == [f"{n2}:reboot:1"]
    assert art["gpufleet_repair_plan"]["unused_approvals"] == [[n2, "reset_gpu", "1"]]
    assert rl.reboots() == [] and len(rl.resets()) == 1
    # approved in an approvals file: the reboot runs, is verified, and the node is resumed in the same run (a
    # verified resume belongs to the approved step)
    approvals.write_text(f'["{n2}:reboot:1"]')
    _r, art = rl.run(config=cfg, node_repair_approvals_file=str(approvals))
    assert len(rl.reboots()) == 1
    assert lab.wait_for(n2, "idle", timeout=20)[0] == "idle"  # idle* for ~1-2 s after a resume
    assert art["gpufleet_repair_plan"]["unused_approvals"] == []
    # the other nodes were never touched
    assert all(lab.node_states()[n] == before[n] for n in lab.nodes if n != n2)
