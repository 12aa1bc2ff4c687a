# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Repair safety in the Slurm lab, as an SRE tries it: an operator's drain always wins over our history (after a
crashed or cancelled run, during our reboot, before a replacement); one bad node does not stop the others; the run
says what it did and fails when it could not do what the policy decided; check mode predicts; the project's own
agent works as the verify command; the webhook form of the replacement hook."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ansible_collections.gpufleet.reliability.plugins.module_utils.slurm import SlurmClient
from support.procs import processes_with
from support.repair_lab import wait_until

pytestmark = [pytest.mark.lab, pytest.mark.scenario]  # scenario: dealt between the releases (conftest)

OPS = "ops: cable"


def _decisions(art):
    return {d["node"]: d for d in art["gpufleet_repair_plan"]["decisions"]}


def _kill_after_intent(rl, node, step="b", sig=signal.SIGKILL, taken=False):
    """Start repair.yml, wait until it wrote the intent for ``step`` on ``node`` (and, with ``taken``, until Slurm
    ran the reboot), then send ``sig`` to its process group and reap it.

    The run's verification waits for a flag this function sets once the run is gone, so the kill always lands
    between the intent and the step's outcome (the steps are quick enough now that a loaded machine's poll could
    see the intent only after the run had verified and closed the incident). SIGTERM and SIGINT end the task in
    flight too (Ansible passes them to its workers); after SIGKILL the workers (setsid) finish it, and the flag
    lets a blocked verification end with no run left to start a further task."""
    flag = rl.tmp / f"release-{rl.runs}"
    proc = rl.start_async(node_repair_verify_command=["bash", "-c", f"until [ -e {flag} ]; do sleep 0.2; done"])

    def ready():
        steps = rl.history(node).get("i", {}).get("s", [])
        done = bool(steps) and steps[-1][0] == step and steps[-1][2] is None
        if done and taken:
            done = any(f"node={node}" in ln for ln in rl.reboots())
        return done or proc.poll() is not None

    try:
        wait_until(ready, timeout=180, what=f"{step} intent on {node}")
        assert proc.poll() is None, "the run ended before it could be interrupted"
        _stop(proc, sig)
    finally:
        flag.touch()
        rl.kill(proc)
    # Ansible's workers outlive the kill of the run (setsid) and finish the task in flight, which may be the reboot:
    # wait until none is left and Slurm has carried out a reboot they asked for, so what follows sees all of it
    varfile = str(proc.args[-1]).lstrip("@").encode()
    wait_until(lambda: not processes_with(varfile), timeout=120, interval=0.2, what="the killed run's workers")
    wait_until(lambda: not REBOOTING & set(SlurmClient(backend="cli").node(node).flags), timeout=120,
               interval=0.5, what=f"a reboot of {node} asked for by the killed run")
    steps = rl.history(node)["i"]["s"]
    assert steps[-1][0] == step and steps[-1][2] is None, rl.history(node)


REBOOTING = {"REBOOT_REQUESTED", "REBOOT_ISSUED"}


def _stop(proc, sig, again_after=3.0, timeout=60):
    """Send ``sig`` to the run's process group, and again every ``again_after`` seconds while the run lives, as a
    person does who pressed Ctrl-C and still sees the run going.

    SIGKILL and SIGTERM end ansible-playbook the first time (its SIGTERM handler re-sends the signal to itself
    with the default action). A first SIGINT may be lost: ansible-core's handler restores the default action and
    raises KeyboardInterrupt, which CPython drops as unraisable when the signal lands in a weakref callback or an
    at-fork hook - both run at every task's worker start - so the run goes on. The second SIGINT ends it."""
    deadline = time.monotonic() + timeout
    while True:
        os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=min(again_after, max(0.1, deadline - time.monotonic())))
            return
        except subprocess.TimeoutExpired:
            if time.monotonic() >= deadline:
                raise


def _reboots(rl, node):
    return len([ln for ln in rl.reboots() if f"node={node}" in ln])


