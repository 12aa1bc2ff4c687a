"""Hypothesis: the kmsg parser, the XML and text readers and judge() never crash on arbitrary input."""
from __future__ import annotations

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
