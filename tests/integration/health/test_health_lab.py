# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The real agent as the lab's HealthCheckProgram against a real Slurm (munged + slurmctld + slurmd per node).

The lab's HealthCheckProgram execs $LAB/etc/healthcheck.hook with SLURMD_NODENAME; the hook installed here runs
`gpufleet-health check --slurm` with a per-node GPU stand-in chosen by that name: a fake NVML config
(<node>.fake.json), a replayed kernel log (<node>.kmsg), or a healthy fake node.
"""
from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
FIX = REPO / "tests" / "fixtures" / "gpu"
AGENT = Path(sys.executable).parent / "gpufleet-health"

#: Seconds a health check itself may take after slurmd starts it (the agent's interpreter and probe, on a loaded
#: 2-core machine running several labs): a drain is due within the interval plus this.
CHECK_RUN_S = 20
pytestmark = pytest.mark.lab


def healthcheck_interval(lab) -> int:
    for line in lab.run("scontrol", "show", "config").stdout.splitlines():
        if line.split("=")[0].strip() == "HealthCheckInterval":
            return int(line.split("=", 1)[1].split()[0])
    raise AssertionError("HealthCheckInterval not in scontrol show config")


@pytest.fixture
def hook(lab, tmp_path):
    """Install the hook; return the directory where per-node stand-ins and run logs live."""
    d = tmp_path / "nodes"
    d.mkdir()
    (d / "healthy.json").write_text("{}")
    script = f"""#!/usr/bin/env bash
# gpufleet health lab hook: the real agent, GPU stand-in chosen by node name.
set -u
node=${{SLURMD_NODENAME:?}}
d={shlex.quote(str(d))}
args=(check --slurm --json --node "$node" --state-file "$d/$node.state" --expected-gpus 8)
fake="$d/$node.fake.json"
[[ -f "$fake" ]] || fake="$d/healthy.json"
args+=(--fake-nvml "$fake")
if [[ -f "$d/$node.kmsg" ]]; then args+=(--kmsg "$d/$node.kmsg"); else args+=(--kmsg -); fi
{shlex.quote(str(AGENT))} "${{args[@]}}" >"$d/$node.last.json.tmp" 2>"$d/$node.last.err.tmp"
rc=$?
# the test reads these while checks run: each appears whole (a rename), never empty or half-written
mv -f "$d/$node.last.err.tmp" "$d/$node.last.err"; mv -f "$d/$node.last.json.tmp" "$d/$node.last.json"
echo "$(date +%s.%N) rc=$rc" >>"$d/$node.runs"
exit 0
"""
    lab.hook.write_text(script)
    lab.hook.chmod(0o755)
    yield d
    if lab.hook.exists():
        lab.hook.unlink()


def runs(d: Path, node: str) -> int:
    p = d / f"{node}.runs"
    return len(p.read_text().splitlines()) if p.exists() else 0


def wait_runs(d: Path, node: str, n: int, timeout: float):
    deadline = time.monotonic() + timeout
    while runs(d, node) < n:
        if time.monotonic() > deadline:
            raise AssertionError(f"{node}: hook ran {runs(d, node)} times, wanted {n} within {timeout}s")
        time.sleep(0.1)


def test_healthy_nodes_stay_idle(lab, hook):
    interval = healthcheck_interval(lab)
    for node in lab.nodes:
        wait_runs(hook, node, 2, 3 * interval + 10)
    assert all(s == "idle" for s, _reason in lab.node_states().values()), lab.node_states()
    last = json.loads((hook / f"{lab.nodes[0]}.last.json").read_text())
    assert last["verdict"] == "healthy" and last["slurm"]["action"] == "none"


def test_fault_drains_that_node_within_interval(lab, hook):
    interval = healthcheck_interval(lab)
    node, other = lab.nodes[1], lab.nodes[0]
    wait_runs(hook, node, 1, 2 * interval + 10)  # the hook is live for this node
    (hook / f"{node}.fake.json").write_text(json.dumps({"devices": [{"index": 3, "fail": {"mode": "lost",
                                                                                          "after_calls": 5}}]}))
    state, reason = lab.wait_for(node, lambda sr: sr[0] in ("drained", "draining"), timeout=interval + CHECK_RUN_S)
    assert reason.startswith("gpufleet:") and reason == "gpufleet: gpu_lost gpu3", reason
    # the check drains before it prints its report: wait for the report of the check that drained
    deadline = time.monotonic() + CHECK_RUN_S
    while (last := json.loads((hook / f"{node}.last.json").read_text()))["verdict"] != "unhealthy":
        assert time.monotonic() < deadline, last
        time.sleep(0.2)
    assert last["slurm"]["action"] in ("drained", "already_drained"), last
    assert lab.node_states()[other][0] == "idle"


def test_replayed_kernel_log_drains(lab, hook):
    interval = healthcheck_interval(lab)
    node = lab.nodes[2]
    wait_runs(hook, node, 1, 2 * interval + 10)
    text = (FIX / "kmsg-fallen-off-bus-without-xid.log").read_text()
    (hook / f"{node}.kmsg").write_text(text)
    state, reason = lab.wait_for(node, lambda sr: sr[0] in ("drained", "draining"), timeout=interval + CHECK_RUN_S)
    assert reason.startswith("gpufleet: xid79"), reason


def test_node_drained_by_someone_else_is_left_alone(lab, hook):
    interval = healthcheck_interval(lab)
    node = lab.nodes[0]
    lab.run("scontrol", "update", f"NodeName={node}", "State=DRAIN", "Reason=admin: PSU swap")
    lab.wait_for(node, "drained", timeout=10)
    (hook / f"{node}.fake.json").write_text(json.dumps({"init_error": "LibRmVersionMismatch"}))
    start = runs(hook, node)
    wait_runs(hook, node, start + 2, 3 * interval + 10)
    assert lab.node_states()[node] == ("drained", "admin: PSU swap")
    last = json.loads((hook / f"{node}.last.json").read_text())
    assert last["verdict"] == "unhealthy" and last["slurm"]["action"] == "left_alone"


def test_agent_never_resumes(lab, hook):
    interval = healthcheck_interval(lab)
    node = lab.nodes[3] if len(lab.nodes) > 3 else lab.nodes[-1]
    wait_runs(hook, node, 1, 2 * interval + 10)
    fake = hook / f"{node}.fake.json"
    fake.write_text(json.dumps({"devices": [{"index": 0, "remapped_rows": [0, 1, 1, 0]}]}))
    lab.wait_for(node, lambda sr: sr[0] == "drained" and sr[1] == "gpufleet: row_remap_pending gpu0",
                 timeout=interval + CHECK_RUN_S)
    fake.write_text("{}")  # the GPU is fine again (say, after a reset by the repair flow)
    start = runs(hook, node)
    wait_runs(hook, node, start + 2, 3 * interval + 10)
    last = json.loads((hook / f"{node}.last.json").read_text())
    assert last["verdict"] == "healthy" and last["slurm"]["action"] == "none"
    assert lab.node_states()[node] == ("drained", "gpufleet: row_remap_pending gpu0")  # resuming is repair's job
