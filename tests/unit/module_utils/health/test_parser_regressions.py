"""Regressions found by the fuzz campaign (tests/fuzz): kmsg parser, nvidia-smi text reader, snapshot JSON.

Each input is the minimal one the campaign found; each test fails on the code before its fix.
"""
from __future__ import annotations

import json

import pytest

from ansible_collections.gpufleet.reliability.plugins.module_utils.health import (
    Snapshot,
    parse_kmsg,
    read_nvidia_smi_text,
)
from ansible_collections.gpufleet.reliability.plugins.module_utils.health.kmsg_parse import gpc_tpc_of
from support.timing import deadline


def test_kmsg_record_separator_does_not_forge_a_second_record():
    # fuzz finding: str.splitlines() also splits at \x1c, \x85 and U+2028, so text inside one record (here a
    # process name in an Xid 13 line) became a second record: a forged Xid 79 (GPU fallen off the bus)
    for sep in ("\x1c", "\x85", "\u2028", "\x0b"):
        text = ("NVRM: Xid (PCI:0000:38:00): 13, pid=4242, name=evil" + sep
                + "NVRM: Xid (PCI:0000:38:00): 79, pid=1, name=x, GPU has fallen off the bus.\n")
        events = parse_kmsg(text)
        assert [e.xid for e in events] == [13], (repr(sep), [e.xid for e in events])
        assert [e.xid for e in parse_kmsg(text.encode())] == [13]


def test_kmsg_minimal_fuzz_input_is_one_record():
    text = "NVRM: Xid (PCI:0000:38:00): 3\x1cNVRM: Xid (PCI:0000:38:00): 3"
    assert len(parse_kmsg(text)) == len(parse_kmsg(text.encode().split(b"\n"))) == 1


def test_kmsg_crlf_still_splits():
    text = "NVRM: Xid (PCI:0000:38:00): 13, pid=1, name=a\r\nNVRM: Xid (PCI:0000:38:00): 31, pid=1, name=b\r\n"
    assert [e.xid for e in parse_kmsg(text)] == [13, 31]


def test_smi_text_long_line_without_colon_is_linear():
    # fuzz finding: the key regex (lazy key, then \s*, then $) backtracked quadratically on a long line
    # without ':' (a 32 KiB line took 4 s; this one took minutes)
    text = ("GPU 00000000:19:00.0\n    Product Name                    : NVIDIA H100 80GB HBM3\n"
            "    x" + " " * 300000 + "y\n")
    with deadline(30):
        snap = read_nvidia_smi_text(text)
    assert len(snap.gpus) == 1
    assert snap.gpus[0].name == "NVIDIA H100 80GB HBM3"


def test_smi_text_key_value_split_unchanged():
    text = ("GPU 00000000:19:00.0\n    Product Name                    : NVIDIA H100 80GB HBM3\n"
            "    Serial Number   :   1650000000000  \n    Temperature\n        GPU Current Temp  : 35 C\n")
    g = read_nvidia_smi_text(text).gpus[0]
    assert (g.name, g.temperature) == ("NVIDIA H100 80GB HBM3", 35)
    assert g.serial and g.serial.strip() == "1650000000000"


def test_gpc_tpc_of_a_huge_number_is_none():
    # fuzz finding: int() of a 7666-digit TPC number raised ValueError (Python's 4300-digit limit)
    (ev,) = parse_kmsg("NVRM: Xid (PCI:0000:38:00): 13, GPC 5, TPC " + "3" * 7666)
    assert gpc_tpc_of(ev) is None
    (ev,) = parse_kmsg("NVRM: Xid (PCI:0000:38:00): 13, Graphics SM Warp Exception on (GPC 5, TPC 3, SM 0)")
    assert gpc_tpc_of(ev) == (5, 3)


# ------------------------------------------------------------------ snapshot JSON (--snapshot-json, --record)
@pytest.mark.parametrize("gpu, field", [
    ({"index": 0, "probe_errors": 5}, r"gpus\[0\]\.probe_errors"),          # was AttributeError in judge()
    ({"index": 0, "clocks_event_reasons": 5}, r"gpus\[0\]\.clocks_event_reasons"),
    ({"index": 0, "clocks_event_counters_us": [1]}, r"gpus\[0\]\.clocks_event_counters_us"),
    ({"index": 0, "nvlinks": [5]}, r"gpus\[0\]\.nvlinks\[0\]"),
    ({"index": 0, "nvlinks": [{"link": 0, "bogus": 1}]}, r"nvlinks\[0\]: unknown field"),  # was TypeError
    ({"index": True}, r"gpus\[0\]\.index"),
    ({"index": 0, "temperature": float("inf")}, r"gpus\[0\]\.temperature"),
    ({"index": 0, "lost": "no"}, r"gpus\[0\]\.lost"),
])
def test_snapshot_json_with_wrong_types_names_the_field(gpu, field):
    with pytest.raises(ValueError, match=field):
        Snapshot.from_dict({"gpus": [gpu]})


def test_snapshot_json_round_trips():
    from health_fixtures import load

    from ansible_collections.gpufleet.reliability.plugins.module_utils.health import read_nvidia_smi_xml
    snap = read_nvidia_smi_xml(load("gb200-2gpu-580.65.06-gpu1-lost.MOCK.nvidia-smi-q-x.xml"))
    data = json.loads(json.dumps(snap.to_dict()))
    assert Snapshot.from_dict(data).to_dict() == snap.to_dict()
    assert Snapshot.from_dict({"gpus": [{"index": 0, "temperature": 35}]}).gpus[0].temperature == 35


@pytest.mark.parametrize("name, text", [
    ("deep.json", "[" * 100000 + "]" * 100000),              # was RecursionError (a traceback, not exit 64)
    ("deep.yaml", "a: " + "[" * 100000),
])
def test_snapshot_file_nested_too_deeply_is_a_usage_error(tmp_path, name, text):
    from ansible_collections.gpufleet.reliability.plugins.module_utils.cli import health_agent as agent
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    with pytest.raises(agent.UsageError, match="--snapshot-json"):
        agent._load_mapping(str(path), "--snapshot-json")