# ---- issue §1 -------------------------------------------------------------------------------------------------
def test_operator_drain_after_a_crashed_run_is_never_rebooted_nor_resumed(repair_lab):
    rl = repair_lab
    lab = rl.lab
    n = lab.nodes[1]
    rl.inject(n, "xid79", "reboot")  # GPU lost: the ladder starts with a reboot
    rl.drained_by_agent(n)
    _kill_after_intent(rl, n)  # the history now has a pending reboot
    rebooted = _reboots(rl, n)
    rl.drain(n, OPS)
    for _unused in range(2):
        _r, art = rl.run()  # nothing failed: the node is simply not ours
        d = _decisions(art)[n]
        assert (d["action"], d["rule"]) == ("hold", "not_ours"), d
        state, reason = lab.node_states()[n]
        assert reason.startswith(OPS) and state != "idle", (state, reason)
        assert _reboots(rl, n) == rebooted, rl.reboots()
    h = rl.history(n)
    assert "i" not in h and OPS in h["nt"] and "closed" in h["nt"], h  # our history on it is closed with a note


# ---- issue §2 -------------------------------------------------------------------------------------------------
def test_operator_drain_during_our_reboot_files_no_replacement(repair_lab):
    rl = repair_lab
    lab = rl.lab
    n = lab.nodes[2]
    rl.inject(n, "xid79", "never")  # a reboot does not help: the plan's next step would be a replacement (RMA)
    rl.drained_by_agent(n)
    _kill_after_intent(rl, n, taken=True)  # Slurm took the reboot, the run is gone
    rl.drain(n, OPS)
    started = rl.history(n)["i"]["s"][-1][1]
    report = rl.dir / "reports" / f"{n}.json"
    # the agent reports the node unhealthy after the reboot: without the ownership rule the plan now replaces it
    wait_until(lambda: report.exists() and report.stat().st_mtime > started + 1, timeout=60, what="fresh report")
    _r, art = rl.run()
    d = _decisions(art)[n]
    assert (d["action"], d["rule"], d["hook"]) == ("hold", "not_ours", None), d
    assert rl.hook_calls() == []
    assert lab.node_states()[n][1].startswith(OPS), lab.node_states()[n]


# ---- issue §7: a stop (SIGTERM) or Ctrl-C (SIGINT) in the middle of a reboot converges (SIGKILL: tests above) ----
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_cancelled_run_converges_with_one_reboot(repair_lab, sig):
    rl = repair_lab
    lab = rl.lab
    n = lab.nodes[1]
    rl.inject(n, "xid79", "reboot")
    rl.drained_by_agent(n)
    _kill_after_intent(rl, n, sig=sig)
    rl.until(lambda: lab.node_states()[n][0] == "idle", runs=3)
    assert _reboots(rl, n) == 1, rl.reboots()
    assert "i" not in rl.history(n), rl.history(n)


# ---- issue §5 -------------------------------------------------------------------------------------------------
def test_one_bad_node_does_not_stop_the_others(repair_lab):
    rl = repair_lab
    lab = rl.lab
    n1, good, n3, n4 = lab.nodes[:4]
    rl.inject(good, "xid48", "reset_gpu")
    rl.drained_by_agent(good)
    rl.uninstall()  # the agent stops writing reports: the bad report files below stay as they are
    for n in (n1, n3, n4):
        rl.drain(n, "gpufleet: xid48 gpu3")
    rl.set_extra(n1, '{"gf":2}')  # a history of a newer version
    rl.set_extra(n3, '{"gf":1,"i":{"c":"gl","g":3')  # ours, truncated
    reports = rl.dir / "reports"
    (reports / f"{n4}.json").write_text(json.dumps({"verdict": "exploded", "action": "reboot"}))
    (reports / "ghost.json").write_text('{"report": {"verdict": "unhea')  # truncated, a node Slurm does not know

    r, art = rl.run(ok=False)  # the good node is repaired; the run fails because three nodes need a person
    plan = _decisions(art)
    assert plan[good]["action"] == "reset_gpu" and len(rl.resets()) == 1
    assert lab.wait_for(good, "idle", timeout=20)[0] == "idle"
    assert (plan[n1]["rule"], plan[n3]["rule"], plan[n4]["rule"]) == ("history_unreadable", "history_unreadable",
                                                                      "bad_report"), plan
    assert "version 2" in plan[n1]["reason"] and "truncated" in plan[n3]["reason"]
    assert "exploded" in plan[n4]["reason"]
    for n in (n1, n3):
        assert lab.node_states()[n] == ("drained", f"gpufleet: held: repair history unreadable, clear it: "
                                                   f"scontrol update NodeName={n} Extra="), lab.node_states()[n]
    assert lab.node_states()[n4] == ("drained", "gpufleet: held: health report unusable, see the repair plan")
    assert rl.extra(n1) == '{"gf":2}' and rl.extra(n3) == '{"gf":1,"i":{"c":"gl","g":3'  # never overwritten
    problems = art["gpufleet_repair_summary"]["problems"]
    assert len(problems) == 3 and all(p.split()[0] in (n1, n3, n4) for p in problems), problems
    assert "ghost" in r.output  # the report of an unknown node is a warning, not a failure

    # the operator follows the advice: clear the history; the node is planned again (the stale report holds n4)
    rl.set_extra(n3, "")
    _r, art = rl.run(ok=False)
    assert _decisions(art)[n3]["rule"] not in ("history_unreadable", "not_ours"), _decisions(art)[n3]


