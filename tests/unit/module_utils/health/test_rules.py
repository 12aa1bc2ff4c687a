"""Rules: rates over windows with state, skips for N/A, PCIe at idle, probe failures, sticky events, config."""
from __future__ import annotations

import json
import os
import time

import pytest
from health_fixtures import h100, node

from ansible_collections.gpufleet.reliability.plugins.module_utils.health import (
    ACTION_ORDER,
    Finding,
    GpuSnapshot,
    NvLinkInfo,
    Report,
    Snapshot,
    judge,
)
from ansible_collections.gpufleet.reliability.plugins.module_utils.statefile import load_state, save_state


def codes(r):
    return [f.code for f in r.findings if f.severity != "info"]


def test_healthy_synthetic_node():
    r = judge(node(), config={"expected_gpus": 8}, now=100)
    assert r.verdict == "healthy" and r.action == "none" and r.code == "ok" and r.exit_code == 0


def test_report_dict_shape_and_order():
    assert ACTION_ORDER == ("none", "monitor", "reset_gpu", "reboot", "reimage", "replace")
    r = Report(findings=[Finding("a", "warning", "w", "monitor", "w1", 1),
                         Finding("b", "critical", "c", "reset_gpu", "c1", 2),
                         Finding("c", "info", "i", "none", "i1")])
    d = r.to_dict()
    assert set(d) == {"verdict", "action", "code", "gpu", "drain", "findings", "summary"}
    assert (d["verdict"], d["action"], d["code"], d["gpu"], d["drain"]) == ("unhealthy", "reset_gpu", "c1", 2, False)
    assert r.drain_reason() == "gpufleet: c1 gpu2"
    # a finding that asks for a drain (no automatic repair) sets report.drain and names the drain reason while the
    # verdict alone would not drain; an unhealthy verdict keeps naming its worst finding
    asks = Finding("clocks", "warning", "node brake", "monitor", "node_power_brake", drain=True)
    r = Report(findings=[Finding("a", "warning", "w", "monitor", "w1", 1), asks])
    assert (r.verdict, r.action, r.drain, r.to_dict()["drain"]) == ("degraded", "monitor", True, True)
    assert r.to_dict()["findings"][1]["drain"] is True
    assert r.drain_reason() == "gpufleet: node_power_brake"
    r = Report(findings=[asks, Finding("b", "critical", "c", "reset_gpu", "c1", 2)])
    assert r.drain and r.drain_reason() == "gpufleet: c1 gpu2"
    assert Report([Finding("p", "unknown", "x"), Finding("w", "warning", "y", "reboot")]).verdict == "unknown"
    with pytest.raises(ValueError, match="finding.action"):
        Finding("x", "info", "d", "explode")


def test_pcie_replay_rate_over_window():
    r1 = judge(node(h100(0, pcie_replay_counter=100)), now=0)
    assert r1.verdict == "healthy"
    # +20 in 60 s at Gen5 x16: 20/min < 31/min
    r2 = judge(node(h100(0, pcie_replay_counter=120)), state=r1.state, now=60)
    assert r2.verdict == "healthy"
    # +200 in 60 s: 200/min > 31/min
    r3 = judge(node(h100(0, pcie_replay_counter=320)), state=r2.state, now=120)
    assert codes(r3) == ["pcie_replay"] and r3.verdict == "degraded"
    # at Gen4 x8 the limit is 16 * 8/16 = 8/min
    r4 = judge(node(h100(0, pcie_replay_counter=330, pcie_gen_max=4, pcie_gen_current=4, pcie_width_current=8,
                         pcie_width_max=8)), state=r3.state, now=180)
    assert codes(r4) == ["pcie_replay"]
    # a counter reset (driver reload) is no rate
    r5 = judge(node(h100(0, pcie_replay_counter=0)), state=r4.state, now=240)
    assert r5.verdict == "healthy"


def test_absolute_replay_counter_never_fires_without_history():
    assert judge(node(h100(0, pcie_replay_counter=10 ** 9)), now=0).verdict == "healthy"


def test_pcie_gen_drop_at_idle_is_fine_under_load_is_not():
    idle = h100(0, pcie_gen_current=1, utilization_gpu=0)
    assert judge(node(idle), now=0).verdict == "healthy"
    unknown_load = h100(0, pcie_gen_current=1)
    assert judge(node(unknown_load), now=0).verdict == "healthy"
    busy = h100(0, pcie_gen_current=3, utilization_gpu=95)
    assert codes(judge(node(busy), now=0)) == ["pcie_gen"]
    narrow = h100(0, pcie_width_current=8)
    r = judge(node(narrow), now=0)
    assert codes(r) == ["pcie_width"] and r.action == "reboot"


