"""The whole loop in the Slurm lab, with real parts only (the GPUs are the repair lab's replayed captures):
a fault is injected on a lab node -> the real agent (HealthCheckProgram hook) drains it and writes its textfile ->
Debian's node_exporter -> a real prometheus evaluates the shipped alert rules -> a real Alertmanager posts the
webhook -> a real ansible-rulebook 1.3.2 with the shipped rulebook and the collection's event source -> repair.yml
resets the GPU, verifies and resumes the node. In approval mode the same chain stops at the plan: nothing is
reset, the node stays drained, and the approved step then runs by hand. Prints the measured detect -> drain ->
repair start times (docs/loop.md)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import (
    Daemon,
    eda_bin,
    free_port,
    http_post,
    need,
    start_node_exporter,
    start_prometheus,
    stop_process,
    wait_for,
)

from support.repair_lab import REPO, RepairLab  # the repair lab (fakegpu GPUs, repair.yml runs)

pytestmark = [pytest.mark.lab, pytest.mark.scenario]  # scenario: dealt between the releases (conftest)
HOOK = Path(__file__).resolve().parent / "eda_lab_hook.py"
RULES = REPO / "monitoring" / "prometheus" / "gpufleet-alerts.yml"
TOKEN = "loop-test-token-7d1e"


def start_alertmanager(daemons, tmp_path: Path, webhook: str) -> str:
    port = free_port()
    cfg = {"route": {"receiver": "people", "group_by": ["node"], "group_wait": "0s", "group_interval": "5s",
                     "repeat_interval": "1h",
                     "routes": [{"matchers": ['gpufleet_repair="true"'], "receiver": "gpufleet-rulebook"}]},
           "receivers": [{"name": "people"},
                         {"name": "gpufleet-rulebook", "webhook_configs": [{
                             "url": webhook, "send_resolved": False,
                             "http_config": {"authorization": {"type": "Bearer", "credentials": TOKEN}}}]}]}
    conf = tmp_path / "alertmanager.yml"
    conf.write_text(yaml.safe_dump(cfg))
    argv = [need("prometheus-alertmanager"), f"--config.file={conf}", f"--storage.path={tmp_path / 'am-data'}",
            f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="]
    d = Daemon("alertmanager", argv, tmp_path / "alertmanager.log", f"http://127.0.0.1:{port}/-/ready")
    daemons.append(d)
    d.wait_ready(60)
    return f"127.0.0.1:{port}"


@pytest.fixture
def loop(lab, tmp_path, daemons, monkeypatch):
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent) + ":" + os.environ.get("PATH", ""))
    rl = RepairLab(lab, tmp_path)
    rl.install()
    textfiles = tmp_path / "textfile"
    textfiles.mkdir()
    targets = []
    for node in lab.nodes:
        (textfiles / node).mkdir()
        targets.append(start_node_exporter(daemons, tmp_path, textfiles / node, f"node_exporter-{node}"))
    eda_port = free_port()
    am = start_alertmanager(daemons, tmp_path, f"http://127.0.0.1:{eda_port}/alertmanager")
    start_prometheus(daemons, tmp_path, targets, [RULES], alertmanager=am)
    rl.textfiles = textfiles
    rl.eda_port = eda_port
    rl.rulebook = None
    # the agent with --textfile as the lab's health hook (after the daemons, so the first drain is seen); no exec:
    # the hook's path stays in the command line while it runs (lab.stop_hooks)
    lab.hook.write_text(f'#!/usr/bin/env bash\n{sys.executable} {HOOK} {lab.dir} {textfiles}\n')
    lab.hook.chmod(0o755)
    try:
        yield rl
    finally:
        if rl.rulebook is not None:
            stop_process(rl.rulebook)
            rl.rulebook_log.close()
        rl.uninstall()
        for p in (lab.dir / "faults").glob("*"):
            p.unlink()
        lab.run("scontrol", "update", f"NodeName={','.join(lab.nodes)}", "Extra=", check=False)


def start_rulebook(rl, config, followups=False):
    inventory = {"all": {"hosts": {"localhost": {}}, "vars": rl.extravars(config)}}
    inv = rl.tmp / "eda-inventory.yml"
    inv.write_text(yaml.safe_dump(inventory))
    variables = rl.tmp / "eda-vars.yml"
    eda_vars = {"gpufleet_eda_port": rl.eda_port}
    if followups:  # the run publishes to rl.tmp (node_repair_publish_dir)
        eda_vars["gpufleet_eda_followup_file"] = str(rl.tmp / "followup.json")
    variables.write_text(yaml.safe_dump(eda_vars))
    env = dict(os.environ, **rl._envvars())
    env["PATH"] = str(Path(eda_bin("ansible-rulebook")).parent) + ":" + env["PATH"]
    env["GPUFLEET_EDA_TOKEN"] = TOKEN
    # the teardown stops the rulebook and the playbook it runs, and a module stopped mid-run leaves its payload
    # directory: in the test's own temporary directory (pytest's to clean), not the machine's /tmp
    env["TMPDIR"] = str(rl.tmp / "tmp")
    (rl.tmp / "tmp").mkdir(exist_ok=True)
    rl.rulebook_log = open(rl.tmp / "rulebook.log", "wb")  # noqa: SIM115 - closed by the fixture
    rl.rulebook = subprocess.Popen([eda_bin("ansible-rulebook"), "-i", str(inv), "--rulebook",
                                    "gpufleet.reliability.repair", "--vars", str(variables), "-vv"],
                                   env=env, stdout=rl.rulebook_log, stderr=subprocess.STDOUT, cwd=rl.tmp)

    def listening():
        if rl.rulebook.poll() is not None:
            raise AssertionError((rl.tmp / "rulebook.log").read_text()[-4000:])
        return http_post(f"http://127.0.0.1:{rl.eda_port}/alertmanager", b"{}")[0] == 401
    wait_for(listening, 120, "ansible-rulebook's event source")


def stamp(log: str, marker: str) -> float:
    """Epoch seconds of the first rulebook log line holding ``marker`` (lines start with the local time,
    'YYYY-MM-DD HH:MM:SS,mmm')."""
    line = next(ln for ln in log.splitlines() if marker in ln)
    return time.mktime(time.strptime(line[:19], "%Y-%m-%d %H:%M:%S")) + int(line[20:23]) / 1000


def drains(rl):
    log = rl.textfiles / "drains.log"
    return [ln.split() for ln in log.read_text().splitlines()] if log.exists() else []


def plays(rl):
    return (rl.tmp / "rulebook.log").read_text(errors="replace").count("PLAY [Plan node repairs]")


def test_alert_to_rulebook_to_repair_and_resume(loop):
    rl = loop
    lab = rl.lab
    n2 = lab.nodes[1]
    start_rulebook(rl, None)
    before = lab.node_states()
    t_fault = time.time()
    rl.inject(n2, "xid48", "reset_gpu")
    state, reason = rl.drained_by_agent(n2)
    assert reason.startswith("gpufleet: xid48 gpu3")
    wait_for(rl.resets, 180, "the rulebook's repair run to reset the GPU", interval=0.5)
    wait_for(lambda: lab.node_states()[n2][0] == "idle", 120, f"{n2} verified and resumed", interval=0.5)
    resets = rl.resets()
    assert len(resets) == 1 and f" {n2} -r -i 3" in resets[0], resets
    assert all(lab.node_states()[n] == before[n] for n in lab.nodes if n != n2)
    # one repair run for the node although the agent kept reporting it every 5 s until it was resumed
    time.sleep(5)
    assert plays(rl) == 1, (rl.tmp / "rulebook.log").read_text()[-3000:]
    t_drain = float([d for d in drains(rl) if d[1] == n2][0][0])
    t_reset = float(resets[0].split()[0])
    log = (rl.tmp / "rulebook.log").read_text(errors="replace")
    t_event = stamp(log, '"POST /alertmanager HTTP/1.1" 202')
    t_runner = stamp(log, "Calling Ansible runner")
    t_plan = (rl.tmp / "plan.json").stat().st_mtime
    sys.stdout.write(f"\nloop figures: fault -> drain {t_drain - t_fault:.1f} s (agent every 5 s); drain -> "
                     f"webhook at the rulebook {t_event - t_drain:.1f} s; -> repair playbook started "
                     f"{t_runner - t_drain:.1f} s; -> plan published {t_plan - t_drain:.1f} s; -> GPU reset "
                     f"{t_reset - t_drain:.1f} s\n")


@pytest.mark.scenario(weight=3)  # about 3 times a typical scenario (--durations)
def test_a_reset_that_did_not_help_is_followed_by_the_reboot_without_another_alert(loop):
    """Issue 27 case 11: the reset's verification fails; the run's followup.json brings the next run (the reboot)
    a minute later, although the agent's alerts are throttled for 5 minutes and Alertmanager repeats after 4 h."""
    rl = loop
    lab = rl.lab
    n2 = lab.nodes[1]
    start_rulebook(rl, None, followups=True)
    rl.inject(n2, "xid48", "reboot")  # a GPU reset does not clear it; a reboot does
    rl.drained_by_agent(n2)
    wait_for(rl.resets, 180, "the rulebook's repair run to reset the GPU", interval=0.5)
    follow = rl.tmp / "followup.json"
    wait_for(lambda: follow.exists() and n2 in json.loads(follow.read_text())["nodes"], 120,
             "the run's follow-up for the next step", interval=0.5)
    t_reset = time.time()
    # on a loaded machine 24.11's reboot can outlast the step's timeout (90 s here): that run fails, and its own
    # follow-up tries again a minute later, still without an alert
    wait_for(lambda: lab.node_states()[n2][0] == "idle", 480, f"{n2} rebooted, verified and resumed", interval=0.5)
    took = time.time() - t_reset
    assert len(rl.resets()) == 1 and [ln for ln in rl.reboots() if f"node={n2}" in ln], rl.reboots()
    book = rl.tmp / "rulebook.log"
    runs = [ln.rsplit("::", 1)[-1] for ln in book.read_text(errors="replace").splitlines()
            if "Creating action task action::run_playbook" in ln]
    # the alert's run, then only follow-ups: no other alert was needed (the node's own are throttled 5 minutes)
    assert runs[0] == "Repair the node" and len(runs) >= 2, runs
    assert set(runs[1:]) == {"Follow up on a repair"} or took > 300, runs
    sys.stdout.write(f"\nfollow-up: reset verified unhealthy -> rebooted and resumed {took:.0f} s later "
                     "(without it: the next alert after the 5-minute throttle, or the schedule)\n")


