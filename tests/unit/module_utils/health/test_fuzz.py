"""Hypothesis: the kmsg parser, the XML and text readers and judge() never crash on arbitrary input."""
from __future__ import annotations

import pytest
from health_fixtures import load
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ansible_collections.gpufleet.reliability.plugins.module_utils.health import (
    Report,
    Snapshot,
    judge,
    parse_kmsg,
    read_nvidia_smi_text,
    read_nvidia_smi_xml,
)

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
BIG = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

FRAGMENTS = ["NVRM: Xid (PCI:", "0000:19:00", ".0", " GPU-I:", " GPU-CI:", "): ", "79", "154", "149", ", pid=",
             "'<unknown>'", ", name=", "<unknown>", "Fatal", "Nonfatal", "nvidia-nvswitch0: SXid (PCI:", "24007",
             ", Fatal, ", "NVRM: The NVIDIA GPU ", "fallen off the bus", "NVRM: GPU at PCI:", "GPU-1234-5678",
             "[", "]", "1843.308145", "2024-13-45T99:99:99,1+99:99", "[Sun Feb 31 25:61:61 2025] ",
             "kern  :warn  : ", "6,123,456,-;", "RST: Yes, D-RST: Yes", "recovery action changed from 0x0 to 0x",
             "GPC 1, TPC 2", "\n", " ", "\x00", "\ufffd"]

kmsg_text = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=20)), max_size=40).map("".join)


@SETTINGS
@given(kmsg_text)
def test_parse_kmsg_never_raises(text):
    for ev in parse_kmsg(text):
        assert ev.kind in ("xid", "sxid", "fallen_off_bus", "gpu_uuid", "rate_limit")
    parse_kmsg(text.encode("utf-8", "surrogatepass"))
    parse_kmsg(text.splitlines())


@SETTINGS
@given(kmsg_text, st.floats(allow_nan=False, allow_infinity=False, min_value=-1e12, max_value=1e12))
def test_judge_on_arbitrary_kmsg(text, now):
    r = judge(None, text, now=now)
    assert isinstance(r, Report)
    d = r.to_dict()
    assert d["verdict"] in ("healthy", "degraded", "unhealthy", "unknown")


XML_BASE = load("h100-8gpu-580.105.08-healthy.nvidia-smi-q-x.xml")
XML_TAGS = ["<nvidia_smi_log>", "</nvidia_smi_log>", "<gpu id=\"00000000:53:00.0\">", "</gpu>", "<pci>", "</pci>",
            "<replay_counter>", "</replay_counter>", "<remapped_rows>", "GPU is lost", "</remapped_rows>",
            "N/A", "<temperature><gpu_temp>", "</gpu_temp></temperature>", "99999999999999999999999 C", "-5 C",
            "<clocks_event_reasons><clocks_event_reason_hw_slowdown>Active</clocks_event_reason_hw_slowdown>"
            "</clocks_event_reasons>", "<gpu_recovery_action>", "0x", "</gpu_recovery_action>", "&amp;", "&bogus;",
            "<![CDATA[x]]>", "<!DOCTYPE x SYSTEM \"y\">", "<?xml version=\"1.0\"?>"]

xml_text = st.lists(st.one_of(st.sampled_from(XML_TAGS), st.text(max_size=12)), max_size=40).map("".join)


@SETTINGS
@given(xml_text)
def test_xml_reader_never_raises(text):
    s = read_nvidia_smi_xml(text)
    assert isinstance(s, Snapshot)
    judge(s, now=0)


@BIG
@given(st.integers(min_value=0, max_value=len(XML_BASE)), st.integers(min_value=0, max_value=200), st.text(max_size=30))
def test_xml_reader_on_mutated_capture(pos, cut, junk):
    s = read_nvidia_smi_xml(XML_BASE[:pos] + junk + XML_BASE[pos + cut:])
    assert isinstance(s, Snapshot)
    judge(s, now=0)


TEXT_BASE = load("h100-8gpu-535.161.08-all-gpus-hw-power-brake-slowdown.nvidia-smi-q.txt")


@BIG
@given(st.integers(min_value=0, max_value=len(TEXT_BASE)), st.integers(min_value=0, max_value=300),
       st.text(max_size=40))
def test_text_reader_on_mutated_capture(pos, cut, junk):
    s = read_nvidia_smi_text(TEXT_BASE[:pos] + junk + TEXT_BASE[pos + cut:])
    assert isinstance(s, Snapshot)
    judge(s, now=0)