def test_not_supported_fields_are_skipped():
    bare = GpuSnapshot(index=0, name="NVIDIA H100 80GB HBM3")
    r = judge(Snapshot(gpus=[bare]), config={"expected_gpus": 1}, now=0)
    assert r.verdict == "healthy" and not r.findings


def test_probe_timeout_is_unknown_never_healthy():
    r = judge(Snapshot(probe_status="timeout", probe_error="NVML probe exceeded 10 s"), now=0)
    assert (r.verdict, r.code, r.exit_code) == ("unknown", "probe_timeout", 3)
    r = judge(Snapshot(probe_status="failed", probe_error="NVMLError_Uninitialized"), now=0)
    assert r.verdict == "unknown"
    assert judge(None, None, now=0).code == "no_data"
    assert judge(None, (), now=0).verdict == "healthy"  # kernel log read, nothing in it (the simulator's case)
    # the kernel log still speaks while NVML hangs
    r = judge(Snapshot(probe_status="timeout"), ["NVRM: Xid (PCI:0000:9b:00): 119, pid=1, name=x, Timeout"], now=0)
    assert r.verdict == "unhealthy" and r.code == "xid119"
    # strikes escalate a repeated timeout when the site asks for it
    cfg = {"thresholds": {"probe_timeout_strikes": 2}}
    r1 = judge(Snapshot(probe_status="timeout"), config=cfg, now=0)
    r2 = judge(Snapshot(probe_status="timeout"), config=cfg, state=r1.state, now=60)
    assert r1.verdict == "unknown" and r2.verdict == "unhealthy"


def test_gpu_missing_and_lost():
    gpus = [h100(i) for i in range(7)]
    r = judge(node(*gpus), config={"expected_gpus": 8}, now=0)
    assert (r.verdict, r.action, r.code) == ("unhealthy", "reboot", "gpu_missing")
    gpus.append(h100(7, lost=True, probe_errors={"nvmlDeviceGetMemoryInfo": "NVMLError_GpuIsLost: GPU is lost"}))
    r = judge(node(*gpus), config={"expected_gpus": 8}, now=0)
    assert (r.code, r.gpu, r.action) == ("gpu_lost", 7, "reboot")
    assert "GpuIsLost" in r.findings[0].evidence[0]


@pytest.mark.parametrize("value,verdict,action", [(1, "unhealthy", "reset_gpu"), (2, "unhealthy", "reboot"),
                                                  (3, "degraded", "monitor"), (4, "unhealthy", "reset_gpu"),
                                                  (0, "healthy", "none")])
def test_recovery_action_field(value, verdict, action):
    r = judge(node(h100(0, recovery_action=value)), now=0)
    assert (r.verdict, r.action) == (verdict, action)


def test_memory_rules():
    assert judge(node(h100(0, remapped_rows_pending=True)), now=0).code == "row_remap_pending"
    r = judge(node(h100(0, remapped_rows_failure=True)), now=0)
    assert (r.code, r.action) == ("row_remap_failure", "replace")
    assert judge(node(h100(0, ecc_volatile_dbe=2)), now=0).code == "ecc_dbe"
    assert judge(node(h100(0, sram_threshold_exceeded=True)), now=0).action == "replace"
    # aggregate DBE alone (row remapping handled it) is not a failure
    assert judge(node(h100(0, ecc_aggregate_dbe=8)), now=0).verdict == "healthy"
    r1 = judge(node(h100(0, ecc_volatile_sbe=0)), now=0)
    r2 = judge(node(h100(0, ecc_volatile_sbe=5000)), state=r1.state, now=3600)
    assert codes(r2) == ["ecc_sbe_rate"]


def test_throttle_warns_then_escalates_when_it_persists():
    g = dict(clocks_event_reasons=["hw_power_brake_slowdown", "sw_power_cap"])
    state = None
    verdicts = []
    for k in range(4):
        r = judge(node(h100(0), h100(1, **g)), state=state, now=300 * k)
        state = r.state
        verdicts.append((r.verdict, r.code, r.gpu))
    assert verdicts[0] == ("degraded", "hw_power_brake", 1)
    assert verdicts[-1] == ("unhealthy", "hw_power_brake", 1)
    # it clears when the bit clears
    r = judge(node(h100(0), h100(1)), state=state, now=1500)
    assert r.verdict == "healthy"


