# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The health sweep from the installed collection against the real Slurm lab: gpu_health on two lab nodes (this
host has no NVIDIA driver: the node that expects 8 GPUs is unhealthy, the CPU node expecting 0 is healthy), the
findings published with set_stats, and the repair policy drains the sick node only (reason gpufleet:...).
`--check` first drains nothing."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import ansible_runner
import pytest

pytestmark = pytest.mark.lab


def sweep(ic, lab, tmp_path: Path, name: str, cmdline=None):
    pdd = tmp_path / name
    (pdd / "project").mkdir(parents=True)
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    extravars = {
        "gpufleet_sweep_hosts": "node1,node2", "gpufleet_sweep_become": False,
        "node_repair_reports_dir": str(tmp_path / "reports"), "node_repair_state_dir": str(tmp_path / "state"),
        "node_repair_config": {"ttl": 0, "cooldown": 0,
                               "blast_radius": {"max_unavailable": len(lab.nodes), "min_healthy": 0},
                               "breaker": {"min_nodes": len(lab.nodes)}},
    }
    r = ansible_runner.run(
        private_data_dir=str(pdd), playbook="gpufleet.reliability.health_sweep", quiet=True, extravars=extravars,
        cmdline=cmdline, timeout=600,
        inventory={"all": {"hosts": {"node1": dict(local, gpufleet_sweep_expected_gpus=8),
                                     "node2": dict(local, gpufleet_sweep_expected_gpus=0),
                                     "localhost": local}}},
        envvars=dict(ic.ansible_env, SLURM_CONF=str(lab.conf),
                     PATH=str(Path(sys.executable).parent) + ":" + os.environ.get("PATH", "") + ":/usr/sbin:/sbin"),
    )
    failures = [e["event_data"].get("res") for e in r.events if e["event"] == "runner_on_failed"]
    assert r.status == "successful", failures or r.stdout.read()[-6000:]
    return next(e for e in r.events if e["event"] == "playbook_on_stats")["event_data"]["artifact_data"]


def reason(lab, node):
    out = lab.run("scontrol", "-o", "show", "node", node).stdout
    state = out.split("State=", 1)[1].split()[0]
    return state, (out.split("Reason=", 1)[1].split(" [", 1)[0] if "Reason=" in out else "")


def test_sweep_publishes_and_drains_through_the_policy(installed_collection, lab, tmp_path):
    stats = sweep(installed_collection, lab, tmp_path, "check", cmdline="--check")
    assert stats["gpufleet_health_sweep"]["verdicts"] == {"node1": "unhealthy", "node2": "healthy"}
    assert "DRAIN" not in reason(lab, "node1")[0]

    stats = sweep(installed_collection, lab, tmp_path, "real")
    sweep_stats = stats["gpufleet_health_sweep"]
    assert sweep_stats["checked"] == 2 and set(sweep_stats["findings"]) == {"node1"}
    decisions = {d["node"]: d["action"] for d in stats["gpufleet_repair_plan"]["decisions"]}
    assert decisions.get("node1") == "drain", decisions
    assert "node2" not in decisions
    state, why = reason(lab, "node1")
    assert "DRAIN" in state and why.startswith("gpufleet:") and "nvml_missing" in why, (state, why)
    assert "DRAIN" not in reason(lab, "node2")[0]
