# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""gpufleet.reliability.slurm_node against the real lab: through pytest-ansible (localhost) and, for check
mode and diff, through ansible-runner running ansible-playbook as AWX does."""
from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import ansible_runner
import pytest

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]


def slurm_node(host, **kwargs):
    return getattr(host, "gpufleet.reliability.slurm_node")(**kwargs)["localhost"]


def test_drain_is_idempotent_and_matches_sinfo(lab, localhost):
    node = lab.nodes[1]
    first = slurm_node(localhost, name=node, state="drained", reason="gpufleet: xid79 gpu3")
    assert first.is_successful, first
    assert first["changed"] is True and first["changed_nodes"] == [node]
    assert first["before"][node]["sinfo_state"] == "idle"
    assert first["after"][node]["sinfo_state"] == "drained"
    assert lab.node_states()[node] == ("drained", "gpufleet: xid79 gpu3")
    second = slurm_node(localhost, name=node, state="drained", reason="gpufleet: xid79 gpu3")
    assert second.is_successful and second["changed"] is False
    assert second["skipped_nodes"] == {node: "already drained"}


def test_batch_drain_is_one_scontrol_update(lab, localhost):
    res = slurm_node(localhost, name="node[1-3]", state="drained", reason="gpufleet: rack r7")
    assert res.is_successful and res["changed_nodes"] == ["node1", "node2", "node3"]
    updates = [c for c in res["commands"] if c[:2] == ["scontrol", "update"]]
    assert updates == [["scontrol", "update", "NodeName=node[1-3]", "State=DRAIN", "Reason=gpufleet: rack r7"]]
    assert [lab.node_states()[n][0] for n in ("node1", "node2", "node3", "node4")] == ["drained"] * 3 + ["idle"]


def test_drain_without_reason_is_refused(lab, localhost):
    res = slurm_node(localhost, name=lab.nodes[0], state="drained")
    assert res.is_failed and "reason is required when state=drained" in res["msg"]
    res = slurm_node(localhost, name=lab.nodes[0], state="down", reason="   ")
    assert res.is_failed and "reason is required when state=down" in res["msg"]
    assert lab.node_states()[lab.nodes[0]][0] == "idle"


def test_unknown_node_fails_and_changes_nothing(lab, localhost):
    res = slurm_node(localhost, name=f"{lab.nodes[0]},gpu999", state="drained", reason="gpufleet: x")
    assert res.is_failed and "unknown node(s): gpu999" in res["msg"] and res["error_kind"] == "unknown_node"
    assert lab.node_states()[lab.nodes[0]][0] == "idle"


def test_resume_undoes_only_our_own_drains(lab, localhost):
    ours, theirs = lab.nodes[0], lab.nodes[1]
    lab.run("scontrol", "update", f"NodeName={ours}", "State=DRAIN", "Reason=gpufleet: xid79")
    lab.run("scontrol", "update", f"NodeName={theirs}", "State=DRAIN", "Reason=maintenance by alice")
    res = slurm_node(localhost, name=f"{ours},{theirs}", state="resumed", only_if_reason_prefix="gpufleet:",
                     wait=True, timeout=30)
    assert res.is_successful and res["changed_nodes"] == [ours]
    assert "does not start with 'gpufleet:'" in res["skipped_nodes"][theirs]
    assert lab.node_states()[ours][0] == "idle"
    assert lab.node_states()[theirs] == ("drained", "maintenance by alice")
    again = slurm_node(localhost, name=f"{ours},{theirs}", state="resumed", only_if_reason_prefix="gpufleet:")
    assert again.is_successful and again["changed"] is False


def test_down_then_resume(lab, localhost):
    node = lab.nodes[2]
    res = slurm_node(localhost, name=node, state="down", reason="gpufleet: gpu fell off the bus")
    assert res.is_successful and res["changed"] and res["after"][node]["state"] == "down"
    assert lab.node_states()[node][0].startswith("down")
    assert slurm_node(localhost, name=node, state="down", reason="gpufleet: again")["changed"] is False
    res = slurm_node(localhost, name=node, state="resumed", wait=True, timeout=30)
    assert res.is_successful and res["changed"]
    assert lab.node_states()[node][0] == "idle"
    assert slurm_node(localhost, name=node, state="resumed")["changed"] is False


def test_reboot_waits_and_second_run_is_unchanged(lab, localhost):
    node = lab.nodes[3]
    since = int(time.time())
    args = dict(name=node, state="rebooted", reason="gpufleet: reboot after xid79", skip_if_booted_since=since,
                wait=True, timeout=60, poll_interval=0.5)
    res = slurm_node(localhost, **args)
    assert res.is_successful, res
    assert res["changed"] is True
    assert res["after"][node]["boot_time"] >= since
    assert lab.node_states()[node][0] == "idle"
    again = slurm_node(localhost, **args)
    assert again.is_successful and again["changed"] is False
    assert "at or after" in again["skipped_nodes"][node]


def test_reboot_pending_is_not_requested_twice(lab, localhost):
    node = lab.nodes[3]
    job = lab.run("sbatch", "--parsable", "-w", node, "-o", "/dev/null", "--wrap", "sleep 60").stdout.strip()
    try:
        lab.wait_for(node, {"mixed", "allocated"}, timeout=20)
        res = slurm_node(localhost, name=node, state="rebooted", reason="gpufleet: reboot", nextstate="resume")
        assert res.is_successful and res["changed"]
        assert "REBOOT_REQUESTED" in res["after"][node]["flags"] and res["after"][node]["draining"]
        again = slurm_node(localhost, name=node, state="rebooted", reason="gpufleet: reboot")
        assert again["changed"] is False and again["skipped_nodes"][node] == "reboot already pending"
    finally:
        lab.run("scancel", job, check=False)
    lab.wait_for(node, "idle", timeout=60)


def test_wait_for_drained_waits_for_the_job(lab, localhost):
    node = lab.nodes[0]
    # the job runs until the module has drained the node (a fixed "sleep 3" ended before a module started under a
    # loaded machine, seen in CI): a thread ends it once the node shows "draining"
    hold = lab.dir / "flags" / "hold-job"
    hold.write_text("")
    job = lab.run("sbatch", "--parsable", "-w", node, "-o", "/dev/null", "--wrap",
                  f"i=0; while [ -e {hold} ] && [ $i -lt 1200 ]; do sleep 0.1; i=$((i+1)); done").stdout.strip()

    def release_when_draining():
        deadline = time.monotonic() + 120
        try:
            while time.monotonic() < deadline:
                try:
                    if lab.node_states()[node][0] == "draining":
                        break
                except Exception:  # noqa: BLE001 - a sinfo that timed out on a loaded machine: look again
                    pass
                time.sleep(0.2)
        finally:
            hold.unlink(missing_ok=True)

    releaser = threading.Thread(target=release_when_draining, daemon=True)
    try:
        lab.wait_for(node, {"mixed", "allocated"}, timeout=20)
        releaser.start()
        # the job ends by itself after about 2 minutes even if nobody releases it: the wait outlasts it
        res = slurm_node(localhost, name=node, state="drained", reason="gpufleet: drain with job", wait=True,
                         timeout=300, poll_interval=0.5)
    finally:
        hold.unlink(missing_ok=True)
        if releaser.is_alive():
            releaser.join(timeout=130)
    assert res.is_successful, res
    assert res["before"][node]["sinfo_state"] in ("mixed", "allocated")
    assert res["after"][node]["sinfo_state"] == "drained"
    assert job not in lab.jobs()


def test_wait_timeout_names_the_nodes(lab, localhost):
    node = lab.nodes[0]
    job = lab.run("sbatch", "--parsable", "-w", node, "-o", "/dev/null", "--wrap", "sleep 120").stdout.strip()
    try:
        lab.wait_for(node, {"mixed", "allocated"}, timeout=20)
        res = slurm_node(localhost, name=node, state="drained", reason="gpufleet: x", wait=True, timeout=1,
                         poll_interval=0.2)
        assert res.is_failed and f"waiting for drained: {node} is draining" in res["msg"]
    finally:
        lab.run("scancel", job, check=False)


def test_slurmctld_down_is_a_clear_error(lab, localhost):
    conf = lab.dir / "etc" / "unreachable-node-test.conf"
    conf.write_text(lab.conf.read_text().replace(f"SlurmctldPort={lab.port_base + 17}", "SlurmctldPort=1"))
    try:
        res = slurm_node(localhost, name=lab.nodes[0], state="drained", reason="gpufleet: x",
                         slurm_conf=str(conf))
    finally:
        conf.unlink()
    assert res.is_failed and res["error_kind"] == "unreachable" and "slurmctld unreachable" in res["msg"]


# ---- check mode and diff through ansible-playbook (ansible-runner, as AWX runs it) ----------------------
PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Drain in check mode
      gpufleet.reliability.slurm_node:
        name: "{{ target }}"
        state: drained
        reason: "gpufleet: check mode"
      register: drain
    - name: Show the plan
      ansible.builtin.set_stats:
        data:
          drain: "{{ drain }}"
"""