def test_throttle_from_counters():
    r1 = judge(node(h100(0, clocks_event_counters_us={"hw_thermal_slowdown": 0})), now=0)
    r2 = judge(node(h100(0, clocks_event_counters_us={"hw_thermal_slowdown": 30_000_000})), state=r1.state, now=60)
    assert codes(r2) == ["hw_thermal"]  # 30 s of 60 s in HW thermal slowdown
    r3 = judge(node(h100(0, clocks_event_counters_us={"hw_thermal_slowdown": 30_000_100})), state=r2.state, now=120)
    assert r3.verdict == "healthy"


def test_nvlink_and_fabric():
    links = [NvLinkInfo(i, active=(i != 3)) for i in range(18)]
    r = judge(node(h100(0, nvlinks=links)), now=0)
    assert (r.code, r.action) == ("nvlink_down", "reset_gpu")
    r = judge(node(h100(0, fabric_state="Not Started", fabric_status="N/A")), now=0)
    assert r.code == "fabric"
    assert judge(node(h100(0, fabric_state=None, fabric_status=None)), now=0).verdict == "healthy"


def test_sticky_window_keeps_severe_events_in_view():
    line = "NVRM: Xid (PCI:0000:10:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    r1 = judge(node(), [line], now=1000)
    assert (r1.code, r1.gpu) == ("xid79", 0)  # mapped to the GPU index through its PCI address
    # next run: the kmsg cursor moved on, no new lines; the event stays in view for the sticky window (3 h)
    r2 = judge(node(), [], state=r1.state, now=1000 + 3600)
    assert r2.code == "xid79"
    r3 = judge(node(), [], state=r2.state, now=1000 + 3 * 3600 + 1)
    assert r3.verdict == "healthy"
    # the same line fed again is not a new event (no double counting, no window restart)
    r4 = judge(node(), [line] * 3, state=r2.state, now=1000 + 3 * 3600 + 1)
    assert r4.verdict == "healthy"


def test_a_verified_repair_forgets_the_events_it_fixed():
    """Issue 27 case 3: a verification of a repair that started at T (repaired_at) forgets kernel events up to T,
    in this run and every later one; an event after T still counts; nothing else is forgotten."""
    line = "NVRM: Xid (PCI:0000:10:00): 48, pid=1, name=x, An uncorrectable double bit error"
    r1 = judge(node(), [line], now=1000)
    assert r1.code == "xid48" and r1.state["events"]
    # the agent alone remembers the severe Xid for its sticky window: a re-drain after the repair resumed the node
    assert judge(node(), [], state=r1.state, now=1100).code == "xid48"
    # the repair's verification: the reset started at 1050, after the event was first seen
    r2 = judge(node(), [], state=r1.state, now=1100, repaired_at=1050)
    assert r2.verdict == "healthy" and r2.state["events"] == [] and r2.state["repaired_at"] == 1050
    # the agent's next run (no repaired_at of its own) keeps the repair's mark and stays healthy
    r3 = judge(node(), [], state=r2.state, now=1160)
    assert r3.verdict == "healthy" and r3.state["repaired_at"] == 1050
    # an Xid after the repair started is not forgiven: the repair did not fix it
    r4 = judge(node(), [line.replace("48,", "48, ") + " again"], state=r3.state, now=1200)
    assert r4.code == "xid48"
    # a repair time before the event forgets nothing; the newest mark wins; a future mark is capped at now
    assert judge(node(), [], state=r1.state, now=1100, repaired_at=999).code == "xid48"
    assert judge(node(), [], state=dict(r1.state, repaired_at=1050), now=1100, repaired_at=10).verdict == "healthy"
    assert judge(node(), [], state=r1.state, now=1100, repaired_at=9e9).state["repaired_at"] == 1100


@pytest.mark.parametrize("bad", [-1, True, "1050", float("nan"), float("inf")])
def test_repaired_at_must_be_epoch_seconds(bad):
    with pytest.raises(ValueError, match=r"repaired_at: expected epoch seconds \(a finite number >= 0\), got"):
        judge(node(), [], now=1000, repaired_at=bad)


