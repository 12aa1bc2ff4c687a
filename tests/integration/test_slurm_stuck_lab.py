# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""gpufleet.reliability.slurm_stuck against the real lab.

A node is made to hang in COMPLETING for real: the lab's Epilog runs $LAB/etc/epilog.hook, and the hook here
blocks (on one node) until a hold file goes away, exactly as a hung epilog keeps a job COMPLETING on a cluster.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.lab


def slurm_stuck(host, **kwargs):
    return getattr(host, "gpufleet.reliability.slurm_stuck")(**kwargs)["localhost"]


@pytest.fixture
def hung_epilog(lab):
    """Hold the epilog on one node: returns (node, job id, hold file). Released at the end."""
    node = lab.nodes[2]
    hold = lab.dir / "flags" / "hold-epilog"
    hold.write_text("")
    hook = lab.dir / "etc" / "epilog.hook"
    hook.write_text(
        "#!/bin/sh\n"
        f'[ "$SLURMD_NODENAME" = "{node}" ] || exit 0\n'
        "i=0\n"
        f'while [ -e "{hold}" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done\n'
        "exit 0\n"
    )
    hook.chmod(0o755)
    job = lab.run("sbatch", "--parsable", "-w", node, "-o", "/dev/null", "--wrap", "true").stdout.strip()
    lab.wait_for(node, "completing", timeout=30)
    yield node, job, hold
    hold.unlink(missing_ok=True)
    hook.unlink(missing_ok=True)
    lab.wait_for(node, lambda sr: "completing" not in sr[0], timeout=60)


def adhoc_check(args):
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(REPO / "collections"))
    p = subprocess.run([str(Path(sys.executable).parent / "ansible"), "localhost", "-m",
                        "gpufleet.reliability.slurm_stuck", "-a", args, "--check", "-o"],
                       env=env, capture_output=True, text=True, timeout=120, cwd=REPO, check=False)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(p.stdout[p.stdout.index("{"):])


def poll_stuck(localhost, timeout=30, **kwargs):
    deadline = time.monotonic() + timeout
    while True:
        res = slurm_stuck(localhost, **kwargs)
        assert res.is_successful, res
        if res["stuck"] or time.monotonic() > deadline:
            return res
        time.sleep(0.5)


def test_completing_node_is_detected_and_drained(lab, localhost, hung_epilog):
    node, job, hold = hung_epilog
    young = slurm_stuck(localhost, completing_after=3600, drain=True)
    assert young.is_successful and young["stuck"] == [] and young["changed"] is False
    assert node in young["completing"]

    found = poll_stuck(localhost, completing_after=1)
    assert [s["node"] for s in found["stuck"]] == [node]
    entry = found["stuck"][0]
    assert entry["kind"] == "completing" and entry["jobs"] == [job] and entry["seconds"] >= 1
    assert entry["state"] == "completing"
    assert found["changed"] is False and lab.node_states()[node][0] == "completing"

    # check mode (the pytest-ansible dispatcher has none): the ansible CLI with --check changes nothing
    check = adhoc_check("completing_after=1 drain=true")
    assert check["changed"] is True and check["drained"] == [node]
    assert lab.node_states()[node][0] == "completing"

    drained = slurm_stuck(localhost, completing_after=1, drain=True)
    assert drained.is_successful and drained["changed"] is True and drained["drained"] == [node]
    assert lab.node_states()[node] == ("draining", "gpufleet: stuck completing")
    again = slurm_stuck(localhost, completing_after=1, drain=True)
    assert again["changed"] is False and again["stuck"][0]["node"] == node  # still stuck, already drained

    hold.unlink()
    lab.wait_for(node, "drained", timeout=60)
    after = slurm_stuck(localhost, completing_after=1)
    assert after["stuck"] == [] and after["completing"] == {}


def test_unkillable_step_reason_is_reported_not_redrained(lab, localhost):
    """slurmstepd drains a node with 'Kill task failed' when a step outlives UnkillableStepTimeout. The lab's
    proctrack/linuxproc cannot produce a truly unkillable step (it stops tracking a frozen process), so this
    test sets the node state slurmstepd would set and checks the report; the COMPLETING test above is real."""
    node = lab.nodes[1]
    lab.run("scontrol", "update", f"NodeName={node}", "State=DRAIN", "Reason=Kill task failed")
    res = slurm_stuck(localhost, drain=True)
    assert res.is_successful
    assert res["stuck"] == [{"node": node, "kind": "unkillable", "seconds": None, "jobs": [], "state": "drained",
                             "reason": "Kill task failed"}]
    assert res["changed"] is False and lab.node_states()[node] == ("drained", "Kill task failed")


def test_bad_options_and_unknown_nodes(lab, localhost):
    res = slurm_stuck(localhost, completing_after=-1)
    assert res.is_failed and "completing_after must be >= 0" in res["msg"]
    res = slurm_stuck(localhost, name="nosuch[1-2]")
    assert res.is_failed and res["error_kind"] == "unknown_node"