# ---- issue §4 + §7 (verify contract, spare on escalation) --------------------------------------------------------
def test_escalation_fails_the_run_names_the_node_and_brings_the_spare(repair_lab):
    rl = repair_lab
    lab = rl.lab
    n, spare = lab.nodes[1], lab.nodes[-1]
    rl.spare(spare)
    rl.inject(n, "xid48", "reboot")
    rl.drained_by_agent(n)
    cfg = {"ladders": {"gpu_memory": ["reset_gpu"]}}  # nothing after the reset: the next step is a person

    # the verify command is the project's own agent, which exits 2 on an unhealthy node: the verdict decides, the
    # outcome is recorded in this run, and the run fails because the step did not repair the node
    r, art = rl.run(ok=False, config=cfg)
    res = {x["node"]: x for x in art["gpufleet_repair_result"]}[n]
    assert (res["action"], res["verified"], res["failed"]) == ("reset_gpu", "unhealthy", False), res
    step = rl.history(n)["i"]["s"][-1]  # failed, with its proof that it ran (the reset's own record)
    assert step[0] == "g" and step[2] == "f" and len(step) == 4 and step[3] >= step[1], rl.history(n)
    assert any(p.startswith(f"{n} reset_gpu: verification unhealthy") for p in
               art["gpufleet_repair_summary"]["problems"]), art["gpufleet_repair_summary"]

    r, art = rl.run(ok=False, config=cfg)
    d = _decisions(art)[n]
    assert d["action"] == "escalate" and d["spare"]["spare"] == spare, d
    assert art["gpufleet_repair_summary"]["nodes"]["escalated"] == [n]
    assert "ESCALATED" in r.output
    state, reason = lab.node_states()[n]
    assert state == "drained" and reason.startswith("gpufleet: escalated: "), (state, reason)
    assert lab.wait_for(spare, "idle", timeout=20)[0] == "idle"  # the hot spare took its place
    assert rl.history(n)["i"]["sp"] == spare

    _r, art = rl.run(config=cfg)  # held for a person: nothing new went wrong, the run succeeds
    assert _decisions(art)[n]["rule"] == "escalated"
    assert lab.node_states()[spare][0] == "idle"


# ---- issue §7: check mode predicts -------------------------------------------------------------------------------
def test_check_mode_predicts_without_errors(repair_lab):
    rl = repair_lab
    lab = rl.lab
    n2, n3 = lab.nodes[1], lab.nodes[2]
    rl.inject(n2, "xid48", "reset_gpu")
    rl.inject(n3, "xid79", "reboot")
    rl.drained_by_agent(n2)
    rl.drained_by_agent(n3)
    before = lab.node_states()
    r, art = rl.run(cmdline="--check")
    plan = _decisions(art)
    assert (plan[n2]["action"], plan[n3]["action"]) == ("reset_gpu", "reboot"), plan
    assert "from_json" not in r.output and "fatal" not in r.output.lower(), r.output[-3000:]
    assert rl.resets() == [] and rl.reboots() == []
    assert lab.node_states() == before and rl.history(n2) == {} and rl.history(n3) == {}
    lines = art["gpufleet_repair_summary"]["lines"]
    assert any(ln.startswith(f"{n3} reboot: would run") for ln in lines), lines


# ---- issue §7: the webhook form of the replacement hook, end to end ---------------------------------------------
class _Hook(BaseHTTPRequestHandler):
    calls: list = []

    def do_POST(self):  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        type(self).calls.append({"key": self.headers.get("Idempotency-Key"), "auth": self.headers.get("Authorization"),
                                 "body": json.loads(body)})
        out = b'{"ticket": "RMA-7"}'
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass


