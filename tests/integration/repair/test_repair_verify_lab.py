# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The role's own verification in the Slurm lab: with ``node_repair_verify_command`` empty, a repaired node is
judged by the gpu_health module on the node (the local connection: the lab's nodes are slurmd instances on this
host) replaying captures passed through ``node_repair_gpu_health_options``, plus ``dcgmi diag -r N`` when dcgmi is
on the node's PATH. Two repair.yml runs in all."""

from __future__ import annotations

import datetime
import os
import re

import pytest

from support.repair_lab import REPO

pytestmark = [pytest.mark.lab, pytest.mark.scenario]  # scenario: dealt between the releases (conftest)

GPU = REPO / "tests" / "fixtures" / "gpu"
HEALTHY_XML = GPU / "h100-8gpu-580.105.08-healthy.nvidia-smi-q-x.xml"
# real dmesg capture: Xid 48 (DBE) -> Xid 63 (row remap pending) -> Xid 94: unhealthy, reset_gpu
SICK_KMSG = GPU / "dmesg-iso-xid48-63-94-dbe-rowremap-contained.log"
ISO = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2},[0-9]{6}[+-][0-9]{2}:[0-9]{2}")


def _dated_now(text):
    """The capture with its ISO times moved to a minute from now (the lines keep their order and spacing)."""
    lines = [ln for ln in text.splitlines() if ISO.match(ln)]
    first = datetime.datetime.fromisoformat(ISO.match(lines[0]).group(0).replace(",", "."))
    shift = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(minutes=1) - first

    def move(m):
        t = datetime.datetime.fromisoformat(m.group(0).replace(",", ".")) + shift
        return t.isoformat(timespec="microseconds").replace(".", ",")

    return "\n".join(ISO.sub(move, ln, count=1) for ln in text.splitlines()) + "\n"


def _gpu_health_vars(captures):
    """gpu_health replays the healthy H100 capture and the node's own kernel log, ``captures/<node>.kmsg``."""
    return {
        "node_repair_verify_command": [],
        "node_repair_gpu_health_options": {
            "nvidia_smi_xml": str(HEALTHY_XML),
            "kmsg_path": str(captures / "{{ inventory_hostname }}.kmsg"),
        },
    }


def _sick(rl, *nodes):
    # the lab's agent drains each node (xid48 on GPU 3); the plan's first step is a GPU reset, then verification
    for n in nodes:
        rl.inject(n, "xid48", "reset_gpu")
    for n in nodes:
        rl.drained_by_agent(n)


def _results(art):
    return {r["node"]: r for r in art.get("gpufleet_repair_result", [])}


def _gpu_health_verdicts(runner):
    """{node: verdict} of the role's gpu_health task in that run (ansible-runner events)."""
    out = {}
    for ev in runner.events:
        data = ev.get("event_data", {})
        if ev.get("event") in ("runner_on_ok", "runner_on_failed") and data.get("task") == "Run gpu_health on the node":
            out[data["host"]] = data["res"].get("verdict")
    return out


def test_gpu_health_verdict_decides_the_resume(repair_lab, tmp_path):
    rl = repair_lab
    lab = rl.lab
    good, bad = lab.nodes[1], lab.nodes[2]
    captures = tmp_path / "captures"
    captures.mkdir()
    (captures / f"{good}.kmsg").write_text("")  # after the reset: a clean kernel log
    # after the reset: still DBE + pending row remap, in lines dated after the reset began (the verification
    # forgets the kernel lines from before the step it checks: what the step repaired)
    (captures / f"{bad}.kmsg").write_text(_dated_now(SICK_KMSG.read_text()))
    _sick(rl, good, bad)

    r, art = rl.run(ok=False, **_gpu_health_vars(captures))  # a failed verification fails the run
    assert _gpu_health_verdicts(r) == {good: "healthy", bad: "unhealthy"}
    assert art["gpufleet_repair_summary"]["nodes"]["failed"] == [bad], art["gpufleet_repair_summary"]
    plan = {d["node"]: d["action"] for d in art["gpufleet_repair_plan"]["decisions"]}
    assert plan[good] == plan[bad] == "reset_gpu", plan
    res = _results(art)
    assert res[good]["verified"] == "healthy" and res[good]["resumed"], res
    assert res[bad]["verified"] == "unhealthy" and not res[bad]["resumed"], res
    assert not res[good]["failed"] and not res[bad]["failed"], res

    # healthy: resumed, incident closed with the reset recorded as ok
    assert lab.wait_for(good, "idle", timeout=20)[0] == "idle"  # idle* for ~1-2 s after a resume
    h_good = rl.history(good)
    assert "i" not in h_good and "g" in h_good["r"], h_good
    # sick: still drained by us, the reset recorded as failed, the incident stays open
    state, reason = lab.node_states()[bad]
    assert state == "drained" and reason.startswith("gpufleet:"), (state, reason)
    step = rl.history(bad)["i"]["s"][-1]
    assert step[0] == "g" and step[2] == "f", rl.history(bad)


def test_failed_dcgm_diag_keeps_a_healthy_node_out(repair_lab, tmp_path, monkeypatch):
    rl = repair_lab
    lab = rl.lab
    node = lab.nodes[1]
    captures = tmp_path / "captures"
    captures.mkdir()
    (captures / f"{node}.kmsg").write_text("")
    # a fake dcgmi first on the PATH of the run (the node's PATH: local connection): records its arguments, fails
    fake = tmp_path / "dcgm-bin"
    fake.mkdir()
    calls = tmp_path / "dcgmi.log"
    dcgmi = fake / "dcgmi"
    dcgmi.write_text(f'#!/usr/bin/env bash\necho "$*" >>{calls}\n'
                     'echo "| Diagnostic | Fail - GPU 3: Memory test failed (DBE) |"\nexit 1\n')
    dcgmi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    _sick(rl, node)

    r, art = rl.run(ok=False, node_repair_dcgm_level=2, **_gpu_health_vars(captures))
    assert _gpu_health_verdicts(r) == {node: "healthy"}  # gpu_health alone would resume it
    res = _results(art)[node]
    assert res["action"] == "reset_gpu" and res["verified"] == "unhealthy" and not res["resumed"], res
    assert calls.read_text().split("\n")[:1] == ["diag -r 2"], calls.read_text()
    assert lab.node_states()[node][0] == "drained"
    step = rl.history(node)["i"]["s"][-1]
    assert step[0] == "g" and step[2] == "f", rl.history(node)
