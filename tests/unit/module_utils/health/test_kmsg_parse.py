"""The kernel-log parser: every Xid / SXid line shape, fallen-off-bus without an Xid, prefixes, bursts."""
from __future__ import annotations

import calendar

import pytest
from health_fixtures import load

from ansible_collections.gpufleet.reliability.plugins.module_utils.health import group_bursts, parse_kmsg

# (line, pci, xid, pid, name, gi, ci)
VARIANTS = [
    ("Nov 22 18:29:55 hostname kernel: [ 966.503025] NVRM: Xid (0000:01:00): 31, Ch 0000000b, engmask 00000120, "
     "intr 10000000", "0000:01:00", 31, None, None, None, None),
    ("[...] NVRM: Xid (0000:03:00): 14, Channel 00000001", "0000:03:00", 14, None, None, None, None),
    ("[2397166.983093] NVRM: Xid (PCI:0000:0f:00): 94, pid=2503421, name=python3, Ch 00000008", "0000:0f:00", 94,
     "2503421", "python3", None, None),
    ("NVRM: Xid (PCI:0000:b3:00.0): 79, GPU has fallen off the bus and is not responding to commands.", "0000:b3:00",
     79, None, None, None, None),
    ("[111111111.111] NVRM: Xid (PCI:0000:05:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
     "0000:05:00", 79, None, None, None, None),
    ("NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). RST: No, D-RST: No",
     "0000:01:00", 94, "7194", None, 5, None),
    ("NVRM: Xid (PCI:0000:01:00 GPU-I:02 GPU-CI:01): 13, pid=12, name=a.out, Graphics Exception", "0000:01:00", 13,
     "12", "a.out", 2, 1),
    ("[449410.332316] NVRM: Xid (PCI:0003:00:00): 74, pid='<unknown>', name=<unknown>, NVLink: fatal error detected "
     "on link 14(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)", "0003:00:00", 74, None, None, None, None),
    ("kern  :warn  : 2025-01-21T02:21:33,502278+00:00 NVRM: Xid (PCI:0000:38:00): 43, pid=2815167, "
     "name=pt_main_thread, Ch 00000008", "0000:38:00", 43, "2815167", "pt_main_thread", None, None),
    ("NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu to activate.",
     "0000:10:1c", 63, "1896", None, None, None),
    ("6,1234,5678901,-;NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi, Timeout after 6s",
     "0000:9b:00", 119, "2024380", "nvidia-smi", None, None),
]


@pytest.mark.parametrize("line,pci,xid,pid,name,gi,ci", VARIANTS)
def test_xid_shapes(line, pci, xid, pid, name, gi, ci):
    evs = parse_kmsg([line])
    assert len(evs) == 1
    e = evs[0]
    assert (e.kind, e.pci, e.xid, e.pid, e.name, e.gpu_instance, e.compute_instance) == (
        "xid", pci, xid, pid, name, gi, ci)


def test_every_xid_line_in_the_fixtures_parses():
    import os

    from health_fixtures import GPU_FIXTURES
    total = 0
    for f in sorted(os.listdir(GPU_FIXTURES)):
        if not (f.endswith(".log")):
            continue
        text = load(f)
        lines = [ln for ln in text.splitlines() if "NVRM: Xid" in ln]
        evs = [e for e in parse_kmsg(text) if e.kind == "xid"]
        assert len(evs) == len(lines), f
        total += len(lines)
    assert total >= 680  # research: 684 "NVRM: Xid" lines over all files (header lines excluded here)


def test_line_format_variants_fixture():
    evs = [e for e in parse_kmsg(load("kmsg-xid-line-format-variants.log")) if e.kind == "xid"]
    got = {(e.pci, e.xid) for e in evs}
    assert {("0000:01:00", 31), ("0000:03:00", 14), ("0000:0f:00", 94), ("0000:0f:00", 64), ("0003:00:00", 74),
            ("0000:66:00", 32), ("0000:b5:00", 13), ("0000:b3:00", 79), ("0000:05:00", 79), ("0000:38:00", 43),
            ("0000:19:00", 94), ("0000:9b:00", 119), ("0000:10:1c", 63), ("0000:01:00", 95)} <= got
    uuid = [e for e in parse_kmsg(load("kmsg-xid-line-format-variants.log")) if e.kind == "gpu_uuid"]
    assert uuid[0].pci == "0000:66:00" and uuid[0].uuid.startswith("GPU-12345678")


