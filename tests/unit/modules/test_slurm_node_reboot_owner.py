"""slurm_node state=rebooted with only_if_reason_prefix: a reboot never overwrites somebody else's reason (the
ownership rule of slurmfacts.py); the plan of the module, on Slurm's node records."""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.reliability.plugins.module_utils.slurm import Node
from ansible_collections.gpufleet.reliability.plugins.modules.slurm_node import _plan

P = {"state": "rebooted", "reason": "gpufleet: reboot xid79 (incident 1)", "nextstate": "down", "asap": True,
     "skip_if_booted_since": None, "only_if_reason_prefix": "gpufleet:"}


@pytest.mark.parametrize("node,rebooted", [
    (Node("n1", "idle", frozenset({"DRAIN"}), "gpufleet: xid79 gpu3"), True),
    (Node("n2", "idle", frozenset({"DRAIN"}), "ops: cable"), False),
    (Node("n3", "down", frozenset(), "ops: psu"), False),
    (Node("n4", "down", frozenset({"DRAIN", "REBOOT_ISSUED"}), "ops: cable"), False),
    (Node("n5", "idle", frozenset(), "ops: old reason kept by 24.11 after a resume"), True),
])
def test_reboot_skips_nodes_out_of_service_by_someone_else(node, rebooted):
    targets, skipped, predicted = _plan({node.name: node}, P)
    assert (node.name in targets) == rebooted, skipped
    if not rebooted:
        assert "someone else" in skipped[node.name]
    else:
        assert predicted[node.name].reason == P["reason"]


def test_without_the_prefix_the_reboot_is_generic():
    node = Node("n2", "idle", frozenset({"DRAIN"}), "ops: cable")
    targets, _skipped, _pred = _plan({"n2": node}, dict(P, only_if_reason_prefix=None))
    assert targets == ["n2"]