@pytest.mark.parametrize("stored", [float("inf"), float("nan"), -5, "1e99", True, [1]])
def test_a_state_file_mark_that_is_not_a_time_forgets_nothing(stored):
    line = "NVRM: Xid (PCI:0000:10:00): 48, pid=1, name=x, An uncorrectable double bit error"
    r1 = judge(node(), [line], now=1000)
    r2 = judge(node(), [], state=dict(r1.state, repaired_at=stored), now=1100)
    assert r2.code == "xid48" and "repaired_at" not in r2.state


def test_dated_events_age_out_and_latest_mode():
    line = "2024-11-15T12:02:03,470068+00:00 NVRM: Xid (PCI:0000:19:00): 48, pid=1, name=x, DBE"
    assert judge(None, [line], now=2_000_000_000).verdict == "healthy"  # years old
    assert judge(None, [line], config={"events_as_of": "latest"}, now=2_000_000_000).verdict == "unhealthy"


def test_state_file_is_written_atomically_by_the_adapter(tmp_path):
    path = tmp_path / "sub" / "state.json"
    r = judge(node(), state=load_state(path), now=10)
    save_state(path, r.state)
    data = json.loads(path.read_text())
    assert data["version"] == 1 and "gpus" in data
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    assert not [p for p in path.parent.iterdir() if p.name != "state.json"]
    path.write_text("{corrupt")
    assert load_state(path) == {}  # a corrupt file is "no previous run"
    assert judge(node(), state=load_state(path), now=20).verdict == r.verdict


def test_the_brain_reads_no_file_and_no_clock(tmp_path):
    """judge() is given the previous state and the time; a path or a missing time is refused, naming the field."""
    with pytest.raises(ValueError, match=r"^state: expected a mapping \(the previous report.state\) or None"):
        judge(node(), state=str(tmp_path / "state.json"), now=10)
    assert not (tmp_path / "state.json").exists()
    for bad in (None, float("nan"), "10", True):
        with pytest.raises(ValueError, match=r"^now: expected epoch seconds"):
            judge(node(), now=bad)
    with pytest.raises(ValueError, match=r"^config: unknown key\(s\) state_path"):
        judge(node(), config={"state_path": str(tmp_path / "c.json")}, now=30)


def test_overrides_and_skips():
    line = "NVRM: Xid (PCI:0000:10:00): 94, pid=1, name=x, Contained: SM (0x1). RST: No, D-RST: No"
    assert judge(None, [line], now=0).verdict == "degraded"
    r = judge(None, [line], config={"xid_overrides": {"94": {"severity": "info", "action": "none"}}}, now=0)
    assert r.verdict == "healthy"
    r = judge(node(h100(0, remapped_rows_pending=True)), config={"skip_checks": ["row_remap"]}, now=0)
    assert r.verdict == "healthy"


@pytest.mark.parametrize("cfg,match", [
    ({"nope": 1}, "config: unknown key"),
    ({"thresholds": {"burst_window_s": "x"}}, r"thresholds\.burst_window_s"),
    ({"thresholds": {"bogus": 1}}, r"thresholds\.bogus"),
    ({"skip_checks": ["ecc", "zap"]}, "skip_checks: unknown check"),
    ({"expected_gpus": "eight"}, "expected_gpus"),
    ({"xid_overrides": {"94": {"action": "explode"}}}, r"xid_overrides\.94\.action"),
    ({"xid_overrides": {"x": {}}}, "xid_overrides: keys must be integer"),
    ({"profile": "Z100"}, "profile: unknown GPU profile"),
    ({"events_as_of": "yesterday"}, "events_as_of"),
])
def test_bad_config_names_the_field(cfg, match):
    with pytest.raises(ValueError, match=match):
        judge(node(), config=cfg, now=0)


def test_deterministic_given_now():
    from health_fixtures import load
    text = load("dmesg-ctime-xid119-gsp-rpc-timeout-dell-xe9680.log")
    a = judge(node(), text, now=1_740_328_000).to_dict()
    b = judge(node(), text, now=1_740_328_000).to_dict()
    assert a == b


def test_snapshot_as_dict_and_kernel_events_objects():
    from ansible_collections.gpufleet.reliability.plugins.module_utils.health import KernelEvent
    ev = KernelEvent(kind="xid", raw="synthetic", xid=79, pci="0000:10:00", wallclock=100.0)
    r = judge(node().to_dict(), [ev], now=200)
    assert r.code == "xid79" and r.gpu == 0
    with pytest.raises(ValueError, match="snapshot: unknown field"):
        judge({"gpus": [], "bogus": 1}, now=time.time())
