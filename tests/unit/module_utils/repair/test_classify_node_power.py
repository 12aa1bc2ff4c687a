# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The repair plan on the health brain's node-level power report (HW power brake / HW slowdown on every GPU):
verdict degraded, action monitor, ``drain: true``. The gpufleet-health agent drains such a node for a person to
investigate; the repair plan must never answer it with a GPU reset or a reboot, nor resume it."""

from __future__ import annotations

import pytest
from repair_builders import NOW, fleet, in_service, node

from ansible_collections.gpufleet.reliability.plugins.module_utils.health import GpuSnapshot, Snapshot, judge
from ansible_collections.gpufleet.reliability.plugins.module_utils.repair import RepairConfig, plan
from ansible_collections.gpufleet.reliability.plugins.module_utils.repair.model import REPAIR_STEPS


def brake_report(reason="hw_power_brake_slowdown"):
    gpus = [GpuSnapshot(index=i, name="NVIDIA H100 80GB HBM3", clocks_event_reasons=[reason, "sw_power_cap"])
            for i in range(8)]
    d = judge(Snapshot(gpus=gpus), (), now=NOW).to_dict()
    assert (d["verdict"], d["action"], d["drain"]) == ("degraded", "monitor", True), d["summary"]
    return d


CASES = [
    ("node_power_brake", brake_report()),
    ("node_hw_slowdown", brake_report("hw_slowdown")),
]


@pytest.mark.parametrize("code,rep", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("resume_degraded", [True, False])
def test_never_a_repair_step(code, rep, resume_degraded):
    assert rep["code"] == code
    cfg = RepairConfig.from_dict({"resume_degraded": resume_degraded})
    for n in (node(rep=rep, reason=f"gpufleet: {code}"), in_service(rep=rep)):
        (d,) = plan(fleet(), [n], cfg, NOW)
        assert d.action not in REPAIR_STEPS, d.reason


@pytest.mark.parametrize("code,rep", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("resume_degraded", [True, False])
def test_drained_by_us_stays_drained_for_a_person(code, rep, resume_degraded):
    cfg = RepairConfig.from_dict({"resume_degraded": resume_degraded})
    (d,) = plan(fleet(), [node(rep=rep, reason=f"gpufleet: {code}")], cfg, NOW)
    assert (d.action, d.rule) == ("hold", "drain_requested"), (d.action, d.rule, d.reason)
    # without the drain request the same degraded report is resumed (rule 3): the flag is what holds it
    plain = dict(rep, drain=False)
    (d,) = plan(fleet(), [node(rep=plain, reason=f"gpufleet: {code}")], RepairConfig.from_dict({}), NOW)
    assert d.action == "resume", (d.action, d.rule, d.reason)