def test_fallen_off_bus_without_xid():
    evs = parse_kmsg(load("kmsg-fallen-off-bus-without-xid.log"))
    fob = [e for e in evs if e.kind == "fallen_off_bus"]
    assert [e.pci for e in fob] == ["0000:b3:00", "0000:18:00", "0000:18:00"]
    assert all(e.xid == 79 for e in fob)
    assert fob[0].monotonic == pytest.approx(1843.308145)
    # the probe-failed and module-load lines are not events
    assert len([e for e in evs if e.kind == "xid"]) == 1


def test_sxid_shapes():
    evs = parse_kmsg(load("kmsg-nvswitch-sxid-samples.log"))
    assert all(e.kind == "sxid" for e in evs) and len(evs) == 9
    first = evs[0]
    assert (first.switch, first.pci, first.xid, first.severity) == (0, "0000:c3:00", 24007, "Fatal")
    assert evs[1].severity == "Non-fatal" and evs[3].severity.startswith("Severity")
    assert evs[4].xid == 26006 and evs[4].pci == "0004:00:00" and evs[4].severity is None


def test_nvlink5_severity_and_recovery_action():
    from ansible_collections.gpufleet.reliability.plugins.module_utils.health.kmsg_parse import recovery_action_of
    evs = parse_kmsg(load("kmsg-gb200-nvlink5-xid149-145-154.log"))
    assert {e.severity for e in evs if e.xid == 149} == {"Fatal"}
    assert {e.severity for e in evs if e.xid == 145} == {"Nonfatal"}
    assert [recovery_action_of(e) for e in evs if e.xid == 154] == [4, 1, 1, 1, 1]


def test_timestamps():
    iso = parse_kmsg(["2024-11-15T12:02:03,470068+00:00 NVRM: Xid (PCI:0000:19:00): 48, pid='<unknown>', "
                      "name=<unknown>, An uncorrectable double bit error"])[0]
    assert iso.wallclock == pytest.approx(calendar.timegm((2024, 11, 15, 12, 2, 3)) + 0.470068)
    ct = parse_kmsg(["[Sun Feb 23 16:24:18 2025] NVRM: Xid (PCI:0000:9b:00): 119, pid=1, name=x, Timeout"])[0]
    assert ct.wallclock == calendar.timegm((2025, 2, 23, 16, 24, 18))
    tz = parse_kmsg(["2024-11-15T14:02:03+02:00 NVRM: Xid (PCI:0000:19:00): 48, DBE"])[0]
    assert tz.wallclock == calendar.timegm((2024, 11, 15, 12, 2, 3))
    raw = parse_kmsg(["4,99,12500000,-;NVRM: Xid (PCI:0000:19:00): 79, GPU has fallen off the bus."],
                     boot_id="b1", boot_time=1000.0)[0]
    assert (raw.seq, raw.monotonic, raw.wallclock, raw.boot_id) == (99, 12.5, 1012.5, "b1")
    assert raw.ident == "b1:99"


def test_noise_is_ignored():
    text = load("dmesg-iso-xid48-63-94-dbe-rowremap-contained.log")
    evs = parse_kmsg(text)
    assert len(evs) == 11 and all("peermem" not in e.raw for e in evs)
    assert parse_kmsg("") == [] and parse_kmsg(None) == [] and parse_kmsg(b"\xff\xfe garbage") == []


def test_bursts():
    evs = [e for e in parse_kmsg(load("dmesg-iso-xid13-43-app-fault-storm.log")) if e.xid == 13]
    bursts = group_bursts(evs, 180)
    # the README's storm: 9 episodes, each more than 3 min after the previous one
    assert [len(b) for b in bursts] == [15, 9, 90, 134, 21, 60, 60, 181, 59]
    assert sum(len(b) for b in bursts) == len(evs)
    one = group_bursts(evs, 10 ** 6)
    assert len(one) == 1


def test_unicode_digits_are_not_digits():
    """An attacker's line with Arabic-Indic (or full-width) digits is no Xid, SXid or timestamp: int() would read
    "\u0667\u0669" as 79 (GPU lost). The same line with ASCII digits is the control."""
    good = "[ 966.503025] NVRM: Xid (PCI:0000:b3:00): 79, pid=12, name=x, GPU has fallen off the bus"
    assert [(e.kind, e.xid) for e in parse_kmsg([good])] == [("xid", 79)]
    for digits in ("\u0667\u0669", "\uff17\uff19", "\u0967\u096f"):
        forged = good.replace(": 79,", f": {digits},")
        assert [e for e in parse_kmsg([forged]) if e.kind == "xid"] == [], digits
    sxid = "nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 46 egress non-posted PRIV error"
    assert [e.kind for e in parse_kmsg([sxid])] == ["sxid"]
    assert [e for e in parse_kmsg([sxid.replace("12028", "\u0661\u0662\u0660\u0662\u0668")]) if e.kind == "sxid"] \
        == []
