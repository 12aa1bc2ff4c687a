"""health/metrics.py: the textfile the agent writes, checked by the real `promtool check metrics`; every metric is
listed in docs/health.md; values only from the snapshot; hostile strings cannot break the exposition; counters
kept in the state survive runs and a replayed log is not counted twice."""
from __future__ import annotations

import math
import re
import subprocess
from pathlib import Path

import pytest
from health_fixtures import GPU_FIXTURES, load

from ansible_collections.gpufleet.reliability.plugins.module_utils.health import GpuSnapshot, Snapshot, judge, metrics
from ansible_collections.gpufleet.reliability.plugins.module_utils.health.model import NvLinkInfo
from ansible_collections.gpufleet.reliability.plugins.module_utils.health.smi import (
    read_nvidia_smi_text,
    read_nvidia_smi_xml,
)
from ansible_collections.gpufleet.reliability.plugins.module_utils.repair import metrics as repair_metrics

DOCS = Path(__file__).resolve().parents[4] / "docs" / "health.md"
SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(,|$)')


def promtool(text: str) -> subprocess.CompletedProcess:
    return subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, check=False)


def parse(text: str):
    """[(name, {label: value}, float)] — a strict reader of the exposition lines we write."""
    out = []
    assert text.endswith("\n")
    for line in text[:-1].split("\n"):  # the exposition format splits on \n only
        if line.startswith("#"):
            assert re.match(r"^# (HELP|TYPE) [a-z_]+ \S", line), line
            continue
        m = SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        labels = {}
        rest = m.group(3) or ""
        while rest:
            lm = LABEL.match(rest)
            assert lm, f"bad labels in {line!r}"
            labels[lm.group(1)] = re.sub(r"\\(.)", lambda e: {"n": "\n"}.get(e.group(1), e.group(1)), lm.group(2))
            rest = rest[lm.end():]
        out.append((m.group(1), labels, float(m.group(4))))
    return out


def values(text, name, **match):
    return [v for n, lab, v in parse(text) if n == name and all(lab.get(k) == str(x) for k, x in match.items())]


def snapshots():
    yield "xml-h100", read_nvidia_smi_xml(load("h100-8gpu-580.105.08-healthy.nvidia-smi-q-x.xml"))
    yield "xml-gb200-lost", read_nvidia_smi_xml(load("gb200-2gpu-580.65.06-gpu1-lost.MOCK.nvidia-smi-q-x.xml"))
    yield "text-brake", read_nvidia_smi_text(load("h100-8gpu-535.161.08-all-gpus-hw-power-brake-slowdown"
                                                  ".nvidia-smi-q.txt"))
    yield "probe-failed", Snapshot(source="nvml", probe_status="failed", probe_error="Driver Not Loaded")
    g = GpuSnapshot(index=0, uuid="GPU-1", name="NVIDIA H100", pci_bus_id="00000000:19:00.0",
                    nvlinks=[NvLinkInfo(0, True, 1, 0, 2, 3), NvLinkInfo(1, False, None, None, None, None)],
                    remapped_rows_correctable=1, remapped_rows_uncorrectable=2, remapped_rows_pending=True,
                    retired_pages_sbe=3, retired_pages_dbe=0, clocks_event_reasons=["hw_slowdown"],
                    clocks_event_counters_us={"hw_slowdown": 2_500_000})
    yield "synthetic", Snapshot(gpus=[g], source="nvml", driver_version="580.105.08", attached_gpus=1,
                                probe_durations_ms={"total": 250.0})


KMSG = ("[ 5.0] NVRM: Xid (PCI:0000:19:00): 79, pid=1, GPU has fallen off the bus.\n"
        "[ 6.0] NVRM: Xid (PCI:0000:19:00): 63, pid=1, Row Remapper: New row marked for remapping, reset gpu to "
        "activate.\n")


def render(snap, kmsg="", counters=None, slurm=None):
    report = judge(snap, kmsg, now=1_800_000_000.0)
    return metrics.prometheus_text(report, snap, 0.5, "gpu1", slurm, counters)


@pytest.mark.parametrize("name,snap", list(snapshots()), ids=[n for n, _s in snapshots()])
def test_promtool_accepts_every_snapshot(name, snap):
    counters = metrics.update_counters(None, snap, KMSG)
    text = render(snap, KMSG, counters, {"action": "already_drained"})
    p = promtool(text)
    assert p.returncode == 0, name + ": " + p.stdout + p.stderr
    parse(text)


