# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one Slurm node model (module_utils/slurm/node.py): out of service and "drained by us" are the brain's rule
(slurmfacts.py), whatever Slurm output the node came from; to_dict/from_dict round-trip (inventory cache)."""
from __future__ import annotations

from pathlib import Path

import pytest

from ansible_collections.gpufleet.reliability.plugins.module_utils import slurmfacts as owner
from ansible_collections.gpufleet.reliability.plugins.module_utils.slurm import Node, parse_nodes_json, split_state

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "slurm"
PREFIX = "gpufleet:"


def node(state, reason=""):
    base, flags = split_state(state)
    return Node("n1", base, flags, reason)


@pytest.mark.parametrize("state, out", [
    ("IDLE", False), ("MIXED", False), ("ALLOCATED+COMPLETING", False), ("IDLE*", False),
    ("IDLE+REBOOT_REQUESTED", False),
    ("IDLE+DRAIN", True), ("MIXED+DRAIN", True), ("DOWN", True), ("DOWN*", True), ("IDLE+FAIL", True),
    ("DOWN+DRAIN+REBOOT_ISSUED", True), ("drained", True), ("draining", True),
])
def test_out_of_service_is_the_owner_rule(state, out):
    n = node(state)
    assert n.out_of_service is out
    assert owner.out_of_service(n.state, n.flags) is out


@pytest.mark.parametrize("state, reason, ours, foreign", [
    ("IDLE+DRAIN", "gpufleet: xid79 gpu3", True, False),
    ("DOWN", "gpufleet: reboot xid79 : reboot issued", True, False),   # Slurm keeps our prefix through its reboot
    ("IDLE+DRAIN", "ops: psu", False, True),
    ("IDLE+DRAIN", " gpufleet: leading space is not ours", False, True),
    ("IDLE+DRAIN", "", False, True),
    ("IDLE", "gpufleet: kept by 24.11 after a resume", False, False),  # in service: nobody's, not ours to resume
    ("IDLE", "ops: old reason", False, False),
])
def test_drained_by_and_foreign(state, reason, ours, foreign):
    n = node(state, reason)
    assert n.drained_by(PREFIX) is ours
    assert (n.foreign(PREFIX) is not None) is foreign
    assert n.foreign(PREFIX) == owner.foreign_reason(n.state, n.flags, n.reason, PREFIX)


def test_an_empty_prefix_is_refused():
    with pytest.raises(ValueError, match="reason_prefix"):
        node("IDLE+DRAIN", "anything").drained_by("")


@pytest.mark.parametrize("fixture", ["sinfo-json-22.05.json", "sinfo-json-24.11.json",
                                     "scontrol-show-node-json-24.11.json"])
def test_captured_nodes_agree_with_the_owner_rule_and_round_trip(fixture):
    nodes = parse_nodes_json((FIX / fixture).read_text())
    assert nodes
    for n in nodes.values():
        assert n.out_of_service == owner.out_of_service(n.sinfo_state, ())
        assert Node.from_dict(n.to_dict()) == n


def test_but_changes_a_copy():
    n = node("IDLE", "x")
    m = n.but(flags=n.flags | {"DRAIN"}, reason="gpufleet: y")
    assert (n.flags, n.reason) == (frozenset(), "x") and m.drained and m.drained_by(PREFIX)