def test_replacement_through_the_webhook_is_called_once(repair_lab):
    rl = repair_lab
    lab = rl.lab
    n = lab.nodes[2]
    _Hook.calls = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        rl.inject(n, "xid79", "never")
        rl.drained_by_agent(n)
        hook = {"node_repair_hook_command": [], "node_repair_hook_url": f"http://127.0.0.1:{server.server_port}/rma",
                "node_repair_hook_headers": {"Authorization": "Bearer lab-secret"}}
        # automatic replacement, as a site that files RMAs without a person sets it (approval_for: [])
        cfg = {"ladders": {"gpu_lost": ["replace"]}, "approval_for": []}
        r, art = rl.run(config=cfg, **hook)
        assert _decisions(art)[n]["action"] == "replace"
        assert len(_Hook.calls) == 1, _Hook.calls
        call = _Hook.calls[0]
        assert call["body"]["node"] == n and call["body"]["action"] == "replace"
        assert call["key"] == call["body"]["idempotency_key"] and call["auth"] == "Bearer lab-secret"
        assert "lab-secret" not in r.output  # headers are no_log
        state, reason = lab.node_states()[n]
        assert reason.startswith("gpufleet: replace"), (state, reason)
        rl.run(config=cfg, **hook)  # the replacement is pending: never filed twice
        assert len(_Hook.calls) == 1, _Hook.calls
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def test_bad_throttle_is_refused_before_slurm_is_contacted(repair_lab, tmp_path):
    rl = repair_lab
    # a scontrol that records every call, first on the PATH of the run
    fake = tmp_path / "fake-bin"
    fake.mkdir()
    calls = tmp_path / "scontrol.log"
    (fake / "scontrol").write_text(f'#!/usr/bin/env bash\necho "$*" >>{calls}\nexit 1\n')
    (fake / "scontrol").chmod(0o755)
    (fake / "sinfo").write_text(f'#!/usr/bin/env bash\necho "sinfo $*" >>{calls}\nexit 1\n')
    (fake / "sinfo").chmod(0o755)
    env = dict(rl._envvars())
    env["PATH"] = f"{fake}:{env['PATH']}"
    rl._envvars = lambda: env
    r, _art = rl.run(ok=False, node_repair_throttle=-3)
    assert "node_repair_throttle" in r.output and "-3" in r.output, r.output[-3000:]
    assert not calls.exists(), calls.read_text()


# ---- issue §7: a slurmctld clean start loses the histories in Extra ---------------------------------------------
@pytest.mark.scenario(weight=2)  # about 2 times a typical scenario (--durations)
def test_clean_slurmctld_start_loses_histories_and_the_next_incident_starts_afresh(repair_lab):
    rl = repair_lab
    lab = rl.lab
    n = lab.nodes[2]
    cfg = {"ladders": {"gpu_lost": ["replace"]}, "spares": {"enabled": False}, "approval_for": []}
    rl.inject(n, "xid79", "never")
    rl.drained_by_agent(n)
    rl.run(config=cfg)
    assert len(rl.hook_calls()) == 1 and rl.history(n)["i"]["id"] == 1, (rl.hook_calls(), rl.history(n))

    # slurmctld starts without its saved state: every drain and every Extra is gone, the node is idle again (the
    # health check is off while the lab starts: the lab's start waits for every node idle)
    rl.uninstall()
    lab.script_run("restart", timeout=900)
    assert rl.history(n) == {} and lab.node_states()[n][0] == "idle"
    rl.install_hook()
    # the agent (HealthCheckProgram) finds the GPU still lost and drains the node again: a new incident, number 1
    # again; the replacement of the new incident is filed (not taken for the old one, already requested)
    rl.drained_by_agent(n, timeout=90)
    _r, art = rl.run(config=cfg)
    d = _decisions(art)[n]
    assert (d["action"], d["incident"]) == ("replace", "1"), d
    calls = rl.hook_calls()
    assert len(calls) == 2 and calls[0]["idempotency_key"] != calls[1]["idempotency_key"], calls
    rl.run(config=cfg)  # and only once
    assert len(rl.hook_calls()) == 2


