# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A storm on 16 nodes: the real agent (`gpufleet-health check --slurm --repair-config`) as the HealthCheckProgram
of 16 real slurmd, a replayed sick capture on every node at once.

Warnings (a replayed Xid 79 kernel log; the probe still sees every GPU) are never drained by the agents, not even
for a moment: each agent leaves its warning to the repair run (one writer, which drains within the limits; its lab
tests show that part). Before, 13 agents drained within 0.15 s and 12 took it back 2.8 s later. Nodes whose GPU is
lost (the probe) are all drained at once, whatever the limits.

This module runs its own 16-node lab (a block of its own from the lab factory; SLURM_STORM_LAB_PORT_BASE asks for one),
with a second partition ``pair`` = the last two nodes, and stops it at the end.
"""
from __future__ import annotations

import json
import os
import shlex
import sys
import time
from pathlib import Path

import pytest

from support.labs import running_lab

REPO = Path(__file__).resolve().parents[3]
XID79 = REPO / "tests" / "fixtures" / "gpu" / "kmsg-fallen-off-bus-without-xid.log"
AGENT = Path(sys.executable).parent / "gpufleet-health"
N = 16
INTERVAL = 10

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def storm_lab(slurm_lab, tmp_path_factory):
    extra = tmp_path_factory.mktemp("storm") / "extra.conf"
    extra.write_text(f"PartitionName=pair Nodes=node{N - 1},node{N} MaxTime=INFINITE State=UP\n")
    base = os.environ.get("SLURM_STORM_LAB_PORT_BASE")
    # 16 slurmd (in the 24.11 chroot too) on a small shared machine take longer than the default 60 s
    with running_lab("the 16-node storm lab", nodes=N, release=slurm_lab.release, base=int(base) if base else None,
                     SLURM_LAB_EXTRA_CONF=str(extra), SLURM_LAB_HEALTHCHECK_INTERVAL=str(INTERVAL),
                     SLURM_LAB_TIMEOUT=os.environ.get("SLURM_LAB_TIMEOUT", "300")) as lab:
        yield lab


@pytest.fixture
def storm(storm_lab, tmp_path):
    """The lab reset (which removes the hook), then the hook: the real agent with --repair-config
    <dir>/repair.json; per-node stand-ins."""
    storm_lab.reset()
    d = tmp_path / "nodes"
    d.mkdir()
    (d / "healthy.json").write_text("{}")
    (d / "repair.json").write_text("{}")
    script = f"""#!/usr/bin/env bash
set -u
node=${{SLURMD_NODENAME:?}}
d={shlex.quote(str(d))}
mkdir -p "$d/tf-$node"
args=(check --slurm --json --node "$node" --state-file "$d/$node.state" --expected-gpus 8
      --repair-config "$d/repair.json" --textfile "$d/tf-$node")