def run_play(lab, tmp_path, monkeypatch, extravars, cmdline, play=PLAY):
    pdd = tmp_path / "runner"
    (pdd / "project").mkdir(parents=True)
    (pdd / "project" / "play.yml").write_text(play)
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    # os.environ's PATH already has the lab's wrappers first (24.11 lane); runner execs ansible-playbook from it
    env = {**lab.env, "ANSIBLE_COLLECTIONS_PATH": str(REPO / "collections"), "PATH": os.environ["PATH"]}
    r = ansible_runner.run(
        private_data_dir=str(pdd), playbook="play.yml", cmdline=cmdline, extravars=extravars, envvars=env,
        inventory={"all": {"hosts": {"localhost": {"ansible_connection": "local",
                                                   "ansible_python_interpreter": sys.executable}}}},
        quiet=True,
    )
    stats = next(e for e in r.events if e["event"] == "playbook_on_stats")
    return r, stats["event_data"].get("artifact_data", {})


def test_check_mode_changes_nothing_and_shows_the_diff(lab, tmp_path, monkeypatch):
    node = lab.nodes[1]
    r, data = run_play(lab, tmp_path, monkeypatch, {"target": node}, "--check --diff")
    assert r.status == "successful" and r.rc == 0
    assert r.stats["changed"] == {"localhost": 1}
    drain = data["drain"]
    assert drain["changed"] is True and drain["changed_nodes"] == [node]
    assert drain["after"][node]["sinfo_state"] == "drained"
    assert drain["diff"]["before"][node]["sinfo_state"] == "idle"
    assert drain["diff"]["after"][node] == {"state": "idle", "flags": ["DRAIN"], "reason": "gpufleet: check mode",
                                            "sinfo_state": "drained"}
    assert not [c for c in drain["commands"] if c[:2] == ["scontrol", "update"]]
    assert lab.node_states()[node][0] == "idle"
    # and for real, twice: changed, then not
    r, _out = run_play(lab, tmp_path / "real", monkeypatch, {"target": node}, "")
    assert r.status == "successful" and r.stats["changed"] == {"localhost": 1}
    assert lab.node_states()[node] == ("drained", "gpufleet: check mode")
    r, _out = run_play(lab, tmp_path / "again", monkeypatch, {"target": node}, "")
    assert r.status == "successful" and r.stats.get("changed", {}).get("localhost", 0) == 0