# ---- issue §7: a retracted intent does not count against max_unavailable ----------------------------------------
def test_reboot_intent_that_slurm_never_took_is_retried_under_a_limit_of_one(repair_lab):
    rl = repair_lab
    lab = rl.lab
    n = lab.nodes[1]
    rl.inject(n, "xid79", "reboot")
    rl.drained_by_agent(n)
    # what a run killed between "Record the step" and the reboot leaves: a pending reboot Slurm never took
    t = int(time.time())
    rl.set_extra(n, json.dumps({"gf": 1, "i": {"c": "gl", "g": 3, "id": 1, "k": "xid79", "s": [["b", t - 60, None]],
                                               "t": t - 120}, "n": 1, "r": f"b{t - 60}"}, separators=(",", ":")))
    _r, art = rl.run(config={"blast_radius": {"max_unavailable": 1, "min_healthy": 0}})
    d = _decisions(art)[n]
    assert (d["action"], d["runnable"]) == ("reboot", True), d  # not held by its own retracted step
    assert _reboots(rl, n) == 1
    assert lab.wait_for(n, "idle", timeout=30)[0] == "idle"


# ---- issue 27: a step counts only on proof that it ran ------------------------------------------------------------
def _pending(rl, node, code, started, cls="gm", fault="xid48"):
    """What a run killed right after "Record the step" leaves: the step's intent, nothing else."""
    rl.set_extra(node, json.dumps({"gf": 1, "i": {"c": cls, "g": 3, "id": 1, "k": fault, "s": [[code, started, None]],
                                                  "t": started - 60}, "n": 1, "r": f"{code}{started}"},
                                  separators=(",", ":")))


def _intent_only(rl, node, code, fault, cleared_by, cls, timeout):
    """A sick node drained by the agent whose history holds only ``code``'s intent, written 5 s ago; the config
    of its runs (``timeout`` for the step, one node under repair at a time). Returns (started, config)."""
    rl.inject(node, fault, cleared_by)
    rl.drained_by_agent(node)
    started = int(time.time()) - 5
    _pending(rl, node, code, started, cls=cls, fault=fault)
    action = {"g": "reset_gpu", "b": "reboot"}[code]
    return started, {"step_timeout": {action: timeout}, "blast_radius": {"max_unavailable": 1, "min_healthy": 0}}


def test_a_reset_that_never_ran_is_never_failed_and_is_offered_again(repair_lab):
    """Case 4: the intent of a reset, no reset: the agent's sick reports newer than the intent do not fail it (no
    needless reboot); at its timeout it is offered again, runs, and the node is verified and resumed."""
    rl = repair_lab
    lab = rl.lab
    n = lab.nodes[1]
    started, cfg = _intent_only(rl, n, "g", "xid48", "reset_gpu", "gm", "120s")
    report = rl.dir / "reports" / f"{n}.json"
    wait_until(lambda: report.exists() and report.stat().st_mtime > started + 1, timeout=60, what="fresh report")
    _r, art = rl.run(config=cfg)
    d = _decisions(art)[n]
    assert (d["action"], d["rule"], d["verify"]) == ("wait", "in_progress", False), d
    assert "no record that it ran" in d["reason"], d
    assert (len(rl.resets(n)), _reboots(rl, n)) == (0, 0)
    assert rl.history(n)["i"]["s"] == [["g", started, None]]  # still pending: nothing judged it

    _pending(rl, n, "g", started - 200)  # the same intent, now past its timeout
    _r, art = rl.run(config=cfg)
    d = _decisions(art)[n]
    assert (d["action"], d["rule"]) == ("reset_gpu", "ladder"), d  # the same step again, not a reboot
    assert "after reset_gpu unproven" in d["reason"], d
    assert lab.wait_for(n, "idle", timeout=30)[0] == "idle"
    assert (len(rl.resets(n)), _reboots(rl, n)) == (1, 0)
    assert "i" not in rl.history(n), rl.history(n)


def test_a_reboot_slurm_timed_out_is_never_replaced(repair_lab):
    """Case 2: Slurm gave up on a late reboot ("reboot timed out") and the node never booted: no replacement
    and no hook call; at the step's timeout the reboot is offered again, runs, and the node comes back."""
    rl = repair_lab
    lab = rl.lab
    n = lab.nodes[2]
    started, cfg = _intent_only(rl, n, "b", "xid79", "reboot", "gl", "300s")
    # what Slurm shows after ResumeTimeout on a reboot that never happened: DOWN, our reason with its own note
    lab.run("scontrol", "update", f"NodeName={n}", "State=DOWN",
            "Reason=gpufleet: reboot xid79 (incident 1) : reboot timed out")
    _r, art = rl.run(config=cfg)
    d = _decisions(art)[n]
    assert (d["action"], d["rule"], d["hook"]) == ("wait", "in_progress", None), d
    assert "no boot of the node since" in d["reason"], d
    assert rl.hook_calls() == [] and _reboots(rl, n) == 0

    _pending(rl, n, "b", started - 400, cls="gl", fault="xid79")  # past its timeout, still no boot
    _r, art = rl.run(config=cfg)
    d = _decisions(art)[n]
    assert (d["action"], d["rule"], d["hook"]) == ("reboot", "ladder", None), d
    assert "after reboot unproven" in d["reason"], d
    assert lab.wait_for(n, "idle", timeout=60)[0] == "idle"
    assert _reboots(rl, n) == 1 and rl.hook_calls() == []


