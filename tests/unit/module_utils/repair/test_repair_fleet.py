"""repair/fleet.py: one pass over Slurm's nodes -> counts per partition and domain, spares, attention records."""

from __future__ import annotations

from repair_builders import NOW, hist

from ansible_collections.gpufleet.reliability.plugins.module_utils.repair.fleet import build_inputs, domains_of
from ansible_collections.gpufleet.reliability.plugins.module_utils.slurm import Node

SICK = {"verdict": "unhealthy", "action": "reboot", "code": "xid79", "gpu": 1, "findings": []}
OK = {"verdict": "healthy", "action": "none", "code": "ok", "gpu": None, "findings": []}


def nodes():
    return [
        Node("n1", state="idle", partitions=["gpu"], features=["rack_r1", "switch=s1"]),
        Node("n2", state="idle", flags=frozenset({"DRAIN"}), reason="gpufleet: xid79 gpu1", reason_time=NOW - 60,
             partitions=["gpu"], features=["rack_r1"]),
        Node("n3", state="mixed", partitions=["gpu", "debug"], features=["rack_r2"]),
        Node("n4", state="down", reason="Not responding", partitions=["gpu"], features=["rack_r2"]),
        Node("n5", state="idle", partitions=["gpu"], extra=hist(t0=NOW - 10)),
        Node("sp1", state="idle", flags=frozenset({"DRAIN"}), reason="gpufleet: spare", partitions=["gpu"]),
        Node("sp2", state="allocated", flags=frozenset({"DRAIN"}), reason="gpufleet: spare", partitions=["gpu"]),
        Node("cpu1", state="idle", partitions=["cpu"]),
    ]


def test_counts_spares_and_attention():
    summary, attention, spares = build_inputs(nodes(), {"n3": SICK, "n1": OK}, {"n3": NOW - 5}, partitions=["gpu"])
    assert summary.partitions["gpu"].spares == ["sp1"] and summary.domain("rack", "r1").available == 1
    fleet = summary.to_dict()
    assert fleet["total"] == 5
    assert fleet["partitions"]["gpu"] == {"total": 5, "available": 3, "unavailable": 2, "spares_idle": ["sp1"]}
    assert "cpu" not in fleet["partitions"]
    assert fleet["domains"]["rack"]["r1"] == {"total": 2, "available": 1, "unavailable": 1}
    assert fleet["domains"]["switch"]["s1"]["total"] == 1
    assert spares == ["sp1", "sp2"]
    by = {a["name"]: a for a in attention}
    assert sorted(by) == ["n2", "n3", "n4", "n5"]  # drained, sick report, down, open incident in its history
    assert by["n3"]["report"] == SICK and by["n3"]["report_time"] == NOW - 5 and by["n3"]["partitions"] == ["gpu"]
    assert by["n2"]["flags"] == ["DRAIN"] and by["n2"]["state"] == "IDLE" and by["n2"]["domains"] == {"rack": "r1"}


def test_all_partitions_and_comment_field():
    fleet, attention, _s = build_inputs(nodes(), history_field="comment")
    assert set(fleet.partitions) == {"gpu", "debug", "cpu"}
    assert "n5" not in {a["name"] for a in attention}  # its history is in extra, not comment


def test_domains_of():
    assert domains_of(["rack_r12", "switch=leaf3", "gpu"], {"rack": "rack", "switch": "switch"}) == {
        "rack": "r12", "switch": "leaf3"}
    assert domains_of(["rack_"], {"rack": "rack"}) == {}


def test_leftover_reason_on_an_idle_node_counts_for_nothing():
    # Slurm 24.11 keeps the last reason after RESUME: a resumed spare or repaired node still shows it
    leftovers = [
        Node("n1", state="idle", reason="gpufleet: spare", reason_time=NOW - 600, partitions=["gpu"]),
        Node("n2", state="idle", reason="gpufleet: xid79 gpu1", reason_time=NOW - 600, partitions=["gpu"]),
        Node("n3", state="idle", reason="maintenance: dimm swap", partitions=["gpu"]),
    ]
    fleet, attention, spares = build_inputs(leftovers, {"n1": OK, "n2": OK})
    assert spares == [] and attention == []
    assert fleet.to_dict()["partitions"]["gpu"] == {"total": 3, "available": 3, "unavailable": 0, "spares_idle": []}
