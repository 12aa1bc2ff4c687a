# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The adapter's translation of Slurm nodes into the repair policy's typed inputs (slurm/repair_inputs.py): the
same NodeState / FleetSummary the brain makes from its dict records, the history read once at this edge, and
hostile field text kept as foreign or as an error, never parsed into a history."""
from __future__ import annotations

from pathlib import Path

import pytest

from ansible_collections.gpufleet.reliability.plugins.module_utils.repair import History
from ansible_collections.gpufleet.reliability.plugins.module_utils.repair.fleet import build_inputs
from ansible_collections.gpufleet.reliability.plugins.module_utils.repair.state import FleetSummary, NodeState
from ansible_collections.gpufleet.reliability.plugins.module_utils.slurm import Node, parse_nodes_json, split_state
from ansible_collections.gpufleet.reliability.plugins.module_utils.slurm.repair_inputs import (
    node_state,
    repair_inputs,
)

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "slurm"
OURS = '{"gf":1,"i":{"c":"gm","g":3,"id":1,"k":"xid48","s":[["g",1796232119,null]],"t":1796232014},"n":1}'


def node(name, state, reason="", extra="", partitions=("gpu",), features=(), reason_time=None, boot_time=None):
    base, flags = split_state(state)
    return Node(name, base, flags, reason, reason_time=reason_time, partitions=list(partitions),
                features=list(features), extra=extra, boot_time=boot_time)


FLEET = [
    node("n1", "IDLE+DRAIN", "gpufleet: xid48 gpu3", OURS, features=("rack_r1",), reason_time=1796232014,
         boot_time=1796200000),
    node("n2", "IDLE+DRAIN", "ops: psu", "rack 12 slot 3", features=("rack=r1",)),        # someone else's text
    node("n3", "MIXED", "", '{"gf":1,"i":', features=("rack_r2",)),                         # ours, truncated
    node("n4", "IDLE", "gpufleet: kept by 24.11 after a resume"),                           # healthy, in service
    node("s1", "IDLE+DRAIN", "gpufleet: spare"),                                            # hot spare
    node("n5", "ALLOCATED"),
]
REPORTS = {"n4": {"verdict": "healthy"}, "n5": {"verdict": "unhealthy", "action": "reboot"}}
TIMES = {"n5": 1796232100.0}


def test_typed_inputs_equal_the_brains_reading_of_its_own_records():
    got = repair_inputs(FLEET, REPORTS, TIMES, report_errors={"n3": "n3.json: truncated"})
    counts, attention, spares = build_inputs(FLEET, REPORTS, TIMES, report_errors={"n3": "n3.json: truncated"})
    assert got.nodes == [NodeState.from_dict(rec, i) for i, rec in enumerate(attention)]
    assert got.fleet == counts and got.counts == counts.to_dict()
    assert FleetSummary.from_dict(got.counts).to_dict() == got.counts  # the JSON edge reads back what it wrote
    assert got.spares == spares == ["s1"]
    assert [s.name for s in got.nodes] == ["n1", "n2", "n3", "n5"]


def test_history_is_read_once_at_the_edge_and_hostile_text_is_never_a_history():
    by = {s.name: s for s in repair_inputs(FLEET, REPORTS, TIMES, report_errors={"n3": "n3.json: truncated"}).nodes}
    assert isinstance(by["n1"].history, History) and by["n1"].history_text() is not None
    assert by["n1"].drained_by("gpufleet:") and by["n1"].domains == {"rack": "r1"}
    assert by["n2"].history is None and by["n2"].history_foreign and by["n2"].foreign("gpufleet:")
    assert by["n3"].history is None and not by["n3"].history_foreign and by["n3"].history_error
    assert by["n3"].report_error == "n3.json: truncated"
    assert by["n5"].busy and by["n5"].report == REPORTS["n5"] and by["n5"].report_time == TIMES["n5"]


@pytest.mark.parametrize("fixture", ["sinfo-json-22.05.json", "sinfo-json-24.11.json",
                                     "scontrol-show-node-json-24.11.json"])
def test_captured_nodes_translate_like_the_dict_path(fixture):
    nodes = list(parse_nodes_json((FIX / fixture).read_text()).values())
    reports = {n.name: {"verdict": "unhealthy", "action": "reset_gpu"} for n in nodes}
    got = repair_inputs(nodes, reports, history_field="comment")
    _counts, attention, _spares = build_inputs(nodes, reports, history_field="comment")
    assert got.nodes and got.nodes == [NodeState.from_dict(rec, i) for i, rec in enumerate(attention)]


def test_history_field_is_checked():
    with pytest.raises(ValueError, match="history_field must be extra or comment"):
        node_state(FLEET[0], history_field="reason")