def test_one_writer_a_second_run_is_refused_or_queues_behind_the_first(repair_lab, tmp_path):
    """Case 5: the event loop and a schedule both start a run. While the first holds the run lock (here stopped
    inside its GPU reset), a second fails at once, names the holder and changes nothing; one with a lock wait
    queues and then finds nothing left to do. One reset in all."""
    rl = repair_lab
    lab = rl.lab
    n = lab.nodes[1]
    rl.inject(n, "xid48", "reset_gpu")
    rl.drained_by_agent(n)
    go = tmp_path / "go"
    slow = tmp_path / "nvidia-smi-slow"
    inside = tmp_path / "inside"
    slow.write_text(f'#!/usr/bin/env bash\ntouch {inside}\nwhile [ ! -e {go} ]; do sleep 0.1; done\n'
                    f'exec {rl.bin}/nvidia-smi-{n} "$@"\n')
    slow.chmod(0o755)
    first = rl.start_async(node_repair_nvidia_smi=str(slow))
    queued = None
    try:
        wait_until(lambda: inside.exists() or first.poll() is not None, timeout=180, what="the first run's reset")
        assert first.poll() is None and len(rl.resets(n)) == 0 and (rl.state / "repair.lock").exists()
        before = rl.extra(n)
        r, art = rl.run(ok=False)
        assert "another repair run holds" in r.output and f"pid {first.pid} on" in r.output, r.output[-3000:]
        assert rl.extra(n) == before and len(rl.resets(n)) == 0
        # the refused run still says why, where AWX and people look, and leaves the holder's lock alone
        summary = art["gpufleet_repair_summary"]
        assert summary["headline"].startswith("repair run: stopped before its plan"), summary
        assert len(summary["problems"]) == 1 and "another repair run holds" in summary["problems"][0], summary
        assert json.loads((rl.tmp / "summary.json").read_text()) == summary
        assert json.loads((rl.state / "repair.lock").read_text())["pid"] == first.pid
        queued = rl.start_async(node_repair_lock_wait=300)
        time.sleep(3)
        assert queued.poll() is None  # waiting for the lock
        go.touch()
        assert first.wait(timeout=300) == 0
        assert queued.wait(timeout=300) == 0
    finally:
        rl.kill(first)
        if queued is not None:
            rl.kill(queued)
    assert lab.wait_for(n, "idle", timeout=30)[0] == "idle"
    assert len(rl.resets(n)) == 1 and _reboots(rl, n) == 0
    assert not (rl.state / "repair.lock").exists()  # freed by the run that ended last


@pytest.mark.scenario(weight=2)  # about 2 times a typical scenario (--durations)
def test_a_breaker_trip_that_cannot_be_saved_still_holds_the_fleet(repair_lab):
    """Issue: with the state directory full during a trip the run died before its summary, and once the failures
    left the window the next run rebooted every node with nobody having reset the breaker."""
    rl = repair_lab
    lab = rl.lab
    sick = lab.nodes[:2]
    rl.sicken(sick)
    cfg = {"breaker": {"fraction": "50%", "min_nodes": 2, "window": "5m"}}
    held = "gpufleet: held (xid48): circuit breaker tripped, a person checks the fleet and resets it"

    # 1. the trip cannot be saved (the state directory is full): the run holds everything, fails and says why
    rc, out = rl.run_with_full_state_dir(config=cfg)
    assert rc == 2, out[-4000:]
    assert "cannot save the breaker state" in out and "held closed" in out, out[-4000:]
    assert "repair run:" in out  # the summary is printed
    assert all(lab.node_states()[n] == ("drained", held) for n in sick), lab.node_states()
    assert rl.resets() == [] and rl.reboots() == []
    assert not (rl.state / "breaker.json").exists()  # it was never saved

    # 2. the disk is fine again and the failures are older than the window: Slurm still holds the trip
    _r, art = rl.run(ok=False, config=dict(cfg, breaker={"fraction": "50%", "min_nodes": 2, "window": 1}))
    brk = art["gpufleet_repair_plan"]["breaker"]
    assert brk["tripped"] and "still show the breaker's hold in Slurm" in brk["reason"], brk
    assert sorted(brk["nodes"]) == sorted(sick)
    assert rl.breaker()["tripped"] is True  # saved now
    assert rl.resets() == [] and all(lab.node_states()[n][0] == "drained" for n in sick)

    # 3. only a person's reset ends it: the repairs go ahead
    _r, art = rl.run(ok=None, config=dict(cfg, breaker={"enabled": True, "window": 1}), node_repair_breaker_reset=True)
    assert not rl.breaker()["tripped"]
    assert all(len(rl.resets(n)) == 1 for n in sick), rl.resets()