ANY_STATE_PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Change a node in check mode
      gpufleet.reliability.slurm_node:
        name: "{{ target }}"
        state: "{{ want }}"
        reason: "{{ why | default(omit) }}"
        only_if_reason_prefix: "{{ prefix | default(omit) }}"
      register: step
    - name: Show the plan
      ansible.builtin.set_stats:
        data:
          step: "{{ step }}"
"""


@pytest.mark.parametrize("want,start,why", [
    ("resumed", "drained", None),
    ("down", "idle", "gpufleet: check mode down"),
    ("rebooted", "idle", "gpufleet: check mode reboot"),
])
def test_check_mode_resume_down_reboot_change_nothing(lab, tmp_path, monkeypatch, want, start, why):
    node = lab.nodes[2]
    if start == "drained":
        lab.run("scontrol", "update", f"NodeName={node}", "State=DRAIN", "Reason=gpufleet: before check mode")
        lab.wait_for(node, "drained")
    before = lab.node_states()[node]
    reboots = lab.dir / "log" / "reboot-calls.log"
    reboot_log = reboots.read_text() if reboots.exists() else ""
    extravars = {"target": node, "want": want}
    if why:
        extravars["why"] = why
    if want == "resumed":
        extravars["prefix"] = "gpufleet:"
    r, data = run_play(lab, tmp_path, monkeypatch, extravars, "--check --diff", play=ANY_STATE_PLAY)
    assert r.status == "successful" and r.rc == 0
    step = data["step"]
    # check mode says what would change, and Slurm saw no update and no reboot request
    assert step["changed"] is True and step["changed_nodes"] == [node], step
    assert not [c for c in step["commands"] if c[:2] in (["scontrol", "update"], ["scontrol", "reboot"])], step
    time.sleep(1)
    assert lab.node_states()[node] == before
    assert (reboots.read_text() if reboots.exists() else "") == reboot_log
