# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""slurm_stuck's decision: which nodes are stuck, from Node records and COMPLETING jobs."""
from __future__ import annotations

from ansible_collections.gpufleet.reliability.plugins.module_utils.slurm import Node
from ansible_collections.gpufleet.reliability.plugins.modules.slurm_stuck import find_stuck

NOW = 1_796_232_000


def job(jid, ended_ago):
    return {"job_id": jid, "state": "COMPLETING", "end_time": NOW - ended_ago if ended_ago is not None else None}


def test_completing_beyond_threshold_only():
    nodes = {
        "a": Node("a", state="idle", flags=frozenset({"COMPLETING"})),
        "b": Node("b", state="idle", flags=frozenset({"COMPLETING"})),
        "c": Node("c", state="idle", flags=frozenset({"COMPLETING"})),
        "d": Node("d", state="idle"),
    }
    jobs = {"a": [job("1", 700), job("2", 30)], "b": [job("3", 30)], "c": [job("4", None)]}
    stuck, completing = find_stuck(nodes, jobs, NOW, 600, ["Kill task failed"])
    assert completing == {"a": 700, "b": 30, "c": None}
    assert stuck == [{"node": "a", "kind": "completing", "seconds": 700, "jobs": ["1", "2"], "state": "completing",
                      "reason": ""}]


def test_unkillable_only_while_drained_or_down():
    nodes = {
        "x": Node("x", state="idle", flags=frozenset({"DRAIN"}), reason="Kill task failed"),
        "y": Node("y", state="idle", reason="Kill task failed"),  # resumed since (24.11 keeps the reason)
        "z": Node("z", state="down", reason="Kill task failed: step 7.0"),
    }
    stuck, _completing = find_stuck(nodes, {}, NOW, 600, ["Kill task failed"])
    assert [(s["node"], s["kind"]) for s in stuck] == [("x", "unkillable"), ("z", "unkillable")]