def test_below_min_healthy_fails_the_run_and_says_so(repair_lab):
    """Issue: a partition below min_healthy held every node with rc 0 "ok" run after run, for hours, unseen."""
    rl = repair_lab
    lab = rl.lab
    sick = lab.nodes[:2]
    rl.sicken(sick)
    floor = {"blast_radius": {"max_unavailable": len(lab.nodes), "min_healthy": "75%"}}
    r, art = rl.run(ok=False, config=floor)
    summary = art["gpufleet_repair_summary"]
    below = [p for p in summary["problems"] if p.startswith("below min_healthy: 2 node(s) held")]
    assert len(below) == 1 and all(n in below[0] for n in sick), summary["problems"]
    assert "a person brings nodes back or lowers blast_radius.min_healthy" in below[0]
    assert {d["node"]: d["rule"] for d in art["gpufleet_repair_plan"]["decisions"]} == {n: "min_healthy" for n in sick}
    assert "below min_healthy" in r.output and rl.resets() == []
    # above the floor the same nodes are repaired and the run is ok
    rl.run(config={"blast_radius": {"max_unavailable": len(lab.nodes), "min_healthy": "50%"}})
    assert all(len(rl.resets(n)) == 1 for n in sick), rl.resets()


def test_a_sick_node_in_a_maintenance_reservation_is_never_touched(repair_lab):
    """Issue: a sick node inside an active Flags=MAINT reservation was rebooted and resumed mid-maintenance."""
    rl = repair_lab
    lab = rl.lab
    n = lab.nodes[1]
    rl.inject(n, "xid48", "reset_gpu")
    rl.drained_by_agent(n)
    ours = lab.node_states()[n]
    # the operator's maintenance window begins on the node (Slurm flags it MAINTENANCE while it is active)
    lab.run("scontrol", "create", "reservation", "ReservationName=gpufleet-maint", "StartTime=now", "Duration=30",
            "Users=root", "Flags=MAINT,IGNORE_JOBS", f"Nodes={n}")
    try:
        # slurmctld applies a reservation's start on its own timer: seconds, as the repair run reads the node
        wait_until(lambda: "MAINTENANCE" in SlurmClient(backend="cli").node(n).flags, timeout=60, interval=0.5,
                   what="the MAINTENANCE flag")
        for _unused in range(2):
            _r, art = rl.run(ok=None)
            d = {d["node"]: d for d in art["gpufleet_repair_plan"]["decisions"]}[n]
            assert (d["action"], d["rule"]) == ("hold", "not_ours") and "maintenance reservation" in d["reason"], d
        assert rl.resets(n) == [] and rl.reboots() == []
        state, reason = lab.node_states()[n]  # sinfo marks a node in a maintenance reservation with "$"
        assert (state.rstrip("$"), reason) == ours  # our drain and its reason, as they were: no note, no resume
    finally:
        lab.run("scontrol", "delete", "ReservationName=gpufleet-maint", check=False)
    # the window is over: the node is ours again and is repaired
    rl.until(lambda: lab.node_states()[n][0] == "idle", runs=3)
    assert len(rl.resets(n)) == 1