fake="$d/$node.fake.json"
[[ -f "$fake" ]] || fake="$d/healthy.json"
args+=(--fake-nvml "$fake")
if [[ -f "$d/$node.kmsg" ]]; then args+=(--kmsg "$d/$node.kmsg"); else args+=(--kmsg -); fi
out="$d/$node.out.$$" err="$d/$node.err.$$"
{shlex.quote(str(AGENT))} "${{args[@]}}" >"$out" 2>"$err"
rc=$?
# each run writes files of its own (two checks of one node may overlap on a loaded machine, and one run's output
# must never replace the other's): its history line is its own report, appended in one write; the test reads
# last.json while checks run, so it appears whole (a rename), never empty or half-written
printf '%s\\n' "$(tr -d '\\n' <"$out")" >>"$d/$node.history.jsonl"
cat "$err" >>"$d/$node.err.log"
mv -f "$err" "$d/$node.last.err"; mv -f "$out" "$d/$node.last.json"
echo "$(date +%s.%N) rc=$rc" >>"$d/$node.runs"
exit 0
"""
    tmp = storm_lab.hook.with_name(storm_lab.hook.name + ".new")
    tmp.write_text(script)
    tmp.chmod(0o755)
    tmp.replace(storm_lab.hook)  # slurmd never runs a half-written hook
    yield storm_lab, d
    storm_lab.stop_hooks()  # a check started before still runs this test's hook: it ends before the next test


def runs(d: Path, node: str) -> int:
    p = d / f"{node}.runs"
    return len(p.read_text().splitlines()) if p.exists() else 0


def wait_runs(lab, d: Path, n_more: int, timeout: float = 240):
    start = {node: runs(d, node) for node in lab.nodes}
    deadline = time.monotonic() + timeout
    while any(runs(d, node) < start[node] + n_more for node in lab.nodes):
        if time.monotonic() > deadline:
            raise AssertionError(f"health checks did not run {n_more} more times within {timeout}s: "
                                 f"{dict((node, runs(d, node) - start[node]) for node in lab.nodes)}")
        time.sleep(0.5)


def history(d: Path, node: str) -> list:
    p = d / f"{node}.history.jsonl"
    out = []
    for line in (p.read_text().splitlines() if p.exists() else []):
        if line.strip():
            out.append(json.loads(line))
    return out


def drained(lab) -> dict:
    return {n: r for n, (s, r) in lab.node_states().items() if s in ("drained", "draining")}


def settle(lab, d, want: int, timeout: float = 300) -> dict:
    """Poll until ``want`` nodes are drained, then check that it stays so for two more checks of every node."""
    deadline = time.monotonic() + timeout
    while len(drained(lab)) != want:
        if time.monotonic() > deadline:
            raise AssertionError(f"wanted {want} drained nodes within {timeout}s, got {drained(lab)}")
        time.sleep(0.5)
    wait_runs(lab, d, 2)
    now = drained(lab)
    assert len(now) == want, now
    return now


def sick_everywhere(lab, d):
    text = XID79.read_text()
    for node in lab.nodes:  # all at once, between two checks
        (d / f"{node}.kmsg").write_text(text)


def test_a_warning_storm_never_takes_a_node_out_of_service(storm):
    lab, d = storm
    wait_runs(lab, d, 1)
    sick_everywhere(lab, d)
    # Watch Slurm as closely as sinfo allows while every agent checks twice: a drain that lasted even a fraction of
    # a second (the old drain-then-take-back) shows here.
    start = {node: runs(d, node) for node in lab.nodes}
    deadline = time.monotonic() + 240
    looks = 0
    while any(runs(d, node) < start[node] + 2 for node in lab.nodes):
        assert time.monotonic() < deadline, {node: runs(d, node) - start[node] for node in lab.nodes}
        assert drained(lab) == {}, drained(lab)
        looks += 1
    assert looks > 10, looks
    for node in lab.nodes:
        last = json.loads((d / f"{node}.last.json").read_text())
        assert last["verdict"] == "unhealthy" and last["code"].startswith("xid79"), last
        s = last["slurm"]
        assert (s["action"], s["rule"], s["forced"]) == ("defer", "one_writer", False), s
        assert "repair run" in s["detail"] and "breaker" not in s
        # the metric the repair loop's alert (GpufleetDrainWanted) starts a repair run on
        prom = (d / f"tf-{node}" / "gpufleet_health.prom").read_text()
        assert f'gpufleet_health_drain_held{{node="{node}"}} 1' in prom, prom
        assert {h["slurm"]["action"] for h in history(d, node)} <= {"none", "defer"}


def test_lost_gpus_drain_at_once_whatever_the_limits(storm):
    lab, d = storm
    wait_runs(lab, d, 1)
    lost = json.dumps({"devices": [{"index": 3, "fail": {"mode": "lost", "after_calls": 5}}]})
    for node in lab.nodes:
        (d / f"{node}.fake.json").write_text(lost)
    out = settle(lab, d, N)  # every node: no limit stops a node that cannot run jobs
    assert set(out.values()) == {"gpufleet: gpu_lost gpu3"}, out
    drains = {}
    for node in lab.nodes:
        for h in history(d, node):
            if h["slurm"]["action"] == "drained":
                drains[node] = h["slurm"]
    assert sorted(drains) == sorted(lab.nodes), drains
    assert all(s["forced"] and s["rule"] == "cannot_run_jobs" for s in drains.values()), drains
    # each agent decides once, from its own reading: one that already sees 7 drains by us within the window says
    # the breaker tripped (in a storm this simultaneous few do; the repair run's breaker is the one that pages)
    for s in drains.values():
        assert s.get("breaker", "circuit breaker tripped: ").startswith("circuit breaker tripped: "), s