def test_every_metric_is_documented():
    names = set()
    for _name, snap in snapshots():
        text = render(snap, KMSG, metrics.update_counters(None, snap, KMSG), {"action": "drained"})
        names |= set(re.findall(r"^# TYPE (\S+)", text, re.M))
    doc = DOCS.read_text()
    section = doc[doc.index("## Metrics"):]
    missing = sorted(n for n in names if f"`{n}`" not in section)
    assert not missing, f"not in the metrics section of docs/health.md: {missing}"
    assert len(names) >= 35


def test_info_metric_joins_gpu_to_uuid_model_driver():
    snap = dict(snapshots())["synthetic"]
    text = render(snap)
    (info,) = [lab for n, lab, _v in parse(text) if n == "gpufleet_gpu_info"]
    assert info == {"node": "gpu1", "gpu": "0", "pci_bus_id": "0000:19:00", "uuid": "GPU-1",
                    "model_name": "NVIDIA H100", "serial": "", "vbios_version": "", "driver_version": "580.105.08"}
    h100 = render(dict(snapshots())["xml-h100"])
    uuids = {lab["uuid"] for n, lab, _v in parse(h100) if n == "gpufleet_gpu_info"}
    assert len(uuids) == 8 and all(u.startswith("GPU-") for u in uuids)


def test_values_come_from_the_snapshot_only():
    text = render(dict(snapshots())["synthetic"])
    assert values(text, "gpufleet_gpu_nvlink_errors_total", type="replay") == [1]
    assert values(text, "gpufleet_gpu_nvlink_errors_total", type="crc_data") == [3]
    assert values(text, "gpufleet_gpu_nvlink_links", state="down") == [1]
    assert values(text, "gpufleet_gpu_remapped_rows", kind="uncorrectable") == [2]
    assert values(text, "gpufleet_gpu_retired_pages", cause="sbe") == [3]
    assert values(text, "gpufleet_gpu_clocks_event_reason", reason="hw_slowdown") == [1]
    assert values(text, "gpufleet_gpu_clocks_event_reason", reason="sw_power_cap") == [0]
    assert values(text, "gpufleet_gpu_clocks_event_duration_seconds_total", reason="hw_slowdown") == [2.5]
    assert values(text, "gpufleet_health_probe_duration_seconds") == [0.25]
    # fields the source could not read give no sample, not a zero
    for absent in ("gpufleet_gpu_temperature_celsius", "gpufleet_gpu_power_draw_watts",
                   "gpufleet_gpu_ecc_volatile_uncorrected_errors"):
        assert absent not in text
    failed = render(dict(snapshots())["probe-failed"])
    assert "gpufleet_gpu_" not in failed and values(failed, "gpufleet_health_probe_ok") == [0]
    assert "gpufleet_health_probe_duration_seconds" not in failed


@pytest.mark.parametrize("action,drained,ours,held", [("drained", 1, 1, 0), ("already_drained", 0, 1, 0),
                                                      ("defer", 0, 0, 1), ("left_alone", 0, 0, 0), ("none", 0, 0, 0)])
def test_slurm_gauges(action, drained, ours, held):
    text = render(dict(snapshots())["synthetic"], KMSG, None, {"action": action})
    assert values(text, "gpufleet_health_drained") == [drained]
    assert values(text, "gpufleet_health_slurm_drained") == [ours]
    assert values(text, "gpufleet_health_drain_held") == [held]
    assert "gpufleet_health_drain_held" not in render(dict(snapshots())["synthetic"], KMSG)  # without --slurm


def test_verdict_and_action_gauges():
    snap = dict(snapshots())["synthetic"]
    text = render(snap, KMSG)
    assert values(text, "gpufleet_health_verdict", verdict="unhealthy") == [1]
    assert values(text, "gpufleet_health_action", action="reboot") == [1]
    assert values(text, "gpufleet_health_action_rank") == [3]
    assert values(text, "gpufleet_health_exit_code") == [2]