# ---- issue §8 -------------------------------------------------------------------------------------------------
@pytest.mark.scenario(weight=2)  # about 2 times a typical scenario (--durations)
def test_the_agents_report_is_fetched_from_the_node_so_nothing_is_repaired_blind(repair_lab, tmp_path):
    """Issue: the agent keeps its report on the node and repair reads a directory on the controller; without a sweep
    the plan repaired blind ("reboot (probe no_report)"). The role now fetches the agent's report from the node."""
    rl = repair_lab
    lab = rl.lab
    n, other = lab.nodes[1], lab.nodes[2]
    controller = tmp_path / "controller-reports"  # nothing reaches the controller's directory
    controller.mkdir()
    rl.inject(n, "xid48", "reset_gpu")
    rl.drained_by_agent(n)
    # control: with the fetch turned off the plan repairs blind, as before (check mode: nothing changes)
    _r, art = rl.run(cmdline="--check", node_repair_reports_dir=str(controller), node_repair_agent_report="")
    d = _decisions(art)[n]
    assert (d["action"], d["code"], d["failure_class"]) == ("reboot", "no_report", "probe"), d
    # a node's file that names another node is not that node's report: held, saying why, nothing done
    forged = tmp_path / "forged"
    forged.mkdir()
    (forged / f"{n}.json").write_text(json.dumps(
        {"node": other, "report": {"verdict": "healthy", "action": "none", "code": "ok", "findings": []}}))
    _r, art = rl.run(ok=None, node_repair_reports_dir=str(controller),
                     node_repair_agent_report=str(forged / "{node}.json"))
    d = _decisions(art)[n]
    assert d["action"] == "hold" and f"the report is of node '{other}', not of {n}" in d["reason"], d
    assert rl.resets(n) == [] and rl.reboots() == [] and lab.node_states()[n][0] in ("drained", "draining")
    # the agent's own report, fetched from the node: the Xid 48 it found asks for a GPU reset, which runs and holds
    rl.until(lambda: lab.node_states()[n][0] == "idle", runs=3, node_repair_reports_dir=str(controller))
    first = rl.last["gpufleet_repair_plan"]["decisions"]
    assert len(rl.resets(n)) == 1 and _reboots(rl, n) == 0, (rl.resets(n), rl.reboots(), first)
    assert not list(controller.iterdir())  # fetched for the plan, never written on the controller


# ---- issue §3, second half --------------------------------------------------------------------------------------
def test_a_node_that_fails_again_soon_after_its_repair_goes_to_a_person(repair_lab):
    """Issue: a node verified healthy and resumed was drained again seconds later and went through the same reset
    again (and again), feeding the lemon rule. A relapse inside the cooldown now goes to a person, loudly."""
    rl = repair_lab
    lab = rl.lab
    n = lab.nodes[1]
    cfg = {"cooldown": "10m"}
    rl.inject(n, "xid48", "reset_gpu")
    rl.drained_by_agent(n)
    rl.until(lambda: lab.node_states()[n][0] == "idle", runs=3, config=cfg)
    assert len(rl.resets(n)) == 1
    rl.inject(n, "xid48", "reset_gpu")  # the same fault, a minute after the verified reset
    rl.drained_by_agent(n)
    r, art = rl.run(ok=False, config=cfg)  # an escalation fails the run: AWX shows it red
    d = _decisions(art)[n]
    assert (d["action"], d["rule"]) == ("escalate", "relapse") and "did not hold" in d["reason"], d
    assert len(rl.resets(n)) == 1 and _reboots(rl, n) == 0
    state, reason = lab.node_states()[n]
    assert state in ("drained", "draining") and reason.startswith("gpufleet: escalate"), (state, reason)
    assert rl.history(n)["i"]["e"], rl.history(n)
    # the next run holds it for a person, and does nothing else
    _r, art = rl.run(ok=None, config=cfg)
    assert _decisions(art)[n]["rule"] == "escalated" and len(rl.resets(n)) == 1


# ---- issue, low: a reboot slower than the wait -------------------------------------------------------------------
def test_a_reboot_slower_than_the_wait_is_not_called_failed_and_the_next_run_proves_it(repair_lab):
    """Issue: "Reboot FAILED" was printed for a reboot that completed after the run stopped waiting."""
    rl = repair_lab
    lab = rl.lab
    n = lab.nodes[1]
    rl.inject(n, "xid79", "reboot")
    rl.drained_by_agent(n)
    _r, art = rl.run(ok=False, node_repair_reboot_timeout=1)  # the lab's reboot takes seconds: the wait runs out
    lines = art["gpufleet_repair_summary"]["lines"]
    line = next(ln for ln in lines if ln.startswith(f"{n} reboot"))
    assert "issued, but the node was not back within the wait" in line and "FAILED" not in line, lines
    assert "judges the reboot by the node's boot time" in line
    # the reboot completes; the next run finds its proof (a newer boot time), verifies and resumes: one reboot
    rl.until(lambda: lab.node_states()[n][0] == "idle", runs=3)
    assert _reboots(rl, n) == 1