@SETTINGS
@given(st.text(max_size=400))
def test_text_reader_on_arbitrary_text(text):
    assert isinstance(read_nvidia_smi_text(text), Snapshot)


# Synthetic snapshots (what the simulator and the fake backends produce): any mix of values and Nones judges.
_num = st.one_of(st.none(), st.integers(min_value=-10, max_value=10 ** 12),
                 st.floats(allow_nan=False, allow_infinity=False, min_value=-1e6, max_value=1e6))
_flag = st.one_of(st.none(), st.booleans())


@st.composite
def gpus(draw, index):
    from ansible_collections.gpufleet.reliability.plugins.module_utils.health import GpuSnapshot, NvLinkInfo
    g = GpuSnapshot(index=index, name=draw(st.sampled_from([None, "NVIDIA H100 80GB HBM3", "NVIDIA B200",
                                                            "NVIDIA GB200", "NVIDIA A100-SXM4-40GB", "x"])),
                    pci_bus_id=draw(st.sampled_from([None, f"00000000:{index + 16:02x}:00.0", "garbage"])),
                    lost=draw(st.booleans()))
    for attr in ("ecc_volatile_sbe", "ecc_volatile_dbe", "ecc_aggregate_sbe", "remapped_rows_uncorrectable",
                 "retired_pages_sbe", "retired_pages_dbe", "temperature", "temp_slowdown", "temp_shutdown",
                 "temp_tlimit", "power_draw", "power_limit", "power_default_limit", "utilization_gpu",
                 "pcie_gen_current", "pcie_gen_max", "pcie_width_current", "pcie_width_max", "pcie_replay_counter",
                 "recovery_action"):
        v = draw(_num)
        setattr(g, attr, int(v) if v is not None and attr.startswith(("pcie", "recovery", "ecc", "retired",
                                                                      "remapped")) else v)
    for attr in ("remapped_rows_pending", "remapped_rows_failure", "sram_threshold_exceeded", "ecc_enabled",
                 "persistence_mode", "reset_required", "retired_pages_pending"):
        setattr(g, attr, draw(_flag))
    g.clocks_event_reasons = draw(st.one_of(st.none(), st.lists(st.sampled_from(
        ["gpu_idle", "hw_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown"]))))
    g.clocks_event_counters_us = draw(st.dictionaries(st.sampled_from(["hw_thermal_slowdown", "sw_power_cap"]),
                                                      st.integers(min_value=0, max_value=10 ** 15)))
    g.fabric_state = draw(st.sampled_from([None, "Completed", "In Progress", "Not Started", "?"]))
    g.nvlinks = draw(st.one_of(st.none(), st.lists(st.builds(NvLinkInfo, st.integers(0, 17), _flag,
                                                             st.one_of(st.none(), st.integers(0, 10 ** 6))),
                                                   max_size=4)))
    return g


SNAPSHOTS = (st.integers(min_value=0, max_value=3).flatmap(lambda n: st.tuples(*[gpus(i) for i in range(n)])),
             st.sampled_from(["ok", "partial", "timeout", "failed"]), st.one_of(st.none(), st.integers(0, 9)),
             st.floats(min_value=0, max_value=1e6))


def _judge_synthetic(gs, status, expected, dt):
    snap = Snapshot(gpus=list(gs), probe_status=status)
    r1 = judge(snap, [], config={"expected_gpus": expected}, now=1000.0)
    r2 = judge(snap, [], config={"expected_gpus": expected}, state=r1.state, now=1000.0 + dt)
    for r in (r1, r2):
        d = r.to_dict()
        assert d["verdict"] in ("healthy", "degraded", "unhealthy", "unknown")
        if status == "timeout":
            assert d["verdict"] in ("unknown", "unhealthy")


# Drawing a snapshot is Hypothesis' work, not judge()'s (~15 ms each, so 300 take 5 s): the 300 run in `make test`
# (`slow`), and the edit loop (`make check`) draws 30 fresh ones per run for the same property.
@pytest.mark.slow
@SETTINGS
@given(*SNAPSHOTS)
def test_judge_on_synthetic_snapshots(gs, status, expected, dt):
    _judge_synthetic(gs, status, expected, dt)


@settings(SETTINGS, max_examples=30)
@given(*SNAPSHOTS)
def test_judge_on_synthetic_snapshots_smoke(gs, status, expected, dt):
    _judge_synthetic(gs, status, expected, dt)