@pytest.mark.parametrize("evil", ['GPU-"}\nfake_metric 1 #', "a\\", "\\n\"", "é\u2028x"])
def test_hostile_strings_stay_inside_their_label(evil):
    g = GpuSnapshot(index=0, uuid=evil, name=evil, serial=evil, vbios=evil, pci_bus_id="0000:19:00.0",
                    temperature=float("nan"), power_draw=float("inf"), ecc_volatile_dbe="7")
    snap = Snapshot(gpus=[g], source=evil, driver_version=evil)
    text = metrics.prometheus_text(judge(snap, (), now=1.0), snap, 0.1, evil)
    p = promtool(text)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = parse(text)
    assert {n for n, _l, _v in rows if n.startswith("fake")} == set()
    info = [lab for n, lab, _v in rows if n == "gpufleet_gpu_info"]
    assert info[0]["uuid"] == evil and info[0]["node"] == evil
    assert all(math.isfinite(v) for _n, _l, v in rows)
    assert "gpufleet_gpu_temperature_celsius" not in text and "gpufleet_gpu_power_draw_watts" not in text
    assert "gpufleet_gpu_ecc_volatile_uncorrected_errors" not in text  # a string is not a number


@pytest.mark.parametrize("field,value", [("probe_errors", 5), ("clocks_event_reasons", 5),
                                         ("clocks_event_counters_us", [1]), ("nvlinks", [5]), ("nvlinks", 5),
                                         ("clocks_event_reasons", [None, 3]), ("clocks_event_counters_us", {3: "x"})])
def test_wrong_types_in_a_snapshot_do_not_break_the_text(field, value):
    g = GpuSnapshot(index=0, uuid="GPU-1", temperature=40.0)
    setattr(g, field, value)
    snap = Snapshot(gpus=[g], source="nvml")
    text = metrics.prometheus_text(judge(Snapshot(source="nvml"), (), now=1.0), snap, 0.1, "gpu1")
    assert promtool(text).returncode == 0
    assert values(text, "gpufleet_gpu_temperature_celsius") == [40.0]


def test_xid_counter_counts_once_and_survives_runs():
    snap = dict(snapshots())["synthetic"]
    c1 = metrics.update_counters(None, snap, KMSG)
    c2 = metrics.update_counters(c1, snap, KMSG)  # the same captured log replayed: nothing new
    assert c2["xid"] == c1["xid"] == {"0000:19:00|79": 1, "0000:19:00|63": 1}
    assert c2["checks"] == 2
    more = KMSG + "[ 9.0] NVRM: Xid (PCI:0000:19:00): 79, pid=1, GPU has fallen off the bus.\n"
    c3 = metrics.update_counters(c2, snap, more)
    text = render(snap, more, c3)
    assert values(text, "gpufleet_gpu_xid_errors_total", xid=79, gpu=0) == [2]
    assert values(text, "gpufleet_gpu_xid_errors_total", xid=63, gpu=0) == [1]
    assert values(text, "gpufleet_gpu_xid_last", gpu=0) == [79]
    assert values(text, "gpufleet_health_checks_total") == [3]


def test_probe_failures_are_counted():
    failed = dict(snapshots())["probe-failed"]
    c = metrics.update_counters(None, failed, "")
    c = metrics.update_counters(c, failed, "")
    c = metrics.update_counters(c, dict(snapshots())["synthetic"], "")
    text = render(failed, "", c)
    assert values(text, "gpufleet_health_probe_failures_total", status="failed") == [2]
    assert values(text, "gpufleet_health_probe_failures_total", status="timeout") == [0]


@pytest.mark.parametrize("corrupt", [None, "x", [], {"checks": -3, "xid": {"a|1": "9", "b|2": True},
                                                     "xid_last": ["bad"], "seen": "nope", "probe_failures": 5},
                                     {"checks": True, "xid": {"0000:19:00|79": 10**30}}])
def test_corrupt_counter_state_restarts_cleanly(corrupt):
    snap = dict(snapshots())["synthetic"]
    c = metrics.update_counters(corrupt, snap, KMSG)
    assert c["checks"] == 1
    text = render(snap, KMSG, c)
    assert promtool(text).returncode == 0