def test_approval_mode_waits_then_repair_by_hand(loop):
    rl = loop
    lab = rl.lab
    n2 = lab.nodes[1]
    cfg = {"modes": {"default": "approval"}}
    start_rulebook(rl, cfg)
    rl.inject(n2, "xid48", "reset_gpu")
    rl.drained_by_agent(n2)
    plan_file = rl.tmp / "plan.json"
    wait_for(lambda: plan_file.exists() and plays(rl) == 1 and "PLAY RECAP" in
             (rl.tmp / "rulebook.log").read_text(errors="replace"), 180, "the rulebook's repair run to plan")
    plan = json.loads(plan_file.read_text())
    d2 = {d["node"]: d for d in plan["decisions"]}[n2]
    assert d2["action"] == "reset_gpu" and d2["needs_approval"] and not d2["approved"], d2
    assert rl.resets() == [] and lab.node_states()[n2][0] in ("drained", "draining")
    # by hand, with the approval: the step runs, is verified, and the node comes back
    approvals = rl.tmp / "approvals.json"
    approvals.write_text(json.dumps([f"{n2}:reset_gpu:{d2['incident']}"]))
    rl.run(config=cfg, node_repair_approvals_file=str(approvals))
    assert len(rl.resets()) == 1
    wait_for(lambda: lab.node_states()[n2][0] == "idle", 60, f"{n2} resumed")
