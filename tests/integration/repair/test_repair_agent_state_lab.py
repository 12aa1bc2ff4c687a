# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""One definition of healthy (issue 27 case 3): the node's agent keeps a state file, as the gpu_health role runs
it, and remembers a severe Xid for hours. A repair verified healthy must not be undone by that memory: the
verification runs the agent on its own state file with ``--repaired-at {since}``, and the agent forgets what the
step fixed."""

from __future__ import annotations

import json
import sys
import time

import pytest

from support.repair_lab import FAKEGPU, wait_until

pytestmark = [pytest.mark.lab, pytest.mark.scenario]  # scenario: dealt between the releases (conftest)


def test_a_verified_reset_is_not_undone_by_the_agents_memory(repair_lab):
    rl = repair_lab
    lab = rl.lab
    n = lab.nodes[1]
    (rl.dir / "faults" / "state-files").write_text("")
    state_file = rl.dir / "faults" / f"{n}.state.json"
    rl.sicken([n], "xid48", "reset_gpu")
    # the agent remembers the Xid in its state file (what re-drained a resumed node before)
    remembered = json.loads(state_file.read_text())["events"]
    assert 48 in [e.get("xid") for e in remembered], remembered

    verify = [sys.executable, str(FAKEGPU), "check", str(rl.dir), "{node}", "--repaired-at", "{since}"]
    runs = rl.until(lambda: lab.node_states()[n][0] == "idle", runs=3, node_repair_verify_command=verify)
    first = {d["node"]: d for d in runs[0]["gpufleet_repair_plan"]["decisions"]}[n]
    assert first["action"] == "reset_gpu" and isinstance(first["since"], int), first
    assert len(rl.resets(n)) == 1
    results = [r for art in runs for r in art.get("gpufleet_repair_result", [])]
    assert any(r["node"] == n and r["verified"] == "healthy" and r["resumed"] for r in results), results
    state = json.loads(state_file.read_text())
    assert state["events"] == [] and state["repaired_at"] == first["since"], state

    # the agent runs every few seconds as HealthCheckProgram with the same state file: three more of its runs,
    # and the node stays in service
    report = rl.dir / "reports" / f"{n}.json"
    resumed = time.time()
    wait_until(lambda: report.stat().st_mtime > resumed + 12, timeout=90, what="three more agent runs")
    assert lab.node_states()[n][0] == "idle", lab.node_states()[n]
    assert json.loads(report.read_text())["verdict"] == "healthy"
    assert len(rl.resets(n)) == 1