def test_agent_writes_the_file_and_keeps_counters_in_the_state(tmp_path):
    from ansible_collections.gpufleet.reliability.plugins.module_utils.cli import health_agent as agent
    log = tmp_path / "k.log"
    log.write_text(KMSG)
    argv = ["check", "--nvidia-smi-xml", str(GPU_FIXTURES / "h100-8gpu-580.105.08-healthy.nvidia-smi-q-x.xml"),
            "--kmsg", str(log), "--textfile", str(tmp_path / "tf"), "--state-file", str(tmp_path / "state.json")]
    agent.main(argv)
    agent.main(argv)
    text = (tmp_path / "tf" / metrics.PROM_FILE).read_text()
    assert values(text, "gpufleet_health_checks_total") == [2]
    assert values(text, "gpufleet_gpu_xid_errors_total", xid=79) == [1]
    assert promtool(text).returncode == 0


def test_repair_text():
    plan = {"decisions": [
        {"node": "gpu1", "action": "reboot", "needs_approval": True, "approved": False, "rule": "ladder"},
        {"node": "gpu2", "action": "hold", "rule": "escalated"},
        {"node": "gpu3", "action": "escalate", "rule": "ladder"},
        {"node": 'gpu"4\n', "action": "reset_gpu", "needs_approval": True, "approved": True, "runnable": True},
        "garbage"]}
    results = [{"node": 'gpu"4\n', "action": "reset_gpu", "failed": True}, {"node": "gpu5", "action": "resume"}, 7]
    text = repair_metrics.repair_text(plan, {"tripped": True}, results, now=1_800_000_000.0)
    p = promtool(text)
    assert p.returncode == 0, p.stdout + p.stderr
    assert values(text, "gpufleet_repair_breaker_open") == [1]
    assert values(text, "gpufleet_repair_pending_approval", node="gpu1", action="reboot") == [1]
    assert len(values(text, "gpufleet_repair_pending_approval")) == 1  # an approved step does not wait
    assert {lab["node"] for n, lab, _v in parse(text) if n == "gpufleet_repair_escalated"} == {"gpu2", "gpu3"}
    assert values(text, "gpufleet_repair_step_failed", node='gpu"4\n', action="reset_gpu") == [1]
    assert values(text, "gpufleet_repair_steps", action="resume", outcome="ok") == [1]
    assert values(text, "gpufleet_repair_decisions", action="hold") == [1]
    assert values(text, "gpufleet_repair_last_run_timestamp_seconds") == [1.8e9]
    quiet = repair_metrics.repair_text({"decisions": []}, {"tripped": False}, [], now=1.0)
    assert promtool(quiet).returncode == 0 and values(quiet, "gpufleet_repair_breaker_open") == [0]
    assert "gpufleet_repair_step_failed{" not in quiet
    assert promtool(repair_metrics.repair_text("broken", None, None)).returncode == 0


@pytest.mark.parametrize("field,value", [
    ("<replay_counter>150</replay_counter>", "<replay_counter>0x" + "f" * 360 + "</replay_counter>"),
    ("<replay_counter>150</replay_counter>", "<replay_counter>" + "9" * 362 + "</replay_counter>"),
    ("<clocks_event_reasons_counters_sw_power_cap>7015662857 us</clocks_event_reasons_counters_sw_power_cap>",
     "<clocks_event_reasons_counters_sw_power_cap>0x" + "f" * 360 + " us</clocks_event_reasons_counters_sw_power_cap>"),
    ("<clocks_event_reasons_counters_sw_power_cap>7015662857 us</clocks_event_reasons_counters_sw_power_cap>",
     "<clocks_event_reasons_counters_sw_power_cap>" + "9" * 362 + " us</clocks_event_reasons_counters_sw_power_cap>"),
])
def test_a_huge_number_from_nvidia_smi_never_breaks_the_report_or_the_textfile(field, value):
    """A 362-digit counter in nvidia-smi's XML: the field reads as unknown, the report is made and the textfile still
    passes promtool (else node_exporter drops every gpufleet metric of the node). The real capture is the control."""
    xml = load("h100-8gpu-580.105.08-healthy.nvidia-smi-q-x.xml")
    assert field in xml
    for text in (xml, xml.replace(field, value)):
        snap = read_nvidia_smi_xml(text)
        out = render(snap)
        p = promtool(out)
        assert p.returncode == 0, p.stdout + p.stderr
        assert judge(snap, "", now=1_800_000_000.0).verdict == "healthy"
    assert "9" * 30 not in out and "f" * 30 not in out
    control = render(read_nvidia_smi_xml(xml))
    assert 150 in values(control, "gpufleet_gpu_pcie_replays_total")  # the real value is kept
