"""nvidia-smi XML and text readers: fields, N/A and deprecated values, lost GPUs, failure text."""
from __future__ import annotations

from health_fixtures import load

from ansible_collections.gpufleet.reliability.plugins.module_utils.health import (
    Snapshot,
    read_nvidia_smi_text,
    read_nvidia_smi_xml,
)


def test_h100_xml_fields():
    s = read_nvidia_smi_xml(load("h100-8gpu-580.105.08-healthy.nvidia-smi-q-x.xml"))
    assert s.probe_status == "ok" and s.driver_version == "580.105.08" and s.cuda_version == "13.0"
    assert s.attached_gpus == 8 and len(s.gpus) == 8
    g = s.gpus[0]
    assert g.name == "NVIDIA H100 80GB HBM3" and g.pci == "0000:53:00" and g.index == 0
    assert (g.pcie_gen_current, g.pcie_gen_max, g.pcie_width_current, g.pcie_width_max) == (5, 5, 16, 16)
    assert g.pcie_replay_counter == 150
    assert g.ecc_enabled is True and g.ecc_volatile_dbe == 0 and g.ecc_aggregate_sbe == 0
    assert g.remapped_rows_pending is False and g.remapped_rows_failure is False
    assert g.retired_pages_sbe is None and g.retired_pages_pending is None  # N/A on Hopper
    assert g.temperature == 29 and g.temp_tlimit == 58 and g.temp_slowdown is None
    assert g.clocks_event_reasons == ["gpu_idle"]
    assert g.clocks_event_counters_us["sw_power_cap"] == 7015662857
    assert g.power_limit == 700 and g.power_draw == 68.92
    assert g.fabric_state == "Completed" and g.fabric_status == "Success"
    assert g.recovery_action == 0 and g.persistence_mode is True
    assert g.lost is False


def test_a100_deprecated_and_na_are_none():
    s = read_nvidia_smi_xml(load("a100-sxm4-40gb-570.148.08-healthy.nvidia-smi-q-x.xml"))
    g = s.gpus[0]
    assert g.reset_required is None and g.drain_and_reset_recommended is None  # "deprecated"
    assert g.fabric_state is None and g.temp_tlimit is None
    assert (g.temp_slowdown, g.temp_shutdown) == (89, 92)
    assert g.power_draw == 49.68  # instant; average is N/A


def test_gb200_lost_gpu():
    s = read_nvidia_smi_xml(load("gb200-2gpu-580.65.06-gpu1-lost.MOCK.nvidia-smi-q-x.xml"))
    assert s.probe_status == "partial"
    assert [g.lost for g in s.gpus] == [False, True]
    assert s.gpus[1].remapped_rows_pending is None and s.gpus[1].temperature is None
    assert s.gpus[1].probe_errors


def test_text_reader_power_brake_all_gpus():
    s = read_nvidia_smi_text(load("h100-8gpu-535.161.08-all-gpus-hw-power-brake-slowdown.nvidia-smi-q.txt"))
    assert s.driver_version == "535.161.08" and len(s.gpus) == 8 and s.attached_gpus == 8
    for g in s.gpus:
        assert {"hw_slowdown", "hw_power_brake_slowdown"} <= set(g.clocks_event_reasons)
        assert g.reset_required is False and g.fabric_state == "Completed"
        assert 40 <= g.pcie_replay_counter <= 90
    g = s.gpus[0]
    assert g.pci == "0000:19:00" and g.temp_tlimit == 56 and g.power_limit == 700 and g.power_draw == 67.74
    assert g.remapped_rows_pending is False and g.ecc_volatile_dbe == 0 and g.sram_threshold_exceeded is False


def test_text_reader_keeps_inconsistent_bits():
    s = read_nvidia_smi_text(load("h100-8gpu-535.183.01-gpu2-sw-power-cap-power-brake.nvidia-smi-q.txt"))
    g = s.gpus[2]
    assert g.pci == "0000:75:00"
    assert set(g.clocks_event_reasons) == {"sw_power_cap", "hw_power_brake_slowdown", "sw_thermal_slowdown"}
    assert "hw_slowdown" not in g.clocks_event_reasons  # parent reads Not Active; not "fixed"
    assert all(not (set(x.clocks_event_reasons) - {"gpu_idle"}) for i, x in enumerate(s.gpus) if i != 2)


def test_failure_text():
    s = read_nvidia_smi_text("Failed to initialize NVML: Driver/library version mismatch\n")
    assert s.probe_status == "failed" and s.probe_error_code == 18
    s = read_nvidia_smi_text("Unable to determine the device handle for GPU0000:07:00.0: Unknown Error\n")
    assert s.gpus[0].lost and s.gpus[0].pci == "0000:07:00"
    s = read_nvidia_smi_text("No devices were found\n")
    assert s.attached_gpus == 0


def test_garbage_gives_failed_snapshot():
    for text in ("", "hello", "<nvidia_smi_log><gpu>", "<other/>", b"\x00\xff", None, 42):
        s = read_nvidia_smi_xml(text)
        assert isinstance(s, Snapshot) and s.probe_status == "failed" and s.probe_error
    assert read_nvidia_smi_text("hello\n").probe_status == "failed"


def test_snapshot_round_trip():
    s = read_nvidia_smi_xml(load("h100-8gpu-580.105.08-healthy.nvidia-smi-q-x.xml"))
    d = s.to_dict()
    s2 = Snapshot.from_dict(d)
    assert s2.to_dict() == d
